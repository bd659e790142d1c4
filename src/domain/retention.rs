//! Retention: rows of the tables that would otherwise grow forever are
//! deleted once older than their configured age (`RETENTION_*`), in
//! bounded batches, one replica at a time (a session advisory lock).
//!
//! Pruned: `idempotency_keys`, `events` (only those no webhook endpoint
//! waits for — relayed already, or wanted by no endpoint — and with no
//! delivery left), finished `webhook_deliveries` with
//! their `webhook_attempts`, and `audit_events`. Never pruned: the ledger,
//! reservations, jobs, credits, adjustments, the daily closings.
//!
//! Batches are paced: after a batch that deleted rows, the pass sleeps
//! `RETENTION_PAUSE` before the next one, outside any transaction and with
//! no row lock held (only the session's advisory lock, which keeps other
//! replicas from starting a pass), so the kiosks' statements get the disk
//! and the WAL between two deletes.
//!
//! What was pruned is recorded where a reader's cursor needs it, in the
//! transaction of the delete: `retention_watermarks` for the event feed,
//! `webhook_attempt_watermarks` (per endpoint) for the delivery log.
//!
//! With `ARCHIVE_DIR`, each batch's rows are first written to a new gzip
//! JSON Lines file under `ARCHIVE_DIR/<table>/` (one JSON object per row,
//! as `row_to_json` gives it), fsynced with its directory, and only then
//! deleted, in the transaction that locked them. A crash between the two
//! leaves the rows in the table and in the archive: the next pass archives
//! them again (a duplicate, never a loss). Readers of the archive dedupe
//! on the table's key.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz};
use serde::Serialize;

use crate::config::{Config, RETENTION_BATCHES_PER_PASS_MAX, RETENTION_BATCH_MAX};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Serialises retention passes across replicas.
const RETENTION_LOCK: i64 = crate::db::lock_keys::RETENTION;

/// The tables retention prunes (metric labels).
pub use crate::config::RETENTION_TABLES as TABLES;

/// How long each table keeps its rows (`None`: forever), and where to archive.
#[derive(Clone, Debug)]
pub struct RetentionSettings {
    pub idempotency_keys: Option<Duration>,
    pub events: Option<Duration>,
    pub webhook_attempts: Option<Duration>,
    pub audit_events: Option<Duration>,
    pub archive_dir: Option<PathBuf>,
    /// Rows per batch (one transaction).
    pub batch: i64,
    /// Batches per table and pass.
    pub batches_max: usize,
    /// The sleep after a batch that deleted rows, before the next batch
    /// (zero: none). Outside any transaction: no row lock is held.
    pub pause: Duration,
}

fn keep(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}

impl RetentionSettings {
    pub fn from_config(config: &Config) -> RetentionSettings {
        RetentionSettings {
            idempotency_keys: keep(config.retention_idempotency_keys),
            events: keep(config.retention_events),
            webhook_attempts: keep(config.retention_webhook_attempts),
            audit_events: keep(config.retention_audit_events),
            archive_dir: config.archive_dir.clone(),
            batch: RETENTION_BATCH_MAX,
            batches_max: RETENTION_BATCHES_PER_PASS_MAX,
            pause: config.retention_pause,
        }
    }
}

/// What one pass did, per table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PassReport {
    pub pruned: BTreeMap<&'static str, i64>,
    pub archived: BTreeMap<&'static str, i64>,
    /// Age in seconds of the oldest row left (0 when the table is empty).
    pub oldest_age_seconds: BTreeMap<&'static str, f64>,
}

/// One table's rule: which rows are expired, and what deleting one needs.
struct Rule {
    table: &'static str,
    /// The timestamp column the age is read from.
    age_column: &'static str,
    /// More conditions on `t` (the row), beyond its age.
    also: &'static str,
}

