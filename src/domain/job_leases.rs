//! The worker's side of a job: claim with a lease, heartbeat, and finish —
//! every write fenced on the `lease_token` the claim returned, so a worker
//! that lost its lease (paused, partitioned, reclaimed) changes nothing.
//!
//! Every write that touches tokens goes through the money engine's entry
//! points (`engine_apply`'s `finish_job`, `engine_heartbeat_jobs`,
//! `engine_job_heartbeat`), which lock the
//! account row first, then the reservation, then the job, as everywhere.

use diesel::prelude::*;
use diesel::sql_types::{
    Array, BigInt, Bool, Double, Integer, Jsonb, Nullable, Text, Uuid as SqlUuid,
};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::db::models::{JobRow, ReservationRow};
use crate::db::prepared;
use crate::engine::types::AccountId;
use crate::engine::{self, Answer, Authority, Op, Operation, Outcome};
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

impl Fenced {
    /// The engine's outcome of a fenced write (one vocabulary: the
    /// engine's `Outcome`).
    fn parse(text: &str) -> Result<Fenced, ApiError> {
        Fenced::of(Outcome::parse(text)?)
    }

    fn of(outcome: Outcome) -> Result<Fenced, ApiError> {
        match outcome {
            Outcome::Done => Ok(Fenced::Done),
            Outcome::LeaseLost => Ok(Fenced::LeaseLost),
            Outcome::ReservationLost => Ok(Fenced::ReservationLost),
            other => Err(ApiError::Internal(format!(
                "unexpected outcome of a fenced job write: {}",
                other.as_str()
            ))),
        }
    }
}

/// Claims the next due job: a queued job whose backoff has passed, or a
/// running job whose lease expired (its worker died). Bumps the fencing
/// token and the attempt count (the engine's `engine_claim_jobs`).
pub fn claim_next(
    conn: &mut PgConnection,
    owner: &str,
    lease_seconds: i32,
    max_attempts: i32,
) -> Result<Option<JobRow>, ApiError> {
    Ok(claim_next_checked(conn, owner, lease_seconds, max_attempts)?.map(|claimed| claimed.job))
}

/// A claimed job, and what the engine's rules say of it: whether its
/// reservation is held for longer than the lease (then the worker's
/// heartbeats, every half lease, extend it in time and no heartbeat is
/// needed before the first provider call), and the max-attempts rule.
#[derive(QueryableByName)]
pub struct Claimed {
    #[diesel(embed)]
    pub job: JobRow,
    #[diesel(sql_type = Bool)]
    pub reservation_outlasts_lease: bool,
    /// The job had no attempt left before this claim: only a result the
    /// provider already holds may still finish it.
    #[diesel(sql_type = Bool)]
    pub over_limit: bool,
    /// No retry follows this attempt: a retryable failure is final.
    #[diesel(sql_type = Bool)]
    pub last_attempt: bool,
}

/// [`claim_next`], with what the engine's rules say of the claimed job.
pub fn claim_next_checked(
    conn: &mut PgConnection,
    owner: &str,
    lease_seconds: i32,
    max_attempts: i32,
) -> Result<Option<Claimed>, ApiError> {
    Ok(claim_jobs(conn, owner, lease_seconds, max_attempts, 1)?
        .into_iter()
        .next())
}

/// Claims up to `limit` due jobs in one transaction (the engine's
/// `engine_claim_jobs`), all leased to `owner`; in job id order.
pub fn claim_jobs(
    conn: &mut PgConnection,
    owner: &str,
    lease_seconds: i32,
    max_attempts: i32,
    limit: i32,
) -> Result<Vec<Claimed>, ApiError> {
    Ok(prepared(
        "SELECT (c.job).*, c.reservation_outlasts_lease, c.over_limit, c.last_attempt \
         FROM engine_claim_jobs($1, $2, $3, $4) c",
    )
    .bind::<Text, _>(owner)
    .bind::<Integer, _>(lease_seconds)
    .bind::<Integer, _>(max_attempts)
    .bind::<Integer, _>(limit)
    .load(conn)?)
}

/// The worker's heartbeat or retry through the engine
/// (`engine_job_heartbeat`): the reservation extended by
/// `reservation_seconds` (never shortened), then, fenced on the lease,
/// either the lease extended or (`requeue_after_seconds`) the job queued
/// again with `error`.
fn job_heartbeat(
    conn: &mut PgConnection,
    job_id: Uuid,
    lease_token: i64,
    lease_seconds: i32,
    reservation_seconds: f64,
    requeue: Option<(f64, &JobError)>,
) -> Result<Fenced, ApiError> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        outcome: String,
    }
    let row: Row = prepared("SELECT outcome FROM engine_job_heartbeat($1, $2, $3, $4, $5, $6)")
        .bind::<SqlUuid, _>(job_id)
        .bind::<BigInt, _>(lease_token)
        .bind::<Integer, _>(lease_seconds)
        .bind::<Double, _>(reservation_seconds)
        .bind::<Nullable<Double>, _>(requeue.map(|(seconds, _)| seconds))
        .bind::<Nullable<Jsonb>, _>(requeue.map(|(_, error)| error.to_json()))
        .get_result(conn)?;
    Fenced::parse(&row.outcome)
}

