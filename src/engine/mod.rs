//! The money engine's Rust side. Every token movement is decided and
//! written by the SQL functions of the `money_engine` migration (one
//! function per rule); this module only builds operations, sends them, and
//! reads the outcome of each.
//!
//! - [`apply`] sends a batch of operations on any accounts to
//!   `engine_apply` in one statement: one transaction, one WAL flush,
//!   accounts locked in id order, operations applied in order as if one by
//!   one. A lone request is a batch of one; the coalescer
//!   (`crate::coalesce`) makes bigger batches of concurrent requests.
//! - the worker (`domain::job_leases`) and the reaper (`domain::reaper`)
//!   call the engine's other entry points (fenced job finish, heartbeat,
//!   expiry, fix-ups), which reach the same rule functions.
//!
//! The outcome of each operation comes out of the code that decided it:
//! there is no second read to guess why something was refused.

mod outcome;

use diesel::prelude::*;
use diesel::sql_types::{Integer, Jsonb, Nullable, Text};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::db::prepared;
use crate::domain::api_keys::Credentials;
use crate::domain::jobs::JobRequest;
use crate::domain::types::{
    AccountId, ExternalRef, Note, Reason, RequestId, ReservationId, SignedTokens, Tokens,
    TtlSeconds,
};
use crate::error::ApiError;

pub use outcome::{Answer, Outcome, Replay};

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
    /// Spend `amount` (default: all held); the rest goes back.
    Commit {
        reservation: ReservationId,
        amount: Option<Tokens>,
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
    Credit {
        amount: Tokens,
        external_ref: ExternalRef,
        note: Option<Note>,
    },
    Adjust {
        amount: SignedTokens,
        reason: Reason,
        external_ref: ExternalRef,
    },
}

/// Who asks: a presented key the engine verifies in the same statement
/// (spending endpoints), or a caller the service has already authorised
/// (admin endpoints, workers, the reaper) with its ledger actor, or an
/// authorised HTTP request with its request id (the audit event's
/// `request_id` of a credit or an adjustment).
#[derive(Clone, Debug)]
pub enum Authority {
    Key(Credentials),
    Verified {
        actor: String,
    },
    Request {
        actor: String,
        request_id: Option<String>,
    },
}

impl Authority {
    fn actor(&self) -> String {
        match self {
            Authority::Key(credentials) => credentials.actor(),
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
    /// The operation as `engine_apply` reads it. New ids are chosen here.
    pub fn to_json(&self) -> Value {
        let mut object = match &self.op {
            Op::Reserve {
                request_id,
                amount,
                ttl_seconds,
                effective_ttl_seconds,
            } => json!({
                "op": "reserve",
                "request_id": request_id.0,
                "amount": amount.get(),
                "requested_ttl": ttl_seconds.map(TtlSeconds::get),
                "ttl": effective_ttl_seconds,
                "reservation_id": Uuid::now_v7(),
            }),
            Op::Commit {
                reservation,
                amount,
            } => json!({
                "op": "commit",
                "reservation_id": reservation.0,
                "amount": amount.map(Tokens::get),
            }),
            Op::Release { reservation } => {
                json!({"op": "release", "reservation_id": reservation.0})
            }
            Op::Extend {
                reservation,
                ttl_seconds,
            } => json!({
                "op": "extend",
                "reservation_id": reservation.0,
                "ttl": ttl_seconds.get(),
            }),
            Op::CreateJob {
                request,
                ttl_seconds,
            } => json!({
                "op": "create_job",
                "request_id": request.request_id.0,
                "job_id": Uuid::now_v7(),
                "reservation_id": Uuid::now_v7(),
                "hash": hex::encode(request.hash()),
                "kind": request.kind,
                "params": request.params,
                "cost": request.cost,
                "ttl": ttl_seconds,
            }),
            Op::Credit {
                amount,
                external_ref,
                note,
            } => json!({
                "op": "credit",
                "credit_id": Uuid::now_v7(),
                "amount": amount.get(),
                "external_ref": external_ref.as_str(),
                "note": note.as_ref().map(Note::as_str),
            }),
            Op::Adjust {
                amount,
                reason,
                external_ref,
            } => json!({
                "op": "adjust",
                "adjustment_id": Uuid::now_v7(),
                "amount": amount.get(),
                "reason": reason.as_str(),
                "external_ref": external_ref.as_str(),
            }),
        };
        object["account"] = json!(self.account.0);
        object["actor"] = json!(self.authority.actor());
        if let Authority::Request {
            request_id: Some(request_id),
            ..
        } = &self.authority
        {
            object["http_request_id"] = json!(request_id);
        }
        if let Authority::Key(credentials) = &self.authority {
            object["key"] = match credentials {
                Credentials::Bootstrap => json!({"bootstrap": true}),
                Credentials::Key { id, secret_hash } => {
                    json!({"id": id, "secret_hash": hex::encode(secret_hash)})
                }
            };
        }
        object
    }

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

/// The one statement every batch is: `$1` is the JSON array of operations.
pub const APPLY_SQL: &str =
    "SELECT op_position, outcome, detail, object FROM engine_apply($1) ORDER BY op_position";

/// Applies `operations` in order, in one statement (its own transaction,
/// unless the caller opened one). One answer per operation, in order.
pub fn apply(conn: &mut PgConnection, operations: &[Operation]) -> Result<Vec<Answer>, ApiError> {
    let batch = Value::Array(operations.iter().map(Operation::to_json).collect());
    let rows: Vec<Row> = prepared(APPLY_SQL).bind::<Jsonb, _>(batch).load(conn)?;
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
    rows.into_iter()
        .map(|row| {
            Ok(Answer {
                outcome: Outcome::parse(&row.outcome)?,
                detail: row.detail.unwrap_or(Value::Null),
                object: row.object,
            })
        })
        .collect()
}

/// One operation alone (a batch of one).
pub fn apply_one(conn: &mut PgConnection, operation: Operation) -> Result<Answer, ApiError> {
    apply(conn, std::slice::from_ref(&operation))?
        .pop()
        .ok_or_else(|| ApiError::Internal("the engine answered nothing".into()))
}
