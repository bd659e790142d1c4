//! The outcome of one engine operation, and what it means for the API.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::credits::{AdjustmentView, CreditView};
use super::jobs::JobView;
use crate::db::models::ReservationRow;
use crate::error::ApiError;

use super::{Op, Operation};

/// Every outcome the engine's rules can decide. The text is the engine's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replayed,
    Committed,
    Released,
    Expired,
    Extended,
    /// An extension capped at the earliest expiry of the grants the
    /// reservation drew from (grant expiry dominates extension).
    ExtendedCapped,
    IdempotencyKeyReused,
    NotFound,
    Unauthorized,
    Forbidden,
    AccountSuspended,
    InsufficientTokens,
    KeyBudgetExhausted,
    TooManyActiveReservations,
    NotHeld,
    OwnedByJob,
    AmountExceedsHeld,
    NotDue,
    /// A fenced job write did what it asked.
    Done,
    /// The job's lease moved on: nothing was written.
    LeaseLost,
    /// The job's reservation is no longer held: the job failed.
    ReservationLost,
    /// A credit's or adjustment's `expires_at` is not in the future.
    ExpiryPassed,
}

const OUTCOMES: [(Outcome, &str); 23] = [
    (Outcome::Created, "created"),
    (Outcome::Replayed, "replayed"),
    (Outcome::Committed, "committed"),
    (Outcome::Released, "released"),
    (Outcome::Expired, "expired"),
    (Outcome::Extended, "extended"),
    (Outcome::ExtendedCapped, "extended_capped"),
    (Outcome::IdempotencyKeyReused, "idempotency_key_reused"),
    (Outcome::NotFound, "not_found"),
    (Outcome::Unauthorized, "unauthorized"),
    (Outcome::Forbidden, "forbidden"),
    (Outcome::AccountSuspended, "account_suspended"),
    (Outcome::InsufficientTokens, "insufficient_tokens"),
    (Outcome::KeyBudgetExhausted, "key_budget_exhausted"),
    (
        Outcome::TooManyActiveReservations,
        "too_many_active_reservations",
    ),
    (Outcome::NotHeld, "not_held"),
    (Outcome::OwnedByJob, "owned_by_job"),
    (Outcome::AmountExceedsHeld, "amount_exceeds_held"),
    (Outcome::NotDue, "not_due"),
    (Outcome::Done, "done"),
    (Outcome::LeaseLost, "lease_lost"),
    (Outcome::ReservationLost, "reservation_lost"),
    (Outcome::ExpiryPassed, "expiry_passed"),
];

impl Outcome {
    pub fn parse(text: &str) -> Result<Outcome, ApiError> {
        OUTCOMES
            .iter()
            .find(|(_, name)| *name == text)
            .map(|(outcome, _)| *outcome)
            .ok_or_else(|| ApiError::Internal(format!("unknown engine outcome {text:?}")))
    }

    pub fn as_str(self) -> &'static str {
        OUTCOMES
            .iter()
            .find(|(outcome, _)| *outcome == self)
            .map_or("unknown", |(_, name)| name)
    }

    /// Whether the operation did what it asked (now or, replayed, before).
    pub fn succeeded(self) -> bool {
        matches!(
            self,
            Outcome::Created
                | Outcome::Replayed
                | Outcome::Committed
                | Outcome::Released
                | Outcome::Expired
                | Outcome::Extended
                | Outcome::ExtendedCapped
        )
    }
}

/// Whether an answer comes from this request or an identical earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    Created,
    Replayed,
}

/// The engine's answer to one operation.
#[derive(Clone, Debug)]
pub struct Answer {
    pub outcome: Outcome,
    /// Facts of a refusal: balances, the limit, the state found.
    pub detail: Value,
    /// The reservation, job, or credit/adjustment with its ledger entry.
    pub object: Option<Value>,
}

/// An object the engine wrote (an answer, or a resource as its SQL view
/// functions show it), read into its Rust type; `what` names it in the
/// internal error when the two disagree.
pub fn decode<T: DeserializeOwned>(value: Value, what: &str) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|error| ApiError::Internal(format!("{what}: {error}")))
}

impl Answer {
    fn number(&self, field: &str) -> i64 {
        self.detail.get(field).and_then(Value::as_i64).unwrap_or(0)
    }

