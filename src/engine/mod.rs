//! The money engine's Rust side. Every token movement, job transition and
//! key rule is decided and written by the engine's SQL, one file per
//! subject in `src/engine/sql/` (installed by [`install`] into a schema
//! named by its content); this module only builds operations, sends them
//! as one array of the engine's composite type `engine_request`, and reads
//! the outcome of each.
//!
//! - [`apply`] sends a batch of operations on any accounts to
//!   `engine_apply` (`sql/70_apply.sql`), the one entry point, in one
//!   statement: one transaction, one WAL flush, accounts locked in id
//!   order, then each operation decided in order by the one function of
//!   its kind and written by the one write path (`engine_record`). A
//!   single request is a batch of one; the coalescer (`crate::coalesce`)
//!   makes bigger batches of concurrent requests.
//! - the worker (`domain::job_leases`) and the reaper (`domain::reaper`)
//!   call the engine's other entry points (`sql/60_jobs.sql`: fenced job
//!   finish, heartbeat, expiry, fix-ups), which reach the same rule
//!   functions.
//!
//! The outcome of each operation comes out of the code that decided it:
//! there is no second read to guess why something was refused.

pub mod credits;
pub mod install;
pub mod jobs;
mod outcome;
pub mod types;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::serialize::{self, Output, ToSql, WriteTuple};
use diesel::sql_types::{
    Array, BigInt, Bool, Bytea, Integer, Jsonb, Nullable, SqlType, Text, Timestamptz,
    Uuid as SqlUuid,
};
use serde_json::Value;
use uuid::Uuid;

use crate::db::prepared::{self, prepared_static, StaticSql};
use crate::error::ApiError;
use jobs::JobRequest;
use types::{
    AccountId, ExternalRef, GrantExpiry, Note, Price, Priority, Reason, RequestId, ReservationId,
    SignedTokens, Tokens, TtlSeconds,
};

pub use outcome::{decode, Answer, Outcome, Replay};

/// What one operation asks of an account.
#[derive(Clone, Debug)]
pub enum Op {
    Reserve {
        request_id: RequestId,
        amount: Tokens,
        /// As the client sent it (part of the idempotency comparison).
        ttl_seconds: Option<TtlSeconds>,
        /// The TTL applied: the client's or the configured default.
        effective_ttl_seconds: i32,
    },
    /// Spend `amount`; the rest goes back.
    Commit {
        reservation: ReservationId,
        amount: CommitAmount,
    },
    Release {
        reservation: ReservationId,
    },
    Extend {
        reservation: ReservationId,
        ttl_seconds: TtlSeconds,
    },
    CreateJob {
        request: JobRequest,
        ttl_seconds: i32,
    },
    /// Makes a grant of `priority` holding `amount`, lapsing at
    /// `expires_at` (`None`: never).
    Credit {
        amount: Tokens,
        external_ref: ExternalRef,
        note: Option<Note>,
        priority: Priority,
        expires_at: Option<GrantExpiry>,
        /// What was paid for the grant (`None`: unpriced).
        price: Option<Price>,
    },
    /// A positive adjustment makes a grant of `priority` (set exactly
    /// then) lapsing at `expires_at` (only then; `None`: never); a negative
    /// one draws from the grants in draw order.
    Adjust {
        amount: SignedTokens,
        reason: Reason,
        external_ref: ExternalRef,
        priority: Option<Priority>,
        expires_at: Option<GrantExpiry>,
        /// A positive adjustment's grant's price (`None`: unpriced, and
        /// always for a removal).
        price: Option<Price>,
    },
    /// A worker's fenced finish of the job it holds under `lease_token`:
    /// success (`Ok(result)`) commits the job's cost, failure (`Err(error)`)
    /// releases it with `reason`.
    FinishJob {
        job: Uuid,
        lease_token: i64,
        outcome: Result<Value, Option<Value>>,
        reason: Option<String>,
    },
}

/// How much of a held reservation a commit spends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitAmount {
    /// Everything held.
    All,
    /// Exactly this many tokens (at most what is held).
    Exactly(Tokens),
}

/// Who asks: a presented key the engine verifies in the same statement
/// (spending endpoints), or a caller the service has already authorised
/// (admin endpoints, workers, the reaper) with its ledger actor, or an
/// authorised HTTP request with its request id (the audit event's
/// `request_id` of a credit or an adjustment).
#[derive(Clone, Debug)]
pub enum Authority {
    /// A presented key: its id and the SHA-256 of its secret.
    Key {
        id: Uuid,
        secret_hash: [u8; 32],
    },
    Verified {
        actor: String,
    },
    Request {
        actor: String,
        request_id: Option<String>,
        /// The caller's key (its ledger entries' `api_key_id`), verified
        /// by the service; `None` for the bootstrap key and the CLI.
        key: Option<Uuid>,
    },
}

