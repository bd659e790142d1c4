//! The engine's contract for generation jobs: the validated request it
//! creates a job from (`engine_spend`), and the job as it answers it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::types::{draws_of, sha256, AccountId, Draw, RequestId};
use crate::config::{JOB_PARAMS_DEPTH_MAX, JOB_PARAMS_MAX_BYTES};
use crate::db::models::JobRow;
use crate::db::states::{JobStatus, ReservationState};
use crate::error::ApiError;

/// A validated job request: a known kind and an object of bounded size.
#[derive(Clone, Debug)]
pub struct JobRequest {
    pub request_id: RequestId,
    pub kind: String,
    pub cost: i64,
    pub params: Value,
}

impl JobRequest {
    pub fn parse(
        request_id: RequestId,
        kind: String,
        params: Value,
        prices: &crate::config::PriceList,
    ) -> Result<JobRequest, ApiError> {
        let cost = *prices.get(&kind).ok_or_else(|| {
            let known: Vec<&str> = prices.keys().map(String::as_str).collect();
            ApiError::InvalidRequest(format!(
                "unknown job kind {kind:?}; known kinds: {}",
                known.join(", ")
            ))
        })?;
        if !params.is_object() {
            return Err(ApiError::InvalidRequest(
                "params must be a JSON object".into(),
            ));
        }
        let size = serde_json::to_vec(&params).map_or(usize::MAX, |bytes| bytes.len());
        if size > JOB_PARAMS_MAX_BYTES {
            return Err(ApiError::InvalidRequest(format!(
                "params is {size} bytes; at most {JOB_PARAMS_MAX_BYTES} are accepted"
            )));
        }
        if has_nul(&params) {
            // PostgreSQL's jsonb cannot store U+0000; refused, not a 500.
            return Err(ApiError::InvalidRequest(
                "params must not contain the character U+0000 (in a key or a string)".into(),
            ));
        }
        if depth(&params) > JOB_PARAMS_DEPTH_MAX {
            return Err(ApiError::InvalidRequest(format!(
                "params nests deeper than {JOB_PARAMS_DEPTH_MAX} levels"
            )));
        }
        Ok(JobRequest {
            request_id,
            kind,
            cost,
            params,
        })
    }

    /// SHA-256 of the canonical request: keys sorted at every depth, no
    /// whitespace, so the same request hashes the same however it was sent.
    pub fn hash(&self) -> [u8; 32] {
        let mut canonical = String::new();
        write_canonical(
            &serde_json::json!({"kind": self.kind, "params": self.params}),
            &mut canonical,
        );
        sha256(canonical.as_bytes())
    }
}

/// Whether any key or string in `value` holds U+0000.
fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || has_nul(value)),
        _ => false,
    }
}

/// Nesting depth of arrays and objects (a scalar is 0).
fn depth(value: &Value) -> usize {
    match value {
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A job as the engine returns it (`engine_job_json`): the row without
/// its hash, and its reservation's state and expiry.
#[derive(Deserialize)]
pub struct JobJson {
    id: Uuid,
    account_id: Uuid,
    request_id: Uuid,
    kind: String,
    cost: i64,
    status: JobStatus,
    reservation_id: Uuid,
    attempts: i32,
    result: Option<Value>,
    error: Option<Value>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    reservation_state: ReservationState,
    reservation_expires_at: DateTime<Utc>,
    reservation_draws: Value,
}

impl JobJson {
    pub fn into_view(self) -> JobView {
        JobView {
            job_id: self.id,
            request_id: RequestId(self.request_id),
            account_id: AccountId(self.account_id),
            kind: self.kind,
            status: self.status,
            cost: self.cost,
            attempts: self.attempts,
            reservation: JobReservation {
                reservation_id: self.reservation_id,
                state: self.reservation_state,
                expires_at: self.reservation_expires_at,
                draws: draws_of(&self.reservation_draws),
            },
            result: self.result,
            error: self.error,
            created_at: self.created_at,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
        }
    }
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct JobReservation {
    pub reservation_id: Uuid,
    /// `held`, `committed`, `released` or `expired`.
    #[schema(value_type = String, example = "held")]
    pub state: ReservationState,
    pub expires_at: DateTime<Utc>,
    /// The grants its tokens were drawn from, in draw order.
    pub draws: Vec<Draw>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct JobView {
    pub job_id: Uuid,
    pub request_id: RequestId,
    pub account_id: AccountId,
    pub kind: String,
    /// `queued`, `running`, `succeeded` or `failed`.
    #[schema(value_type = String, example = "queued")]
    pub status: JobStatus,
    pub cost: i64,
    pub attempts: i32,
    pub reservation: JobReservation,
    /// The provider's result once `succeeded`.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// Why the job failed, once `failed`.
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl JobView {
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// A job row with its reservation's state, expiry and draws.
    pub fn from_row(job: JobRow, reservation: (ReservationState, DateTime<Utc>, Value)) -> JobView {
        JobView {
            job_id: job.id,
            request_id: RequestId(job.request_id),
            account_id: AccountId(job.account_id),
            kind: job.kind,
            status: job.status,
            cost: job.cost,
            attempts: job.attempts,
            reservation: JobReservation {
                reservation_id: job.reservation_id,
                state: reservation.0,
                expires_at: reservation.1,
                draws: draws_of(&reservation.2),
            },
            result: job.result,
            error: job.error,
            created_at: job.created_at,
            updated_at: job.updated_at,
            finished_at: job.finished_at,
        }
    }
}
