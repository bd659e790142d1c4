//! Usage per key for a period `[from, to)` (docs/fleet.md, "Usage"): what
//! each booth's key reserved, used, released and let expire on one
//! account, and how its jobs ended, counted from the ledger at read time.
//!
//! A ledger entry names the key whose request wrote it (`api_key_id`). A
//! reservation's later entries may be written by the service (a job's
//! settlement by the worker, an expiry by the reaper), so the report counts
//! every entry of a reservation for the key that **made** it: the key of
//! the reservation's `reserve` entry. Entries of no key (the bootstrap
//! key, the CLI, entries written before keys were recorded) form the line
//! whose key is null. A job succeeded in the period when its reservation
//! was committed in it, and failed when its reservation was released or
//! expired without a commit (a job's reservation is settled once).
//!
//! Only closed instants are answered, as by the reconciliation: the same
//! period asked twice answers the same.

use chrono::{DateTime, NaiveDate, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Date, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::reconciliation::{csv_text, joined, period_file_name};
use crate::error::ApiError;
use crate::time::rfc3339;

/// What the lines of a usage report are: per key (the default), per job
/// kind (null: reservations made without a job), or per UTC day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    #[default]
    Key,
    Kind,
    Day,
}

/// The figures of one line, or of the whole report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageFigures {
    /// Tokens reserved (reservations and jobs made in the period).
    pub reserved: i64,
    /// Tokens committed.
    pub used: i64,
    /// Tokens released unused (a release, the rest of a partial commit, a
    /// failed job).
    pub released: i64,
    /// Tokens of reservations that expired, or whose grant lapsed while
    /// they were held.
    pub expired: i64,
    /// Jobs whose reservation was committed.
    pub jobs_succeeded: i64,
    /// Jobs whose reservation was released or expired.
    pub jobs_failed: i64,
}

impl UsageFigures {
    fn numbers(&self) -> [i64; 6] {
        [
            self.reserved,
            self.used,
            self.released,
            self.expired,
            self.jobs_succeeded,
            self.jobs_failed,
        ]
    }

    fn add(&mut self, other: &UsageFigures) {
        self.reserved += other.reserved;
        self.used += other.used;
        self.released += other.released;
        self.expired += other.expired;
        self.jobs_succeeded += other.jobs_succeeded;
        self.jobs_failed += other.jobs_failed;
    }
}

/// One line: the group it counts (only the member of `group_by` is set)
/// and its figures.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageLine {
    /// `group_by=key`: the key (null: entries of no key).
    pub api_key_id: Option<Uuid>,
    /// `group_by=key`: the key's label (null with the key).
    pub label: Option<String>,
    /// `group_by=kind`: the job's kind (null: reservations without a job).
    pub kind: Option<String>,
    /// `group_by=day`: the UTC day.
    #[schema(value_type = Option<String>, format = Date)]
    pub day: Option<NaiveDate>,
    #[serde(flatten)]
    pub figures: UsageFigures,
}

/// The usage report of one account for `[from, to)`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageReport {
    pub account_id: Uuid,
    /// Start of the period, included (RFC 3339, UTC).
    pub from: String,
    /// End of the period, excluded (RFC 3339, UTC).
    pub to: String,
    pub group_by: GroupBy,
    /// Only this key's usage (a kiosk key sees its own alone); null: every
    /// key's.
    pub only_key: Option<Uuid>,
    /// The lines, by their group (a null group last).
    pub lines: Vec<UsageLine>,
    /// The sum of the lines.
    pub totals: UsageFigures,
}

impl UsageReport {
    /// `usage_<from>_<to>.csv`, as the reconciliation names its file.
    pub fn csv_file_name(&self) -> String {
        period_file_name("usage", &self.from, &self.to)
    }
}

/// The account's entries of the period that move a reservation's tokens,
/// each with the key that made its reservation and its job's kind, added
/// up per group (`$4`: key, kind or day; `$5`: only this key).
const USAGE: &str = "\
WITH entries AS (
    SELECT e.kind, e.amount, e.job_id, e.created_at,
           CASE WHEN e.kind = 'reserve' THEN e.api_key_id
                ELSE (SELECT r.api_key_id FROM ledger_entries r
                      WHERE r.reservation_id = e.reservation_id AND r.kind = 'reserve'
                      ORDER BY r.id LIMIT 1) END AS key_id
    FROM ledger_entries e
    WHERE e.account_id = $1 AND e.created_at >= $2 AND e.created_at < $3
      AND e.reservation_id IS NOT NULL
      AND e.kind IN ('reserve', 'commit', 'release', 'expire', 'grant_expire')
), grouped AS (
    SELECT CASE WHEN $4 = 'key' THEN x.key_id END AS group_key,
           CASE WHEN $4 = 'kind' THEN (SELECT j.kind FROM generation_jobs j WHERE j.id = x.job_id)
           END AS job_kind,
           CASE WHEN $4 = 'day' THEN (x.created_at AT TIME ZONE 'UTC')::date END AS day,
           x.*
    FROM entries x
    WHERE $5::uuid IS NULL OR x.key_id = $5
)
SELECT g.group_key AS key_id, k.label, g.job_kind, g.day,
       COALESCE(sum(g.amount) FILTER (WHERE g.kind = 'reserve'), 0)::bigint AS reserved,
       COALESCE(sum(g.amount) FILTER (WHERE g.kind = 'commit'), 0)::bigint AS used,
       COALESCE(sum(g.amount) FILTER (WHERE g.kind = 'release'), 0)::bigint AS released,
       COALESCE(sum(g.amount) FILTER (WHERE g.kind IN ('expire', 'grant_expire')), 0)::bigint
           AS expired,
       count(DISTINCT g.job_id) FILTER (WHERE g.kind = 'commit') AS jobs_succeeded,
       count(DISTINCT g.job_id) FILTER (WHERE g.kind IN ('release', 'expire', 'grant_expire'))
           AS jobs_failed