impl Authority {
    /// What the engine verifies: a presented key's id and secret hash
    /// (`authorized` false), or nothing — every other caller was
    /// authorised by the service already (`authorized` true; an admin's
    /// request still names its key, for the ledger's `api_key_id`).
    fn presented(&self) -> (Option<Uuid>, Option<Vec<u8>>, bool) {
        match self {
            Authority::Key { id, secret_hash } => (Some(*id), Some(secret_hash.to_vec()), false),
            Authority::Request { key, .. } => (*key, None, true),
            Authority::Verified { .. } => (None, None, true),
        }
    }

    fn actor(&self) -> String {
        match self {
            Authority::Key { id, .. } => types::ApiKeyId(*id).to_string(),
            Authority::Verified { actor } | Authority::Request { actor, .. } => actor.clone(),
        }
    }
}

/// One operation of a batch.
#[derive(Clone, Debug)]
pub struct Operation {
    pub account: AccountId,
    pub authority: Authority,
    pub op: Op,
}

impl Operation {
    /// Tokens this operation would move into `reserved` (for metrics).
    pub fn reserve_amount(&self) -> Option<i64> {
        match &self.op {
            Op::Reserve { amount, .. } => Some(amount.get()),
            Op::CreateJob { request, .. } => Some(request.cost),
            _ => None,
        }
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Integer)]
    op_position: i32,
    #[diesel(sql_type = Text)]
    outcome: String,
    #[diesel(sql_type = Nullable<Jsonb>)]
    detail: Option<Value>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    object: Option<Value>,
}

// The hot statement, found in a connection's statement cache by a type of
// its own (`db::prepared::StaticSql`), which holds its text.

/// The one statement every batch is: one array of `engine_request`, one
/// element per operation (`engine_op_incomplete` in `sql/70_apply.sql`
/// says which fields each operation sets).
struct ApplyStatement;
impl StaticSql for ApplyStatement {
    const SQL: &'static str = "SELECT op_position, outcome, detail, object FROM engine_apply($1) \
         UNION ALL SELECT 0, 'tallies', t, NULL FROM engine_tallies() t \
         ORDER BY op_position";
}

/// The engine's composite type `engine_request` (`sql/00_types.sql`): one
/// operation of a batch. Found by name on the connection's `search_path`,
/// where each build's engine schema is (`db::set_session`).
#[derive(SqlType)]
#[diesel(postgres_type(name = "engine_request"))]
pub struct EngineRequest;

/// `engine_request`'s fields, in its order.
type EngineRequestFields = (
    Text,
    SqlUuid,
    Text,
    Nullable<SqlUuid>,
    Nullable<Bytea>,
    Bool,
    Nullable<SqlUuid>,
    Nullable<BigInt>,
    Nullable<Integer>,
    Nullable<Integer>,
    Nullable<SqlUuid>,
    Nullable<SqlUuid>,
    Nullable<SqlUuid>,
    Nullable<Bytea>,
    Nullable<Text>,
    Nullable<Jsonb>,
    Nullable<Text>,
    Nullable<Text>,
    Nullable<Text>,
    Nullable<Text>,
    Nullable<BigInt>,
    Nullable<Text>,
    Nullable<Jsonb>,
    Nullable<Jsonb>,
    Nullable<Integer>,
    Nullable<Timestamptz>,
    Nullable<BigInt>,
    Nullable<Text>,
);

/// One operation as `engine_apply` takes it. New ids are chosen here.
struct Request {
    op: &'static str,
    account: Uuid,
    actor: String,
    key_id: Option<Uuid>,
    key_hash: Option<Vec<u8>>,
    authorized: bool,
    http_request_id: Option<String>,
    fields: Fields,
}

impl Request {
    fn of(operation: &Operation) -> Request {
        let (op, fields) = operation.op.fields();
        let (key_id, key_hash, authorized) = operation.authority.presented();
        Request {
            op,
            account: operation.account.0,
            actor: operation.authority.actor(),
            key_id,
            key_hash,
            authorized,
            http_request_id: match &operation.authority {
                Authority::Request { request_id, .. } => request_id.clone(),
                _ => None,
            },
            fields,
        }
    }
}

