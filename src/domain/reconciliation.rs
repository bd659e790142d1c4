//! Finance reconciliation for a period `[from, to)`: per account the
//! roll-forward `opening + credited + adjusted − committed = closing`
//! (opening and closing = available + reserved, from the ledger's
//! balances-after), the movements of the period, succeeded jobs against
//! their commit entries, and the invariant checks of `checks`. One pass of
//! set-based SQL; the rows come ordered by account id, so the same
//! period over the same data gives the same report, byte for byte.

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Timestamptz, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::checks::{find_violations, Discrepancy};
use crate::error::ApiError;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, QueryableByName)]
pub struct AccountReconciliation {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = BigInt)]
    pub opening_available: i64,
    #[diesel(sql_type = BigInt)]
    pub opening_reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub opening_used: i64,
    #[diesel(sql_type = BigInt)]
    pub credited: i64,
    #[diesel(sql_type = BigInt)]
    pub adjusted: i64,
    #[diesel(sql_type = BigInt)]
    pub reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub committed: i64,
    #[diesel(sql_type = BigInt)]
    pub released: i64,
    #[diesel(sql_type = BigInt)]
    pub expired: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_available: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_used: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_succeeded: i64,
    #[diesel(sql_type = BigInt)]
    pub job_commit_entries: i64,
}

impl AccountReconciliation {
    pub fn opening(&self) -> i64 {
        self.opening_available + self.opening_reserved
    }

    pub fn closing(&self) -> i64 {
        self.closing_available + self.closing_reserved
    }

    /// The period's own checks (the state checks come from `checks`).
    fn discrepancies(&self) -> Vec<Discrepancy> {
        let checks = [
            (
                "roll_forward",
                self.opening() + self.credited + self.adjusted - self.committed,
                self.closing(),
            ),
            (
                "used_roll_forward",
                self.opening_used + self.committed,
                self.closing_used,
            ),
            (
                "succeeded_jobs_match_commits",
                self.jobs_succeeded,
                self.job_commit_entries,
            ),
        ];
        checks
            .into_iter()
            .filter(|(_, expected, actual)| expected != actual)
            .map(|(check, expected, actual)| Discrepancy {
                account_id: self.account_id,
                check: check.to_owned(),
                expected,
                actual,
            })
            .collect()
    }
}

/// One account's line of the report.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AccountLine {
    pub account_id: Uuid,
    /// `ok` or `mismatch`.
    pub status: &'static str,
    pub opening: i64,
    pub credited: i64,
    pub adjusted: i64,
    pub committed: i64,
    pub closing: i64,
    pub reserved: i64,
    pub released: i64,
    pub expired: i64,
    pub opening_available: i64,
    pub opening_reserved: i64,
    pub opening_used: i64,
    pub closing_available: i64,
    pub closing_reserved: i64,
    pub closing_used: i64,
    pub jobs_succeeded: i64,
    pub job_commit_entries: i64,
}

#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Totals {
    pub accounts: i64,
    pub opening: i64,
    pub credited: i64,
    pub adjusted: i64,
    pub committed: i64,
    pub closing: i64,
    pub reserved: i64,
    pub released: i64,
    pub expired: i64,
    pub jobs_succeeded: i64,
    pub job_commit_entries: i64,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Report {
    pub from: String,
    pub to: String,
    /// The instant the books were read up to: the end of the period, or
    /// the database's `now()` while the period is still open.
    pub generated_at: String,
    /// `ok` or `mismatch`.
    pub status: &'static str,
    pub totals: Totals,
    pub accounts: Vec<AccountLine>,
    pub discrepancies: Vec<Discrepancy>,
}

