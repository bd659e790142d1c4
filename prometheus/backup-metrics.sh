#!/usr/bin/env bash
# Backup metrics for Prometheus, from pgBackRest's own report and the
# server's archiver statistics, in the text format node_exporter's textfile
# collector reads (docs/backup.md, "Metrics and alerts").
#
# Usage (as the user that runs pgBackRest, every minute from cron or a
# systemd timer, on each database node):
#
#   prometheus/backup-metrics.sh --stanza main --output /var/lib/prometheus/node-exporter/token_billing_backup.prom
#
# Options: --stanza NAME (default main), --output FILE (default: stdout),
# --config FILE (pgBackRest's configuration, default its own default), and
# for psql the usual PGHOST / PGPORT / PGUSER environment.
#
# Writes:
#   token_billing_backup_last_success_timestamp_seconds{stanza,type}
#       end of the newest backup of each type (full, diff, incr) that
#       pgBackRest lists without error;
#   token_billing_backup_repository_ok{stanza}
#       1 when `pgbackrest info` reports the stanza ok (status code 0);
#   token_billing_backup_wal_last_archived_timestamp_seconds{stanza}
#       when the server last archived a WAL segment (pg_stat_archiver) —
#       written by the primary only: a standby archives nothing;
#   token_billing_backup_wal_last_failed_timestamp_seconds{stanza}
#       when archiving last failed (0: never, since the statistics reset);
#   token_billing_backup_metrics_timestamp_seconds{stanza}
#       when this script last ran to the end.
# The file is replaced atomically (written beside it, then renamed), so the
# collector never reads half of it.
set -euo pipefail

stanza=main
output=""
config=()
while (($#)); do
    case "$1" in
        --stanza) stanza="$2"; shift 2 ;;
        --output) output="$2"; shift 2 ;;
        --config) config=("--config=$2"); shift 2 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "backup-metrics: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

info="$(pgbackrest "${config[@]}" --stanza="$stanza" info --output=json)"
archiver="$(psql -X -At -F ' ' -d postgres -c "SELECT pg_is_in_recovery(),
    coalesce(extract(epoch FROM last_archived_time)::bigint, 0),
    coalesce(extract(epoch FROM last_failed_time)::bigint, 0)
    FROM pg_stat_archiver")"
read -r in_recovery last_archived last_failed <<<"$archiver"

metrics="$(jq -r --arg stanza "$stanza" --arg now "$(date +%s)" \
    --arg in_recovery "$in_recovery" --arg archived "$last_archived" --arg failed "$last_failed" '
    def stanza_label: "{stanza=\"\($stanza)\"}";
    (.[] | select(.name == $stanza)) as $s
    | [
        "# HELP token_billing_backup_last_success_timestamp_seconds End of the newest backup of each type that pgBackRest lists without error.",
        "# TYPE token_billing_backup_last_success_timestamp_seconds gauge",
        ($s.backup // [] | map(select(.error != true)) | group_by(.type)[]
          | "token_billing_backup_last_success_timestamp_seconds{stanza=\"\($stanza)\",type=\"\(.[0].type)\"} \(map(.timestamp.stop) | max)"),
        "# HELP token_billing_backup_repository_ok 1 when pgbackrest info reports the stanza ok.",
        "# TYPE token_billing_backup_repository_ok gauge",
        "token_billing_backup_repository_ok\(stanza_label) \(if $s.status.code == 0 then 1 else 0 end)",
        (if $in_recovery == "f" then
          "# HELP token_billing_backup_wal_last_archived_timestamp_seconds When the primary last archived a WAL segment (pg_stat_archiver).",
          "# TYPE token_billing_backup_wal_last_archived_timestamp_seconds gauge",
          "token_billing_backup_wal_last_archived_timestamp_seconds\(stanza_label) \($archived)",
          "# HELP token_billing_backup_wal_last_failed_timestamp_seconds When archiving last failed (0: never).",
          "# TYPE token_billing_backup_wal_last_failed_timestamp_seconds gauge",
          "token_billing_backup_wal_last_failed_timestamp_seconds\(stanza_label) \($failed)"
        else empty end),
        "# HELP token_billing_backup_metrics_timestamp_seconds When the backup metrics were last written.",
        "# TYPE token_billing_backup_metrics_timestamp_seconds gauge",
        "token_billing_backup_metrics_timestamp_seconds\(stanza_label) \($now)"
      ]
    | .[]' <<<"$info")"
[[ -n "$metrics" ]] || { echo "backup-metrics: pgbackrest info lists no stanza $stanza" >&2; exit 1; }

if [[ -z "$output" ]]; then
    printf '%s\n' "$metrics"
else
    printf '%s\n' "$metrics" >"$output.tmp.$$"
    mv -f "$output.tmp.$$" "$output"
fi