    /// The API error of a refusal (`None` when the operation succeeded).
    pub fn error(&self, operation: &Operation) -> Option<ApiError> {
        let reused = |what: &str| {
            let key = match &operation.op {
                Op::Reserve { request_id, .. } => format!("request_id {request_id}"),
                Op::CreateJob { request, .. } => format!("request_id {}", request.request_id),
                Op::Credit { external_ref, .. } | Op::Adjust { external_ref, .. } => {
                    format!("external_ref {:?}", external_ref.as_str())
                }
                _ => "this key".to_owned(),
            };
            ApiError::IdempotencyKeyReused(format!("{key} was already used for a different {what}"))
        };
        Some(match self.outcome {
            outcome if outcome.succeeded() => return None,
            // A credit's or adjustment's reference names one booking of
            // either kind: the refusal names it.
            Outcome::IdempotencyKeyReused if self.detail.get("existing").is_some() => {
                let existing = self.detail["existing"].clone();
                let reference = match &operation.op {
                    Op::Credit { external_ref, .. } | Op::Adjust { external_ref, .. } => {
                        external_ref.as_str().to_owned()
                    }
                    _ => String::new(),
                };
                let field = |name: &str| {
                    existing
                        .get(name)
                        .map(|value| value.as_str().map_or(value.to_string(), str::to_owned))
                        .unwrap_or_default()
                };
                ApiError::ExternalRefReused {
                    message: format!(
                        "external_ref {reference:?} is already booked as {} {} on account {} \
                         (ledger entry {}); credits and adjustments share one namespace of \
                         references, and a retry must repeat the first request exactly",
                        field("kind"),
                        field("id"),
                        field("account_id"),
                        field("entry_id"),
                    ),
                    existing,
                }
            }
            Outcome::IdempotencyKeyReused => reused(match &operation.op {
                Op::CreateJob { .. } => "job",
                Op::Credit { .. } => "credit",
                Op::Adjust { .. } => "adjustment",
                _ => "reservation",
            }),
            Outcome::NotFound => {
                ApiError::NotFound(match self.detail.get("what").and_then(Value::as_str) {
                    Some("reservation") => "reservation",
                    _ => "account",
                })
            }
            Outcome::Unauthorized => ApiError::Unauthorized,
            Outcome::Forbidden => ApiError::Forbidden,
            Outcome::AccountSuspended => ApiError::AccountSuspended,
            Outcome::InsufficientTokens => ApiError::InsufficientTokens {
                available: self.number("available"),
                reserved: self.number("reserved"),
            },
            Outcome::KeyBudgetExhausted => ApiError::KeyBudgetExhausted {
                remaining: self.number("remaining"),
                resets_at: self
                    .detail
                    .get("resets_at")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                budget_tokens: self.number("budget_tokens"),
                budget_period: self
                    .detail
                    .get("budget_period")
                    .and_then(Value::as_str)
                    .unwrap_or("period")
                    .to_owned(),
            },
            Outcome::TooManyActiveReservations => ApiError::TooManyActiveReservations {
                limit: i32::try_from(self.number("limit")).unwrap_or(i32::MAX),
            },
            Outcome::NotHeld => ApiError::ReservationNotHeld {
                state: self
                    .detail
                    .get("state")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
            },
            Outcome::OwnedByJob => ApiError::ReservationOwnedByJob,
            Outcome::ExpiryPassed => ApiError::InvalidRequest(format!(
                "expires_at must lie in the future, got {}",
                self.detail
                    .get("expires_at")
                    .and_then(Value::as_str)
                    .unwrap_or("an instant that has passed")
            )),
            Outcome::AmountExceedsHeld => ApiError::InvalidRequest(format!(
                "amount {} exceeds the {} tokens held by this reservation",
                self.number("amount"),
                self.number("held")
            )),
            _ => ApiError::Internal(format!("unexpected engine outcome {:?}", self.outcome)),
        })
    }

    fn replay(&self) -> Replay {
        if self.outcome == Outcome::Replayed {
            Replay::Replayed
        } else {
            Replay::Created
        }
    }

    /// The engine's object (`field`: one field of it), moved out of the
    /// answer: it is decoded once, never copied.
    fn into_object(self, field: Option<&str>) -> Result<Value, ApiError> {
        let object = self
            .object
            .ok_or_else(|| ApiError::Internal("the engine returned no object".into()))?;
        Ok(match (field, object) {
            (Some(field), Value::Object(mut fields)) => fields.remove(field).unwrap_or(Value::Null),
            (Some(_), _) => Value::Null,
            (None, object) => object,
        })
    }

    /// A reserve, commit, release or extend: the reservation, or the error.
    pub fn into_reservation(
        self,
        operation: &Operation,
    ) -> Result<(ReservationRow, Replay), ApiError> {
        if let Some(error) = self.error(operation) {
            return Err(error);
        }
        let replay = self.replay();
        Ok((decode(self.into_object(None)?, "engine object")?, replay))
    }

    /// A job creation: the job, or the error.
    pub fn into_job(self, operation: &Operation) -> Result<(JobView, Replay), ApiError> {
        if let Some(error) = self.error(operation) {
            return Err(error);
        }
        let replay = self.replay();
        Ok((decode(self.into_object(None)?, "engine object")?, replay))
    }

    /// A credit as the API shows it (`engine_external_json`), or the error.
    pub fn into_credit(self, operation: &Operation) -> Result<(CreditView, Replay), ApiError> {
        self.into_external(operation, "credit")
    }

    /// An adjustment as the API shows it (`engine_external_json`), or the
    /// error.
    pub fn into_adjustment(
        self,
        operation: &Operation,
    ) -> Result<(AdjustmentView, Replay), ApiError> {
        self.into_external(operation, "adjustment")
    }

    fn into_external<T: DeserializeOwned>(
        self,
        operation: &Operation,
        field: &str,
    ) -> Result<(T, Replay), ApiError> {
        if let Some(error) = self.error(operation) {
            return Err(error);
        }
        let replay = self.replay();
        Ok((
            decode(self.into_object(Some(field))?, "engine object")?,
            replay,
        ))
    }
}