fn rfc3339(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Builds the report for `[from, to)`, optionally for one account.
pub fn reconcile(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    account: Option<Uuid>,
) -> Result<Report, ApiError> {
    // One snapshot for the period query and the state checks.
    conn.build_transaction().repeatable_read().read_only().run(|conn| {
        let rows: Vec<AccountReconciliation> = diesel::sql_query(
            "WITH opening AS ( \
                 SELECT DISTINCT ON (account_id) account_id, available_after, reserved_after, used_after \
                 FROM ledger_entries WHERE created_at < $1 ORDER BY account_id, id DESC), \
             closing AS ( \
                 SELECT DISTINCT ON (account_id) account_id, available_after, reserved_after, used_after \
                 FROM ledger_entries WHERE created_at < $2 ORDER BY account_id, id DESC), \
             movements AS ( \
                 SELECT account_id, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'credit'), 0)::bigint AS credited, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'adjustment'), 0)::bigint AS adjusted, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'reserve'), 0)::bigint AS reserved, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'commit'), 0)::bigint AS committed, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'release'), 0)::bigint AS released, \
                     COALESCE(sum(amount) FILTER (WHERE kind = 'expire'), 0)::bigint AS expired, \
                     count(*) FILTER (WHERE kind = 'commit' AND job_id IS NOT NULL) AS job_commit_entries \
                 FROM ledger_entries WHERE created_at >= $1 AND created_at < $2 GROUP BY account_id), \
             jobs AS ( \
                 SELECT account_id, count(*) AS succeeded FROM generation_jobs \
                 WHERE status = 'succeeded' AND finished_at >= $1 AND finished_at < $2 GROUP BY account_id) \
             SELECT a.id AS account_id, \
                 COALESCE(o.available_after, 0) AS opening_available, \
                 COALESCE(o.reserved_after, 0) AS opening_reserved, \
                 COALESCE(o.used_after, 0) AS opening_used, \
                 COALESCE(m.credited, 0) AS credited, COALESCE(m.adjusted, 0) AS adjusted, \
                 COALESCE(m.reserved, 0) AS reserved, COALESCE(m.committed, 0) AS committed, \
                 COALESCE(m.released, 0) AS released, COALESCE(m.expired, 0) AS expired, \
                 COALESCE(c.available_after, 0) AS closing_available, \
                 COALESCE(c.reserved_after, 0) AS closing_reserved, \
                 COALESCE(c.used_after, 0) AS closing_used, \
                 COALESCE(j.succeeded, 0) AS jobs_succeeded, \
                 COALESCE(m.job_commit_entries, 0) AS job_commit_entries \
             FROM accounts a \
             LEFT JOIN opening o ON o.account_id = a.id \
             LEFT JOIN closing c ON c.account_id = a.id \
             LEFT JOIN movements m ON m.account_id = a.id \
             LEFT JOIN jobs j ON j.account_id = a.id \
             WHERE a.created_at < $2 AND ($3::uuid IS NULL OR a.id = $3) \
             ORDER BY a.id",
        )
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<Nullable<SqlUuid>, _>(account)
        .load(conn)?;
        let mut discrepancies: Vec<Discrepancy> = rows.iter().flat_map(AccountReconciliation::discrepancies).collect();
        discrepancies.extend(
            find_violations(conn)?.into_iter().filter(|d| account.is_none_or(|only| d.account_id == only)),
        );
        discrepancies.sort_by(|a, b| (a.account_id, &a.check).cmp(&(b.account_id, &b.check)));
        let now: DateTime<Utc> = diesel::select(diesel::dsl::now.into_sql::<Timestamptz>()).get_result(conn)?;
        Ok(build_report(from, to, now, rows, discrepancies))
    })
}

fn build_report(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    rows: Vec<AccountReconciliation>,
    discrepancies: Vec<Discrepancy>,
) -> Report {
    let mut totals = Totals::default();
    let accounts: Vec<AccountLine> = rows
        .into_iter()
        .map(|row| {
            totals.accounts += 1;
            totals.opening += row.opening();
            totals.credited += row.credited;
            totals.adjusted += row.adjusted;
            totals.committed += row.committed;
            totals.closing += row.closing();
            totals.reserved += row.reserved;
            totals.released += row.released;
            totals.expired += row.expired;
            totals.jobs_succeeded += row.jobs_succeeded;
            totals.job_commit_entries += row.job_commit_entries;
            let mismatch = discrepancies.iter().any(|d| d.account_id == row.account_id);
            AccountLine {
                account_id: row.account_id,
                status: if mismatch { "mismatch" } else { "ok" },
                opening: row.opening(),
                credited: row.credited,
                adjusted: row.adjusted,
                committed: row.committed,
                closing: row.closing(),
                reserved: row.reserved,
                released: row.released,
                expired: row.expired,
                opening_available: row.opening_available,
                opening_reserved: row.opening_reserved,
                opening_used: row.opening_used,
                closing_available: row.closing_available,
                closing_reserved: row.closing_reserved,
                closing_used: row.closing_used,
                jobs_succeeded: row.jobs_succeeded,
                job_commit_entries: row.job_commit_entries,
            }
        })
        .collect();
    Report {
        from: rfc3339(from),
        to: rfc3339(to),
        generated_at: rfc3339(to.min(now)),
        status: if discrepancies.is_empty() {
            "ok"
        } else {
            "mismatch"
        },
        totals,
        accounts,
        discrepancies,
    }
}

/// The per-account lines as CSV (a header line, then one line per account).
pub fn to_csv(report: &Report) -> String {
    let mut csv = String::from(
        "account_id,status,opening,credited,adjusted,committed,closing,reserved,released,expired,\
         opening_available,opening_reserved,opening_used,closing_available,closing_reserved,closing_used,\
         jobs_succeeded,job_commit_entries,failed_checks\n",
    );
    for line in &report.accounts {
        let failed: Vec<&str> = report
            .discrepancies
            .iter()
            .filter(|d| d.account_id == line.account_id)
            .map(|d| d.check.as_str())
            .collect();
        let numbers = [
            line.opening,
            line.credited,
            line.adjusted,
            line.committed,
            line.closing,
            line.reserved,
            line.released,
            line.expired,
            line.opening_available,
            line.opening_reserved,
            line.opening_used,
            line.closing_available,
            line.closing_reserved,
            line.closing_used,
            line.jobs_succeeded,
            line.job_commit_entries,
        ];
        let numbers: Vec<String> = numbers.iter().map(i64::to_string).collect();
        csv.push_str(&format!(
            "{},{},{},{}\n",
            line.account_id,
            line.status,
            numbers.join(","),
            failed.join(";")
        ));
    }
    csv
}

/// Parses and checks a period: RFC 3339 bounds, `from < to`, at most
/// `max` long; `to` defaults to now, `from` to `to − default`.
pub fn parse_period(
    from: Option<&str>,
    to: Option<&str>,
    now: DateTime<Utc>,
    default: std::time::Duration,
    max: std::time::Duration,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let parse = |name: &str, text: &str| {
        DateTime::parse_from_rfc3339(text)
            .map(|instant| instant.with_timezone(&Utc))
            .map_err(|error| {
                ApiError::InvalidRequest(format!("{name} must be an RFC 3339 timestamp: {error}"))
            })
    };
    let to = to.map(|text| parse("to", text)).transpose()?.unwrap_or(now);
    let default =
        chrono::Duration::from_std(default).map_err(|e| ApiError::Internal(e.to_string()))?;
    let max = chrono::Duration::from_std(max).map_err(|e| ApiError::Internal(e.to_string()))?;
    let from = from
        .map(|text| parse("from", text))
        .transpose()?
        .unwrap_or(to - default);
    if from >= to {
        return Err(ApiError::InvalidRequest("from must be before to".into()));
    }
    if to - from > max {
        return Err(ApiError::InvalidRequest(format!(
            "the period may be at most {} days",
            max.num_days()
        )));
    }
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_checked() {
        let now: DateTime<Utc> = "2026-11-29T12:00:00Z".parse().expect("time");
        let day = std::time::Duration::from_secs(86_400);
        let year = std::time::Duration::from_secs(366 * 86_400);
        let (from, to) = parse_period(None, None, now, day, year).expect("defaults");
        assert_eq!((to - from).num_hours(), 24);
        assert!(parse_period(
            Some("2026-11-29T12:00:00Z"),
            Some("2026-11-29T12:00:00Z"),
            now,
            day,
            year
        )
        .is_err());
        assert!(parse_period(Some("yesterday"), None, now, day, year).is_err());
        assert!(parse_period(Some("2020-01-01T00:00:00Z"), None, now, day, year).is_err());
        let (from, _) =
            parse_period(Some("2026-11-29T10:00:00+01:00"), None, now, day, year).expect("offset");
        assert_eq!(
            from,
            "2026-11-29T09:00:00Z"
                .parse::<DateTime<Utc>>()
                .expect("time")
        );
    }
}