/// (Required by `ToSql`.) The kind and account only: the key's hash and
/// the request's payload stay out of any log.
impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.op)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl ToSql<EngineRequest, Pg> for Request {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        let f = &self.fields;
        WriteTuple::<EngineRequestFields>::write_tuple(
            &(
                self.op,
                self.account,
                &self.actor,
                self.key_id,
                &self.key_hash,
                self.authorized,
                f.request,
                f.amount,
                f.requested_ttl,
                f.ttl,
                f.new_id,
                f.job,
                f.reservation,
                &f.hash,
                &f.kind,
                &f.params,
                &f.external_ref,
                &f.note,
                &f.reason,
                &self.http_request_id,
                f.lease_token,
                f.status,
                &f.result,
                &f.error,
                f.priority,
                f.expires_at,
                f.amount_paid,
                &f.currency,
            ),
            out,
        )
    }
}

/// One operation's fields; what an operation does not set stays `None`.
#[derive(Default)]
struct Fields {
    request: Option<Uuid>,
    amount: Option<i64>,
    requested_ttl: Option<i32>,
    ttl: Option<i32>,
    new_id: Option<Uuid>,
    job: Option<Uuid>,
    reservation: Option<Uuid>,
    hash: Option<Vec<u8>>,
    kind: Option<String>,
    params: Option<Value>,
    external_ref: Option<String>,
    note: Option<String>,
    reason: Option<String>,
    lease_token: Option<i64>,
    status: Option<&'static str>,
    result: Option<Value>,
    error: Option<Value>,
    priority: Option<i32>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    amount_paid: Option<i64>,
    currency: Option<String>,
}

impl Op {
    fn fields(&self) -> (&'static str, Fields) {
        match self {
            Op::Reserve {
                request_id,
                amount,
                ttl_seconds,
                effective_ttl_seconds,
            } => (
                "reserve",
                Fields {
                    request: Some(request_id.0),
                    amount: Some(amount.get()),
                    requested_ttl: ttl_seconds.map(TtlSeconds::get),
                    ttl: Some(*effective_ttl_seconds),
                    new_id: Some(Uuid::now_v7()),
                    ..Fields::default()
                },
            ),
            Op::Commit {
                reservation,
                amount: CommitAmount::Exactly(amount),
            } => (
                "commit",
                Fields {
                    reservation: Some(reservation.0),
                    amount: Some(amount.get()),
                    ..Fields::default()
                },
            ),
            Op::Commit {
                reservation,
                amount: CommitAmount::All,
            } => (
                "commit_all",
                Fields {
                    reservation: Some(reservation.0),
                    ..Fields::default()
                },
            ),
            Op::Release { reservation } => (
                "release",
                Fields {
                    reservation: Some(reservation.0),
                    ..Fields::default()
                },
            ),
            Op::Extend {
                reservation,
                ttl_seconds,
            } => (
                "extend",
                Fields {
                    reservation: Some(reservation.0),
                    ttl: Some(ttl_seconds.get()),
                    ..Fields::default()
                },
            ),
            Op::CreateJob {
                request,
                ttl_seconds,
            } => (
                "create_job",
                Fields {
                    request: Some(request.request_id.0),
                    amount: Some(request.cost),
                    ttl: Some(*ttl_seconds),
                    new_id: Some(Uuid::now_v7()),
                    job: Some(Uuid::now_v7()),
                    hash: Some(request.hash().to_vec()),
                    kind: Some(request.kind.clone()),
                    params: Some(request.params.clone()),
                    ..Fields::default()
                },
            ),
            Op::Credit {
                amount,
                external_ref,
                note,
                priority,
                expires_at,
                price,
            } => (
                "credit",
                Fields {
                    amount: Some(amount.get()),
                    new_id: Some(Uuid::now_v7()),
                    external_ref: Some(external_ref.as_str().to_owned()),
                    note: note.as_ref().map(|note| note.as_str().to_owned()),
                    priority: Some(i32::from(priority.get())),
                    expires_at: expires_at.map(GrantExpiry::get),
                    amount_paid: price.as_ref().map(|price| price.amount_paid.get()),
                    currency: price
                        .as_ref()
                        .map(|price| price.currency.as_str().to_owned()),
                    ..Fields::default()
                },
            ),
            Op::Adjust {
                amount,
                reason,
                external_ref,
                priority,
                expires_at,
                price,
            } => (
                "adjust",
                Fields {
                    amount: Some(amount.get()),
                    new_id: Some(Uuid::now_v7()),
                    external_ref: Some(external_ref.as_str().to_owned()),
                    reason: Some(reason.as_str().to_owned()),
                    priority: priority.map(|priority| i32::from(priority.get())),
                    expires_at: expires_at.map(GrantExpiry::get),
                    amount_paid: price.as_ref().map(|price| price.amount_paid.get()),
                    currency: price
                        .as_ref()
                        .map(|price| price.currency.as_str().to_owned()),
                    ..Fields::default()
                },
            ),
            Op::FinishJob {
                job,
                lease_token,
                outcome,
                reason,
            } => {
                let (status, result, error) = match outcome {
                    Ok(result) => ("succeeded", Some(result.clone()), None),
                    Err(error) => ("failed", None, error.clone()),
                };
                (
                    "finish_job",
                    Fields {
                        job: Some(*job),
                        lease_token: Some(*lease_token),
                        status: Some(status),
                        result,
                        error,
                        reason: reason.clone(),
                        ..Fields::default()
                    },
                )
            }
        }
    }
}