const RULES: [Rule; 4] = [
    Rule {
        table: "idempotency_keys",
        age_column: "created_at",
        also: "",
    },
    // Deliveries first: an event is kept while a delivery refers to it.
    Rule {
        table: "webhook_deliveries",
        age_column: "created_at",
        also: "AND t.status <> 'pending'",
    },
    // Only events no endpoint waits for, with no delivery left. An endpoint
    // waits for an event the relay has not passed yet when the relay would
    // fan it out to it (not deleted, subscribed to its type and account,
    // made before it; a disabled one counts: it may be enabled before the
    // relay gets there). Without such an endpoint an event is pruned at
    // its age even where no replica relays (`WEBHOOK_CONCURRENCY=0` on
    // every replica).
    Rule {
        table: "events",
        age_column: "created_at",
        also: "AND ((t.txid, t.seq) <= (SELECT after_txid, after_seq FROM webhook_relay) \
                    OR NOT EXISTS (SELECT 1 FROM webhook_endpoints w \
                                   WHERE w.deleted_at IS NULL AND t.type = ANY (w.event_types) \
                                     AND (w.account_id IS NULL OR w.account_id = t.account_id) \
                                     AND w.created_at <= t.created_at)) \
               AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = t.id)",
    },
    Rule {
        table: "audit_events",
        age_column: "created_at",
        also: "",
    },
];

fn retention_of(settings: &RetentionSettings, table: &str) -> Option<Duration> {
    match table {
        "idempotency_keys" => settings.idempotency_keys,
        "webhook_deliveries" | "webhook_attempts" => settings.webhook_attempts,
        "events" => settings.events,
        "audit_events" => settings.audit_events,
        _ => None,
    }
}

/// One pass, if no other replica is running one: `None` when skipped.
/// Sleeps `settings.pause` between batches (the calling thread blocks).
pub fn run_pass_exclusive(
    conn: &mut PgConnection,
    settings: &RetentionSettings,
    metrics: Option<&Metrics>,
) -> Result<Option<PassReport>, ApiError> {
    run_pass_exclusive_paced(conn, settings, metrics, &mut std::thread::sleep)
}

/// [`run_pass_exclusive`] with the pause between batches made by `pause`
/// (called with `settings.pause`, never with zero). It is called after a
/// batch that deleted rows, before the pass's next batch, between
/// transactions: `conn` holds no transaction and no row lock meanwhile,
/// only the session's advisory lock.
pub fn run_pass_exclusive_paced(
    conn: &mut PgConnection,
    settings: &RetentionSettings,
    metrics: Option<&Metrics>,
    pause: &mut dyn FnMut(Duration),
) -> Result<Option<PassReport>, ApiError> {
    crate::db::with_advisory_lock(conn, RETENTION_LOCK, |conn| {
        run_pass(conn, settings, metrics, pause)
    })
}

fn run_pass(
    conn: &mut PgConnection,
    settings: &RetentionSettings,
    metrics: Option<&Metrics>,
    pause: &mut dyn FnMut(Duration),
) -> Result<PassReport, ApiError> {
    let mut report = PassReport::default();
    // The previous batch (of any table) deleted rows: pause before the next.
    let mut deleted_last = false;
    for rule in &RULES {
        let Some(age) = retention_of(settings, rule.table) else {
            continue;
        };
        let age = chrono::Duration::from_std(age)
            .map_err(|error| ApiError::Internal(format!("retention of {}: {error}", rule.table)))?;
        let cutoff = Utc::now() - age;
        for _ in 0..settings.batches_max {
            if deleted_last && !settings.pause.is_zero() {
                // Between two transactions (prune_batch commits its own).
                pause(settings.pause);
            }
            let batch = prune_batch(conn, rule, cutoff, settings)?;
            deleted_last = batch.iter().any(|(_, pruned, _)| *pruned > 0);
            for (table, pruned, archived) in &batch {
                *report.pruned.entry(table).or_default() += pruned;
                *report.archived.entry(table).or_default() += archived;
                if let Some(metrics) = metrics {
                    metrics
                        .retention_pruned_rows_total
                        .with_label_values(&[table])
                        .inc_by(u64::try_from(*pruned).unwrap_or(0));
                    metrics
                        .retention_archived_rows_total
                        .with_label_values(&[table])
                        .inc_by(u64::try_from(*archived).unwrap_or(0));
                }
            }
            let main = batch.first().map_or(0, |(_, pruned, _)| *pruned);
            if main < settings.batch {
                break;
            }
        }
    }
    for (table, column) in [
        ("idempotency_keys", "created_at"),
        ("events", "created_at"),
        ("webhook_deliveries", "created_at"),
        ("webhook_attempts", "attempted_at"),
        ("audit_events", "created_at"),
    ] {
        #[derive(QueryableByName)]
        struct Age {
            #[diesel(sql_type = Nullable<Double>)]
            seconds: Option<f64>,
        }
        let age: Age = diesel::sql_query(format!(
            "SELECT extract(epoch FROM now() - min({column}))::float8 AS seconds FROM {table}"
        ))
        .get_result(conn)?;
        let seconds = age.seconds.unwrap_or(0.0).max(0.0);
        report.oldest_age_seconds.insert(table, seconds);
        if let Some(metrics) = metrics {
            metrics
                .retention_oldest_row_age_seconds
                .with_label_values(&[table])
                .set(seconds);
        }
    }
    Ok(report)
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = Text)]
    tid: String,
    #[diesel(sql_type = Text)]
    row: String,
}