FROM grouped g LEFT JOIN api_keys k ON k.id = g.group_key
GROUP BY g.group_key, k.label, g.job_kind, g.day
ORDER BY g.day NULLS LAST, g.job_kind NULLS LAST, k.label NULLS LAST, g.group_key";

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Nullable<SqlUuid>)]
    key_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Text>)]
    label: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    job_kind: Option<String>,
    #[diesel(sql_type = Nullable<Date>)]
    day: Option<NaiveDate>,
    #[diesel(sql_type = BigInt)]
    reserved: i64,
    #[diesel(sql_type = BigInt)]
    used: i64,
    #[diesel(sql_type = BigInt)]
    released: i64,
    #[diesel(sql_type = BigInt)]
    expired: i64,
    #[diesel(sql_type = BigInt)]
    jobs_succeeded: i64,
    #[diesel(sql_type = BigInt)]
    jobs_failed: i64,
}

/// Builds the usage report of `account` for `[from, to)`, of one key's
/// usage when `only_key` is set. Waits for `to` to close, as the
/// reconciliation does (409 `instant_not_closed` when it does not within
/// a second).
pub fn usage(
    conn: &mut PgConnection,
    account: Uuid,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    group_by: GroupBy,
    only_key: Option<Uuid>,
) -> Result<UsageReport, ApiError> {
    crate::domain::history::wait_until_closed(conn, to.min(Utc::now()))?;
    let group = match group_by {
        GroupBy::Key => "key",
        GroupBy::Kind => "kind",
        GroupBy::Day => "day",
    };
    let rows: Vec<Row> = diesel::sql_query(USAGE)
        .bind::<SqlUuid, _>(account)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<Text, _>(group)
        .bind::<Nullable<SqlUuid>, _>(only_key)
        .load(conn)?;
    let mut totals = UsageFigures::default();
    let lines: Vec<UsageLine> = rows
        .into_iter()
        .map(|row| {
            let figures = UsageFigures {
                reserved: row.reserved,
                used: row.used,
                released: row.released,
                expired: row.expired,
                jobs_succeeded: row.jobs_succeeded,
                jobs_failed: row.jobs_failed,
            };
            totals.add(&figures);
            UsageLine {
                api_key_id: row.key_id,
                label: row.label,
                kind: row.job_kind,
                day: row.day,
                figures,
            }
        })
        .collect();
    Ok(UsageReport {
        account_id: account,
        from: rfc3339(from),
        to: rfc3339(to),
        group_by,
        only_key,
        lines,
        totals,
    })
}

/// The report as CSV: the group's columns (`api_key_id,label`, `kind` or
/// `day`), the figures, then a totals row. Labels and kinds are defused
/// against formulas (`csv_text`).
pub fn to_csv(report: &UsageReport) -> String {
    const FIGURES: &str = "reserved,used,released,expired,jobs_succeeded,jobs_failed";
    let mut csv = match report.group_by {
        GroupBy::Key => format!("api_key_id,label,{FIGURES}\n"),
        GroupBy::Kind => format!("kind,{FIGURES}\n"),
        GroupBy::Day => format!("day,{FIGURES}\n"),
    };
    let text = |value: &Option<String>| value.as_deref().map(csv_text).unwrap_or_default();
    for line in &report.lines {
        let group = match report.group_by {
            GroupBy::Key => format!(
                "{},{}",
                line.api_key_id.map(|id| id.to_string()).unwrap_or_default(),
                text(&line.label)
            ),
            GroupBy::Kind => text(&line.kind),
            GroupBy::Day => line.day.map(|day| day.to_string()).unwrap_or_default(),
        };
        csv.push_str(&format!("{group},{}\n", joined(&line.figures.numbers())));
    }
    let totals = match report.group_by {
        GroupBy::Key => "totals,",
        GroupBy::Kind | GroupBy::Day => "totals",
    };
    csv.push_str(&format!("{totals},{}\n", joined(&report.totals.numbers())));
    csv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_defuses_labels_and_adds_a_totals_row() {
        let figures = UsageFigures {
            reserved: 5,
            used: 3,
            released: 1,
            expired: 1,
            jobs_succeeded: 2,
            jobs_failed: 1,
        };
        let report = UsageReport {
            account_id: Uuid::nil(),
            from: "2026-12-01T00:00:00.000000Z".into(),
            to: "2026-12-02T00:00:00.000000Z".into(),
            group_by: GroupBy::Key,
            only_key: None,
            lines: vec![UsageLine {
                api_key_id: Some(Uuid::from_u128(1)),
                label: Some("=HYPERLINK(\"x\")".into()),
                kind: None,
                day: None,
                figures: figures.clone(),
            }],
            totals: figures,
        };
        assert_eq!(
            to_csv(&report),
            "api_key_id,label,reserved,used,released,expired,jobs_succeeded,jobs_failed\n\
             00000000-0000-0000-0000-000000000001,\"'=HYPERLINK(\"\"x\"\")\",5,3,1,1,2,1\n\
             totals,,5,3,1,1,2,1\n"
        );
    }
}