/// The batch as the engine reads it: each operation's `engine_request` as
/// JSON (`to_jsonb`: the type's field names). The fields cross by position
/// (`EngineRequestFields`, `sql/00_types.sql`); the test that the two
/// declarations agree reads this (two fields of one type swapped would
/// still bind).
pub fn engine_requests(
    conn: &mut PgConnection,
    operations: &[Operation],
) -> Result<Vec<Value>, ApiError> {
    #[derive(QueryableByName)]
    struct Echo {
        #[diesel(sql_type = Jsonb)]
        request: Value,
    }
    let requests: Vec<Request> = operations.iter().map(Request::of).collect();
    let rows: Vec<Echo> = prepared::prepared(
        "SELECT to_jsonb(r) - 'ordinality' AS request \
         FROM unnest($1) WITH ORDINALITY AS r ORDER BY r.ordinality",
    )
    .bind::<Array<EngineRequest>, _>(&requests)
    .load(conn)?;
    Ok(rows.into_iter().map(|row| row.request).collect())
}

/// Applies `operations` in order, in one statement (its own transaction,
/// unless the caller opened one). One answer per operation, in order.
pub fn apply(conn: &mut PgConnection, operations: &[Operation]) -> Result<Vec<Answer>, ApiError> {
    Ok(apply_counted(conn, operations)?.answers)
}

/// A batch's answers, and its tallies: the tokens of lapsed grants it
/// expired (a spend or a removal lapsing them on access, a reservation's
/// rest going back to a lapsed grant), for
/// `token_billing_tokens_total{movement="grant_expired"}`.
pub struct Applied {
    pub answers: Vec<Answer>,
    pub grant_expired: i64,
    /// Tokens top-up rules credited in the batch's transaction
    /// (`token_billing_tokens_total{movement="credited"}`).
    pub topup_credited: i64,
}

/// [`apply`], with the batch's tallies.
pub fn apply_counted(
    conn: &mut PgConnection,
    operations: &[Operation],
) -> Result<Applied, ApiError> {
    let requests: Vec<Request> = operations.iter().map(Request::of).collect();
    let rows: Vec<Row> = prepared_static::<ApplyStatement>()
        .bind::<Array<EngineRequest>, _>(&requests)
        .load(conn)?;
    // Position 0 (first, by the ORDER BY): the batch's tallies.
    let (lapses, rows): (Vec<Row>, Vec<Row>) =
        rows.into_iter().partition(|row| row.op_position == 0);
    let tally = |name: &str| -> i64 {
        lapses
            .iter()
            .filter_map(|row| row.detail.as_ref()?.get(name)?.as_i64())
            .sum()
    };
    let (grant_expired, topup_credited) = (tally("grant_expired"), tally("topup_credited"));
    if rows.len() != operations.len()
        || rows
            .iter()
            .enumerate()
            .any(|(index, row)| usize::try_from(row.op_position) != Ok(index + 1))
    {
        return Err(ApiError::Internal(format!(
            "the engine answered {} of {} operations",
            rows.len(),
            operations.len()
        )));
    }
    let answers = rows
        .into_iter()
        .map(|row| {
            Ok(Answer {
                outcome: Outcome::parse(&row.outcome)?,
                detail: row.detail.unwrap_or(Value::Null),
                object: row.object,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Applied {
        answers,
        grant_expired,
        topup_credited,
    })
}

/// One operation alone (a batch of one).
pub fn apply_one(conn: &mut PgConnection, operation: Operation) -> Result<Answer, ApiError> {
    apply(conn, std::slice::from_ref(&operation))?
        .pop()
        .ok_or_else(|| ApiError::Internal("the engine answered nothing".into()))
}