/// One batch of `rule`'s table in one transaction: lock the oldest expired
/// rows, archive them (and, for deliveries, their attempts), delete them.
/// Returns (table, pruned, archived) per table touched, the rule's first.
fn prune_batch(
    conn: &mut PgConnection,
    rule: &Rule,
    cutoff: DateTime<Utc>,
    settings: &RetentionSettings,
) -> Result<Vec<(&'static str, i64, i64)>, ApiError> {
    conn.transaction(|conn| {
        conn.batch_execute("SET LOCAL token_billing.retention = 'on'")?;
        let rows: Vec<Locked> = diesel::sql_query(format!(
            "SELECT t.ctid::text AS tid, row_to_json(t)::text AS row FROM {table} t \
             WHERE t.{age} < $1 {also} ORDER BY t.{age} LIMIT $2 FOR UPDATE OF t SKIP LOCKED",
            table = rule.table,
            age = rule.age_column,
            also = rule.also,
        ))
        .bind::<Timestamptz, _>(cutoff)
        .bind::<BigInt, _>(settings.batch)
        .load(conn)?;
        if rows.is_empty() {
            return Ok(vec![(rule.table, 0, 0)]);
        }
        let mut done = Vec::new();
        let tids: Vec<String> = rows.iter().map(|row| row.tid.clone()).collect();
        if rule.table == "webhook_deliveries" {
            let attempts: Vec<Locked> = diesel::sql_query(
                "SELECT a.ctid::text AS tid, row_to_json(a)::text AS row FROM webhook_attempts a \
                 WHERE a.delivery_id IN (SELECT d.id FROM webhook_deliveries d \
                                         WHERE d.ctid = ANY($1::text[]::tid[])) \
                 FOR UPDATE OF a",
            )
            .bind::<Array<Text>, _>(&tids)
            .load(conn)?;
            let archived = archive(settings.archive_dir.as_deref(), "webhook_attempts", &attempts)?;
            let attempt_tids: Vec<String> = attempts.iter().map(|row| row.tid.clone()).collect();
            // Per endpoint, the newest attempt deleted: a delivery-log
            // cursor below it would skip attempts (webhooks::endpoints).
            diesel::sql_query(
                "INSERT INTO webhook_attempt_watermarks AS w \
                   (endpoint_id, last_attempt_id, last_attempted_at) \
                 SELECT endpoint_id, max(id), max(attempted_at) FROM webhook_attempts \
                 WHERE ctid = ANY($1::text[]::tid[]) GROUP BY endpoint_id \
                 ON CONFLICT (endpoint_id) DO UPDATE SET \
                   last_attempt_id = GREATEST(w.last_attempt_id, EXCLUDED.last_attempt_id), \
                   last_attempted_at = GREATEST(w.last_attempted_at, EXCLUDED.last_attempted_at), \
                   updated_at = now()",
            )
            .bind::<Array<Text>, _>(&attempt_tids)
            .execute(conn)?;
            let pruned =
                diesel::sql_query("DELETE FROM webhook_attempts WHERE ctid = ANY($1::text[]::tid[])")
                    .bind::<Array<Text>, _>(&attempt_tids)
                    .execute(conn)?;
            done.push(("webhook_attempts", count(pruned), archived));
        }
        let archived = archive(settings.archive_dir.as_deref(), rule.table, &rows)?;
        if rule.table == "events" {
            diesel::sql_query(
                "INSERT INTO retention_watermarks (table_name, pruned_before, last_txid, last_seq) \
                 SELECT 'events', max(created_at), (max(ARRAY[txid, seq]))[1], (max(ARRAY[txid, seq]))[2] \
                 FROM events WHERE ctid = ANY($1::text[]::tid[]) \
                 ON CONFLICT (table_name) DO UPDATE SET \
                   pruned_before = GREATEST(retention_watermarks.pruned_before, EXCLUDED.pruned_before), \
                   last_txid = (GREATEST(ARRAY[retention_watermarks.last_txid, retention_watermarks.last_seq], \
                                         ARRAY[EXCLUDED.last_txid, EXCLUDED.last_seq]))[1], \
                   last_seq = (GREATEST(ARRAY[retention_watermarks.last_txid, retention_watermarks.last_seq], \
                                        ARRAY[EXCLUDED.last_txid, EXCLUDED.last_seq]))[2], \
                   updated_at = now()",
            )
            .bind::<Array<Text>, _>(&tids)
            .execute(conn)?;
        }
        let pruned = diesel::sql_query(format!(
            "DELETE FROM {} WHERE ctid = ANY($1::text[]::tid[])",
            rule.table
        ))
        .bind::<Array<Text>, _>(&tids)
        .execute(conn)?;
        done.insert(0, (rule.table, count(pruned), archived));
        Ok(done)
    })
}

