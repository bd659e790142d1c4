//! The system summary: what an operator checks first, in one read. The
//! database part (reservations, jobs, accounts, the reaper's last pass) is
//! the same for every replica; the provider and repair counters are this
//! replica's since it started (they come from its metrics, as in `/metrics`).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Integer, Nullable, Timestamptz};
use serde::Serialize;

use crate::error::ApiError;

/// The shared, database-derived part of the summary.
#[derive(Debug, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct DatabaseSummary {
    /// The database's clock when it was read.
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub database_time: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub accounts: i64,
    #[diesel(sql_type = BigInt)]
    pub accounts_suspended: i64,
    /// Reservations held now, and the tokens they hold.
    #[diesel(sql_type = BigInt)]
    pub reservations_held: i64,
    #[diesel(sql_type = BigInt)]
    pub reserved_tokens: i64,
    /// Age of the oldest held reservation, seconds; null when none is held.
    #[diesel(sql_type = Nullable<Double>)]
    pub oldest_reservation_age_seconds: Option<f64>,
    /// The earliest expiry of a held reservation.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[serde(with = "crate::time::micros_option")]
    pub next_expiry_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = BigInt)]
    pub jobs_queued: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_running: i64,
    /// The reaper's last successful pass (any replica); null before the first.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[serde(with = "crate::time::micros_option")]
    pub reaper_last_success_at: Option<DateTime<Utc>>,
    /// Accounts violating an invariant at that pass; null before the first.
    #[diesel(sql_type = Nullable<Integer>)]
    pub invariant_violations: Option<i32>,
}

/// Reads the database part in one statement (one snapshot). Every part is
/// served by an index or a small table (partial indexes on held
/// reservations and on queued and running jobs), so the console may poll it.
pub fn database_summary(conn: &mut PgConnection) -> Result<DatabaseSummary, ApiError> {
    Ok(diesel::sql_query(
        "SELECT now() AS database_time, \
           (SELECT count(*) FROM accounts) AS accounts, \
           (SELECT count(*) FROM accounts WHERE status = 'suspended') AS accounts_suspended, \
           held.count AS reservations_held, held.tokens AS reserved_tokens, \
           EXTRACT(EPOCH FROM now() - held.oldest)::float8 AS oldest_reservation_age_seconds, \
           held.next_expiry AS next_expiry_at, \
           (SELECT count(*) FROM generation_jobs WHERE status = 'queued') AS jobs_queued, \
           (SELECT count(*) FROM generation_jobs WHERE status = 'running') AS jobs_running, \
           (SELECT last_success_at FROM reaper_status) AS reaper_last_success_at, \
           (SELECT invariant_violations FROM reaper_status) AS invariant_violations \
         FROM (SELECT count(*) AS count, COALESCE(sum(amount), 0)::bigint AS tokens, \
                      min(created_at) AS oldest, min(expires_at) AS next_expiry \
                 FROM reservations WHERE state = 'held') AS held",
    )
    .get_result(conn)?)
}
