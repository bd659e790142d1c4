//! The engine's contract for generation jobs: the validated request it
//! creates a job from (`engine_spend`), and the job as it answers it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::types::{sha256, AccountId, Draw, RequestId};
use crate::config::{JOB_PARAMS_DEPTH_MAX, JOB_PARAMS_MAX_BYTES};
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

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobReservation {
    pub reservation_id: Uuid,
    /// `held`, `committed`, `released` or `expired`.
    #[schema(value_type = String, example = "held")]
    pub state: ReservationState,
    #[serde(with = "crate::time::micros")]
    pub expires_at: DateTime<Utc>,
    /// The grants its tokens were drawn from, in draw order.
    pub draws: Vec<Draw>,
}

/// A job as the API and the job events show it: the engine writes it
/// (`engine_job_view`, src/engine/sql/30_spend.sql), the API reads it from
/// there and answers with it as it is.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
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
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros")]
    pub updated_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros_option")]
    pub finished_at: Option<DateTime<Utc>>,
}

impl JobView {
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}