fn count(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

/// Creates `folder` (and any missing parent) readable by this user only
/// (0700, whatever the umask): archives hold audit rows, events and
/// idempotency rows. An existing `folder` is made 0700 too; existing
/// parents are the operator's and left as they are.
fn private_folder(folder: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)?;
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))
}

/// A new file readable and writable by this user only (0600, whatever the
/// umask: the mode is set again after the umask applied).
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Writes the rows to a new gzip JSON Lines file under `dir/<table>/`,
/// durably (the file and its directory fsynced) before returning. Without
/// an archive directory nothing is written (0 archived).
fn archive(dir: Option<&Path>, table: &str, rows: &[Locked]) -> Result<i64, ApiError> {
    let Some(dir) = dir else {
        return Ok(0);
    };
    if rows.is_empty() {
        return Ok(0);
    }
    let failed = |error: std::io::Error| ApiError::Internal(format!("archive of {table}: {error}"));
    let folder = dir.join(table);
    private_folder(&folder).map_err(failed)?;
    let name = format!(
        "{table}-{}-{}.jsonl.gz",
        Utc::now().format("%Y%m%dT%H%M%S%.6fZ"),
        uuid::Uuid::new_v4().simple()
    );
    let partial = folder.join(format!(".{name}.partial"));
    let file = private_file(&partial).map_err(failed)?;
    let mut gzip = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    for row in rows {
        gzip.write_all(row.row.as_bytes()).map_err(failed)?;
        gzip.write_all(b"\n").map_err(failed)?;
    }
    let file = gzip.finish().map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    // The complete file appears under its final name, and the rename is
    // made durable, before any row is deleted.
    std::fs::rename(&partial, folder.join(&name)).map_err(failed)?;
    std::fs::File::open(&folder)
        .and_then(|folder| folder.sync_all())
        .map_err(failed)?;
    Ok(count(rows.len()))
}

/// Where the retention of events has got: events created before
/// `pruned_before` may be gone. `None` before the first pruned event.
pub fn events_pruned_before(conn: &mut PgConnection) -> Result<Option<DateTime<Utc>>, ApiError> {
    #[derive(QueryableByName)]
    struct Mark {
        #[diesel(sql_type = Timestamptz)]
        pruned_before: DateTime<Utc>,
    }
    let mark: Option<Mark> = diesel::sql_query(
        "SELECT pruned_before FROM retention_watermarks WHERE table_name = 'events'",
    )
    .get_result(conn)
    .optional()?;
    Ok(mark.map(|mark| mark.pruned_before))
}

/// Where retention has got in one endpoint's delivery log: the highest
/// `attempt_id` it deleted for the endpoint, and the latest `attempted_at`
/// among the deleted. `None` while none of its attempts was deleted (or
/// only before this was recorded, see the migration
/// `2026-12-02-000011_webhook_attempt_watermarks`).
pub fn webhook_attempts_pruned_through(
    conn: &mut PgConnection,
    endpoint: uuid::Uuid,
) -> Result<Option<(i64, DateTime<Utc>)>, ApiError> {
    #[derive(QueryableByName)]
    struct Mark {
        #[diesel(sql_type = BigInt)]
        last_attempt_id: i64,
        #[diesel(sql_type = Timestamptz)]
        last_attempted_at: DateTime<Utc>,
    }
    let mark: Option<Mark> = diesel::sql_query(
        "SELECT last_attempt_id, last_attempted_at FROM webhook_attempt_watermarks \
         WHERE endpoint_id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(endpoint)
    .get_result(conn)
    .optional()?;
    Ok(mark.map(|mark| (mark.last_attempt_id, mark.last_attempted_at)))
}
