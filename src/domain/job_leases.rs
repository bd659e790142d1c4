//! The worker's side of a job: claim with a lease, heartbeat, and finish —
//! every write fenced on the `lease_token` the claim returned, so a worker
//! that lost its lease (paused, partitioned, reclaimed) changes nothing.
//!
//! Lock order, as everywhere: reservation row, then job row, then account
//! row (through `reservations::settle`).

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Text, Uuid as SqlUuid};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::db::models::{JobRow, ReservationRow};
use crate::db::prepared;
use crate::domain::reservations::{settle, Resolution};
use crate::error::ApiError;

/// The ledger `actor` of movements made by workers and the reaper.
pub const SYSTEM_ACTOR: &str = "system";

/// A job's failure, as the kiosk sees it: a stable code and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobError {
    pub code: &'static str,
    pub message: String,
}

impl JobError {
    pub fn new(code: &'static str, message: impl Into<String>) -> JobError {
        JobError {
            code,
            message: message.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// How a fenced write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    Done,
    /// The lease moved on (another claim bumped the token, or the job is no
    /// longer running): nothing was written.
    LeaseLost,
    /// The job's reservation is no longer held (expired): the job cannot
    /// succeed without a charge.
    ReservationLost,
}

/// Claims the next due job: a queued job whose backoff has passed, or a
/// running job whose lease expired (its worker died). Bumps the fencing
/// token and the attempt count.
pub fn claim_next(
    conn: &mut PgConnection,
    owner: &str,
    lease_seconds: i32,
) -> Result<Option<JobRow>, ApiError> {
    Ok(claim_next_checked(conn, owner, lease_seconds)?.map(|claimed| claimed.job))
}

/// A claimed job, and whether its reservation is held for longer than the
/// lease: then the worker's heartbeats (every half lease) extend it in time
/// and no heartbeat is needed before the first provider call.
#[derive(QueryableByName)]
pub struct Claimed {
    #[diesel(embed)]
    pub job: JobRow,
    #[diesel(sql_type = Bool)]
    pub reservation_outlasts_lease: bool,
}

/// [`claim_next`], also reading (not locking) the reservation's expiry.
pub fn claim_next_checked(
    conn: &mut PgConnection,
    owner: &str,
    lease_seconds: i32,
) -> Result<Option<Claimed>, ApiError> {
    Ok(prepared(
        "UPDATE generation_jobs \
         SET status = 'running', lease_owner = $1, lease_token = lease_token + 1, \
             lease_expires_at = now() + make_interval(secs => $2), attempts = attempts + 1, \
             updated_at = now() \
         WHERE id = COALESCE( \
             (SELECT id FROM generation_jobs WHERE status = 'queued' AND next_attempt_at <= now() \
              ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED), \
             (SELECT id FROM generation_jobs WHERE status = 'running' AND lease_expires_at < now() \
              ORDER BY lease_expires_at LIMIT 1 FOR UPDATE SKIP LOCKED)) \
           AND (status = 'queued' OR (status = 'running' AND lease_expires_at < now())) \
         RETURNING *, COALESCE((SELECT r.expires_at > now() + make_interval(secs => $2) \
                                FROM reservations r \
                                WHERE r.id = generation_jobs.reservation_id AND r.state = 'held'), \
                               false) AS reservation_outlasts_lease",
    )
    .bind::<Text, _>(owner)
    .bind::<Integer, _>(lease_seconds)
    .get_result(conn)
    .optional()?)
}

/// Extends the job's reservation (reservation row locked first, like
/// everywhere), then the job's lease, if this worker still holds it.
/// Returns (jobs updated, reservations updated).
fn extend_fenced(
    conn: &mut PgConnection,
    job_id: Uuid,
    lease_token: i64,
    reservation_seconds: f64,
    job_update: &str,
) -> Result<(usize, usize), diesel::result::Error> {
    conn.transaction(|conn| {
        let reservations = prepared(
            "UPDATE reservations SET expires_at = GREATEST(expires_at, now() + make_interval(secs => $3)) \
             WHERE id = (SELECT reservation_id FROM generation_jobs \
                         WHERE id = $1 AND lease_token = $2 AND status = 'running') \
               AND state = 'held' AND expires_at > now()",
        )
        .bind::<SqlUuid, _>(job_id)
        .bind::<BigInt, _>(lease_token)
        .bind::<diesel::sql_types::Double, _>(reservation_seconds)
        .execute(conn)?;
        let jobs = prepared(format!(
            "UPDATE generation_jobs SET {job_update}, updated_at = now() \
             WHERE id = $1 AND lease_token = $2 AND status = 'running'"
        ))
        .bind::<SqlUuid, _>(job_id)
        .bind::<BigInt, _>(lease_token)
        .execute(conn)?;
        Ok((jobs, reservations))
    })
}

fn fenced_outcome((jobs, reservations): (usize, usize)) -> Fenced {
    match (jobs, reservations) {
        (0, _) => Fenced::LeaseLost,
        (_, 0) => Fenced::ReservationLost,
        _ => Fenced::Done,
    }
}

/// Extends the lease and the reservation (a heartbeat, at half the lease).
pub fn heartbeat(
    conn: &mut PgConnection,
    job_id: Uuid,
    lease_token: i64,
    lease_seconds: i32,
    ttl_seconds: i32,
) -> Result<Fenced, ApiError> {
    let job_update = format!("lease_expires_at = now() + make_interval(secs => {lease_seconds})");
    Ok(fenced_outcome(extend_fenced(
        conn,
        job_id,
        lease_token,
        f64::from(ttl_seconds),
        &job_update,
    )?))
}

/// Remembers the provider's id for this job, so a reclaim asks the provider
/// about it instead of paying for a second generation.
pub fn record_provider_job_id(
    conn: &mut PgConnection,
    job_id: Uuid,
    lease_token: i64,
    provider_job_id: &str,
) -> Result<Fenced, ApiError> {
    let updated = prepared(
        "UPDATE generation_jobs SET provider_job_id = $3, updated_at = now() \
         WHERE id = $1 AND lease_token = $2 AND status = 'running'",
    )
    .bind::<SqlUuid, _>(job_id)
    .bind::<BigInt, _>(lease_token)
    .bind::<Text, _>(provider_job_id)
    .execute(conn)?;
    Ok(if updated == 1 {
        Fenced::Done
    } else {
        Fenced::LeaseLost
    })
}

/// Rolls a transaction back with a reason.
enum Abort {
    Fenced(Fenced),
    Error(ApiError),
}

impl From<diesel::result::Error> for Abort {
    fn from(error: diesel::result::Error) -> Self {
        Abort::Error(error.into())
    }
}

impl From<ApiError> for Abort {
    fn from(error: ApiError) -> Self {
        Abort::Error(error)
    }
}

fn finish(result: Result<(), Abort>) -> Result<Fenced, ApiError> {
    match result {
        Ok(()) => Ok(Fenced::Done),
        Err(Abort::Fenced(fenced)) => Ok(fenced),
        Err(Abort::Error(error)) => Err(error),
    }
}

/// Resolves the job's reservation (held → `state`) if this worker still
/// holds the lease. Locks the reservation row first.
fn resolve_reservation_fenced(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    state: &str,
    committed: i64,
) -> Result<Option<ReservationRow>, diesel::result::Error> {
    prepared(
        "UPDATE reservations SET state = $3, committed_amount = $4, resolved_at = now() \
         WHERE id = $1 AND state = 'held' \
           AND EXISTS (SELECT 1 FROM generation_jobs \
                       WHERE id = $2 AND lease_token = $5 AND status = 'running') \
         RETURNING *",
    )
    .bind::<SqlUuid, _>(job.reservation_id)
    .bind::<SqlUuid, _>(job.id)
    .bind::<Text, _>(state)
    .bind::<BigInt, _>(committed)
    .bind::<BigInt, _>(lease_token)
    .get_result(conn)
    .optional()
}

/// Moves the job to a terminal status if this worker still holds the lease.
fn finish_job_fenced(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    status: &str,
    result: Option<&Value>,
    error: Option<&Value>,
) -> Result<bool, diesel::result::Error> {
    let updated = prepared(
        "UPDATE generation_jobs \
         SET status = $3, result = $4, error = $5, finished_at = clock_timestamp(), updated_at = now(), \
             lease_expires_at = NULL \
         WHERE id = $1 AND lease_token = $2 AND status = 'running'",
    )
    .bind::<SqlUuid, _>(job.id)
    .bind::<BigInt, _>(lease_token)
    .bind::<Text, _>(status)
    .bind::<diesel::sql_types::Nullable<Jsonb>, _>(result)
    .bind::<diesel::sql_types::Nullable<Jsonb>, _>(error)
    .execute(conn)?;
    Ok(updated == 1)
}

/// Success: job `succeeded` and its reservation committed, in one
/// transaction. If the reservation expired meanwhile, the job fails with
/// `reservation_expired` instead (its tokens are already back).
pub fn finish_success(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    result: &Value,
) -> Result<Fenced, ApiError> {
    let outcome = finish(conn.transaction(|conn| {
        let reservation =
            resolve_reservation_fenced(conn, job, lease_token, "committed", job.cost)?;
        if !finish_job_fenced(conn, job, lease_token, "succeeded", Some(result), None)? {
            return Err(Abort::Fenced(Fenced::LeaseLost));
        }
        let Some(reservation) = reservation else {
            return Err(Abort::Fenced(Fenced::ReservationLost));
        };
        settle(
            conn,
            &reservation,
            Resolution::Commit(job.cost),
            None,
            SYSTEM_ACTOR,
        )?;
        Ok(())
    }))?;
    if outcome == Fenced::ReservationLost {
        let error = JobError::new(
            "reservation_expired",
            "the job's reservation expired before it finished",
        );
        finish_failure(conn, job, lease_token, &error)?;
    }
    Ok(outcome)
}

/// Final failure: job `failed` and its reservation released, in one
/// transaction. Also returns how many tokens this released (none when the
/// reservation had already expired).
pub fn finish_failure(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    error: &JobError,
) -> Result<(Fenced, i64), ApiError> {
    let mut released = 0;
    let fenced = finish(conn.transaction(|conn| {
        let reservation = resolve_reservation_fenced(conn, job, lease_token, "released", 0)?;
        if !finish_job_fenced(
            conn,
            job,
            lease_token,
            "failed",
            None,
            Some(&error.to_json()),
        )? {
            return Err(Abort::Fenced(Fenced::LeaseLost));
        }
        if let Some(reservation) = reservation {
            settle(
                conn,
                &reservation,
                Resolution::Release,
                Some("job_failed"),
                SYSTEM_ACTOR,
            )?;
            released = reservation.amount;
        }
        Ok(())
    }))?;
    Ok((fenced, if fenced == Fenced::Done { released } else { 0 }))
}

/// A retryable failure: back to `queued` after `delay_ms`, tokens still
/// reserved (the reservation is extended to outlive the backoff).
pub fn retry_later(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    error: &JobError,
    delay_ms: u64,
    ttl_seconds: i32,
) -> Result<Fenced, ApiError> {
    let delay_seconds = delay_ms as f64 / 1000.0;
    // The error is JSON built by us from a code and a message; it is bound
    // as a parameter inside the same transaction below.
    let counts = conn.transaction(|conn| {
        let counts = extend_fenced(
            conn,
            job.id,
            lease_token,
            delay_seconds + f64::from(ttl_seconds),
            &format!(
                "status = 'queued', lease_expires_at = NULL, \
                 next_attempt_at = now() + make_interval(secs => {delay_seconds})"
            ),
        )?;
        if counts.0 == 1 {
            prepared("UPDATE generation_jobs SET error = $2 WHERE id = $1")
                .bind::<SqlUuid, _>(job.id)
                .bind::<Jsonb, _>(error.to_json())
                .execute(conn)?;
        }
        Ok::<_, diesel::result::Error>(counts)
    })?;
    Ok(fenced_outcome(counts))
}