/// Extends the lease of one job, and its reservation when its expiry is
/// near (a heartbeat): the set-based heartbeat ([`heartbeat_many`]) with
/// one job.
pub fn heartbeat(
    conn: &mut PgConnection,
    job_id: Uuid,
    lease_token: i64,
    lease_seconds: i32,
    ttl_seconds: i32,
) -> Result<Fenced, ApiError> {
    let answers = heartbeat_many(conn, &[(job_id, lease_token)], lease_seconds, ttl_seconds)?;
    answers
        .into_iter()
        .find(|(id, token, _)| (*id, *token) == (job_id, lease_token))
        .map(|(_, _, fenced)| fenced)
        .ok_or_else(|| ApiError::Internal(format!("no heartbeat answer for job {job_id}")))
}

/// The heartbeat of many jobs in one transaction (`engine_heartbeat_jobs`):
/// each `(job, lease token)` still holding its lease has its lease extended
/// by `lease_seconds`, and its reservation by `ttl_seconds` once its expiry
/// comes within half of `ttl_seconds` or two leases (neither is ever
/// shortened; most ticks write only the jobs' rows); a job whose
/// reservation ran out fails
/// (`ReservationLost`). One answer per distinct job and token, in job id
/// order; a stale token is `LeaseLost`.
pub fn heartbeat_many(
    conn: &mut PgConnection,
    jobs: &[(Uuid, i64)],
    lease_seconds: i32,
    ttl_seconds: i32,
) -> Result<Vec<(Uuid, i64, Fenced)>, ApiError> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = SqlUuid)]
        job_id: Uuid,
        #[diesel(sql_type = BigInt)]
        lease_token: i64,
        #[diesel(sql_type = Text)]
        outcome: String,
    }
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    // In job id order: the order the engine locks them in (see
    // engine_heartbeat_jobs).
    let mut sorted = jobs.to_vec();
    sorted.sort_unstable();
    let (ids, tokens): (Vec<Uuid>, Vec<i64>) = sorted.into_iter().unzip();
    let rows: Vec<Row> =
        prepared("SELECT job_id, lease_token, outcome FROM engine_heartbeat_jobs($1, $2, $3, $4)")
            .bind::<Array<SqlUuid>, _>(ids)
            .bind::<Array<BigInt>, _>(tokens)
            .bind::<Integer, _>(lease_seconds)
            .bind::<Double, _>(f64::from(ttl_seconds))
            .load(conn)?;
    rows.into_iter()
        .map(|row| Ok((row.job_id, row.lease_token, Fenced::parse(&row.outcome)?)))
        .collect()
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

/// How a fenced job finish ended, and the reservation it resolved (if
/// this call moved it out of `held`: committed, released, or expired when
/// it had run out meanwhile).
#[derive(Debug)]
pub struct Finish {
    pub fenced: Fenced,
    pub resolved: Option<ReservationRow>,
}

/// A worker's finish of the job it holds under `lease_token`, as an
/// engine operation: the worker sends it through the coalescer, so it
/// shares a transaction (and its WAL flush) with the requests around it.
/// Success (`Ok(result)`) commits the job's cost; failure releases it
/// (reason `job_failed`). Read the answer with [`finished`].
pub fn finish_operation(
    job: &JobRow,
    lease_token: i64,
    outcome: Result<&Value, &JobError>,
) -> Operation {
    let (outcome, reason) = match outcome {
        Ok(result) => (Ok(result.clone()), None),
        Err(error) => (Err(Some(error.to_json())), Some("job_failed".to_owned())),
    };
    Operation {
        account: AccountId(job.account_id),
        authority: Authority::Verified {
            actor: SYSTEM_ACTOR.to_owned(),
        },
        op: Op::FinishJob {
            job: job.id,
            lease_token,
            outcome,
            reason,
        },
    }
}

/// How a finish sent with [`finish_operation`] ended. If the reservation
/// expired meanwhile, a success became a failure with
/// `reservation_expired` (`ReservationLost`; its tokens are recorded as
/// expired).
pub fn finished(answer: Answer) -> Result<Finish, ApiError> {
    let fenced = Fenced::of(answer.outcome)?;
    let object = answer.object.unwrap_or(Value::Null);
    let resolved = match (object.get("resolved"), object.get("reservation")) {
        (Some(Value::Bool(true)), Some(reservation)) if !reservation.is_null() => Some(
            serde_json::from_value(reservation.clone())
                .map_err(|error| ApiError::Internal(format!("engine reservation: {error}")))?,
        ),
        _ => None,
    };
    Ok(Finish { fenced, resolved })
}

/// Success: job `succeeded` and its reservation committed, in one
/// transaction (a batch of one; the worker batches through the
/// coalescer). If the reservation expired meanwhile, the job fails with
/// `reservation_expired` instead (its tokens are recorded as expired).
pub fn finish_success(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    result: &Value,
) -> Result<Finish, ApiError> {
    finished(engine::apply_one(
        conn,
        finish_operation(job, lease_token, Ok(result)),
    )?)
}

/// Final failure: job `failed` and its reservation released (or expired,
/// if it ran out meanwhile), in one transaction.
pub fn finish_failure(
    conn: &mut PgConnection,
    job: &JobRow,
    lease_token: i64,
    error: &JobError,
) -> Result<Finish, ApiError> {
    finished(engine::apply_one(
        conn,
        finish_operation(job, lease_token, Err(error)),
    )?)
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
    job_heartbeat(
        conn,
        job.id,
        lease_token,
        0,
        delay_seconds + f64::from(ttl_seconds),
        Some((delay_seconds, error)),
    )
}
