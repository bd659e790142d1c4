//! One error type for the whole service, rendered once as RFC 9457
//! `application/problem+json` with a stable `code`.
//!
//! Rules: a 4xx tells the client exactly what to fix; a 5xx never leaks
//! internals (the cause is logged, not sent); a database that cannot be
//! reached is a 503 `unavailable`, meaning nothing was changed.
//!
//! `Problem` and `ProblemCode` describe that body in the OpenAPI document;
//! the unit tests below keep them equal to what `error_response` writes.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::{json, Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("missing or unknown API key")]
    Unauthorized,
    #[error("the API key's scope does not allow this action")]
    Forbidden,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("this path does not accept this method; it accepts {}", allowed.join(", "))]
    MethodNotAllowed { allowed: Vec<&'static str> },
    #[error("insufficient tokens")]
    InsufficientTokens { available: i64, reserved: i64 },
    /// The presented kiosk key's budget (`budget_tokens` per
    /// `budget_period`) has fewer than the asked tokens left.
    #[error(
        "this kiosk key's budget of {budget_tokens} tokens per {budget_period} has {remaining} \
         left{}: an admin raises it with PATCH /v1/api-keys/{{key_id}}",
        resets_at.as_deref().map(|at| format!(" until {at}")).unwrap_or_default()
    )]
    KeyBudgetExhausted {
        remaining: i64,
        resets_at: Option<String>,
        budget_tokens: i64,
        budget_period: String,
    },
    #[error("reservation is not held (state {state})")]
    ReservationNotHeld { state: String },
    #[error("this reservation belongs to a generation job; its worker resolves it")]
    ReservationOwnedByJob,
    #[error("account is suspended")]
    AccountSuspended,
    #[error("request body is larger than {limit_bytes} bytes")]
    PayloadTooLarge { limit_bytes: usize },
    #[error("idempotency key reused with a different request: {0}")]
    IdempotencyKeyReused(String),
    /// A credit's or adjustment's `external_ref` that already names another
    /// booking (the other kind, another account or another body): the
    /// same code, and `existing` names that booking.
    #[error("{message}")]
    ExternalRefReused { message: String, existing: Value },
    #[error("too many requests for this API key; retry in {retry_after_seconds} s")]
    RateLimited { retry_after_seconds: u64 },
    #[error(
        "too many failed authentications from this client address; retry in \
         {retry_after_seconds} s (requests with a key this service has verified are not blocked)"
    )]
    AddressThrottled { retry_after_seconds: u64 },
    #[error(
        "the account holds its limit of {limit} active reservations (max_active_reservations): \
         commit or release one first, or an admin raises max_active_reservations with PATCH \
         /v1/accounts/{{account_id}} (about two per booth)"
    )]
    TooManyActiveReservations { limit: i32 },
    #[error(
        "the instant {at} is not closed yet: a transaction that began before it is still \
         running and may still write ledger entries at or before it; retry in \
         {retry_after_seconds} s"
    )]
    InstantNotClosed {
        at: String,
        retry_after_seconds: u64,
    },
    /// A second threshold top-up rule on an account (one per account; its
    /// state lives on the account).
    #[error(
        "this account has a threshold top-up rule already ({rule_id}); change it with PATCH, or \
         delete it first"
    )]
    ThresholdRuleExists { rule_id: uuid::Uuid },
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::InsufficientTokens { .. } => "insufficient_tokens",
            ApiError::KeyBudgetExhausted { .. } => "key_budget_exhausted",
            ApiError::ReservationNotHeld { .. } => "reservation_not_held",
            ApiError::ReservationOwnedByJob => "reservation_owned_by_job",
            ApiError::AccountSuspended => "account_suspended",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::IdempotencyKeyReused(_) | ApiError::ExternalRefReused { .. } => {
                "idempotency_key_reused"
            }
            ApiError::TooManyActiveReservations { .. } => "too_many_active_reservations",
            ApiError::InstantNotClosed { .. } => "instant_not_closed",
            ApiError::ThresholdRuleExists { .. } => "threshold_rule_exists",
            ApiError::RateLimited { .. } | ApiError::AddressThrottled { .. } => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "Invalid request",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::Forbidden => "Forbidden",
            ApiError::NotFound(_) => "Not found",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::InsufficientTokens { .. } => "Insufficient tokens",
            ApiError::KeyBudgetExhausted { .. } => "Key budget exhausted",
            ApiError::ReservationNotHeld { .. } => "Reservation not held",
            ApiError::ReservationOwnedByJob => "Reservation owned by a job",
            ApiError::AccountSuspended => "Account suspended",
            ApiError::PayloadTooLarge { .. } => "Payload too large",
            ApiError::IdempotencyKeyReused(_) | ApiError::ExternalRefReused { .. } => {
                "Idempotency key reused"
            }
            ApiError::TooManyActiveReservations { .. } => "Too many active reservations",
            ApiError::InstantNotClosed { .. } => "Instant not closed",
            ApiError::ThresholdRuleExists { .. } => "Threshold rule exists",
            ApiError::RateLimited { .. } | ApiError::AddressThrottled { .. } => "Rate limited",
            ApiError::Unavailable(_) => "Service unavailable",
            ApiError::Internal(_) => "Internal server error",
        }
    }

    /// What the client reads. Internal causes stay in the logs.
    fn detail(&self) -> String {
        match self {
            ApiError::InsufficientTokens {
                available,
                reserved,
            } if *reserved > 0 => format!(
                "not enough available tokens ({available} available); {reserved} tokens are \
                 reserved, so another kiosk of this account may be using tokens right now"
            ),
            ApiError::InsufficientTokens { available, .. } => {
                format!("not enough available tokens ({available} available)")
            }
            ApiError::Unavailable(_) => {
                "the database is unreachable, switching to a new primary or unable to write its \
                 files (a full disk); retry later: a retry \
                 of the same request (same request_id, external_ref or Idempotency-Key) is \
                 answered as the first attempt would have been and never applies anything twice"
                    .to_owned()
            }
            ApiError::Internal(_) => "an internal error occurred; nothing was changed".to_owned(),
            other => other.to_string(),
        }
    }

    /// One error of every variant (the OpenAPI document's problem shapes are
    /// read from them). The match in `variant_is_listed` stops
    /// compiling when a variant is added, as a reminder to list it here.
    pub fn one_of_each() -> Vec<ApiError> {
        let all = vec![
            ApiError::InvalidRequest("x".into()),
            ApiError::Unauthorized,
            ApiError::Forbidden,
            ApiError::NotFound("account"),
            ApiError::MethodNotAllowed {
                allowed: vec!["GET"],
            },
            ApiError::InsufficientTokens {
                available: 1,
                reserved: 2,
            },
            ApiError::KeyBudgetExhausted {
                remaining: 0,
                resets_at: Some("x".into()),
                budget_tokens: 10,
                budget_period: "day".into(),
            },
            ApiError::ReservationNotHeld {
                state: "committed".into(),
            },
            ApiError::ReservationOwnedByJob,
            ApiError::AccountSuspended,
            ApiError::PayloadTooLarge { limit_bytes: 10 },
            ApiError::IdempotencyKeyReused("x".into()),
            ApiError::ExternalRefReused {
                message: "x".into(),
                existing: json!({"kind": "credit"}),
            },
            ApiError::TooManyActiveReservations { limit: 3 },
            ApiError::InstantNotClosed {
                at: "x".into(),
                retry_after_seconds: 1,
            },
            ApiError::ThresholdRuleExists {
                rule_id: uuid::Uuid::nil(),
            },
            ApiError::RateLimited {
                retry_after_seconds: 1,
            },
            ApiError::AddressThrottled {
                retry_after_seconds: 1,
            },
            ApiError::Unavailable("x".into()),
            ApiError::Internal("x".into()),
        ];
        for error in &all {
            Self::variant_is_listed(error);
        }
        all
    }

    fn variant_is_listed(error: &ApiError) {
        match error {
            ApiError::InvalidRequest(_)
            | ApiError::Unauthorized
            | ApiError::Forbidden
            | ApiError::NotFound(_)
            | ApiError::MethodNotAllowed { .. }
            | ApiError::InsufficientTokens { .. }
            | ApiError::KeyBudgetExhausted { .. }
            | ApiError::ReservationNotHeld { .. }
            | ApiError::ReservationOwnedByJob
            | ApiError::AccountSuspended
            | ApiError::PayloadTooLarge { .. }
            | ApiError::IdempotencyKeyReused(_)
            | ApiError::ExternalRefReused { .. }
            | ApiError::TooManyActiveReservations { .. }
            | ApiError::InstantNotClosed { .. }
            | ApiError::ThresholdRuleExists { .. }
            | ApiError::RateLimited { .. }
            | ApiError::AddressThrottled { .. }
            | ApiError::Unavailable(_)
            | ApiError::Internal(_) => {}
        }
    }

    /// Each problem the service can answer: (status, `code`, the extension
    /// members it carries), one per variant, as `error_response` writes them.
    pub fn problem_shapes() -> Vec<(u16, &'static str, Vec<String>)> {
        ApiError::one_of_each()
            .iter()
            .map(|error| {
                (
                    error.status_code().as_u16(),
                    error.code(),
                    error.extensions().keys().cloned().collect(),
                )
            })
            .collect()
    }

    fn extensions(&self) -> Map<String, Value> {
        let mut extra = Map::new();
        match self {
            ApiError::InsufficientTokens {
                available,
                reserved,
            } => {
                extra.insert("available".into(), json!(available));
                extra.insert("reserved".into(), json!(reserved));
            }
            ApiError::KeyBudgetExhausted {
                remaining,
                resets_at,
                ..
            } => {
                extra.insert("remaining".into(), json!(remaining));
                extra.insert("resets_at".into(), json!(resets_at));
            }
            ApiError::ReservationNotHeld { state } => {
                extra.insert("state".into(), json!(state));
            }
            ApiError::TooManyActiveReservations { limit } => {
                extra.insert("max_active_reservations".into(), json!(limit));
            }
            ApiError::ExternalRefReused { existing, .. } => {
                extra.insert("existing".into(), existing.clone());
            }
            ApiError::ThresholdRuleExists { rule_id } => {
                extra.insert("rule_id".into(), json!(rule_id));
            }
            _ => {}
        }
        extra
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::InsufficientTokens { .. } | ApiError::KeyBudgetExhausted { .. } => {
                StatusCode::PAYMENT_REQUIRED
            }
            ApiError::ReservationNotHeld { .. }
            | ApiError::ReservationOwnedByJob
            | ApiError::AccountSuspended
            | ApiError::InstantNotClosed { .. }
            | ApiError::ThresholdRuleExists { .. } => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::IdempotencyKeyReused(_) | ApiError::ExternalRefReused { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::TooManyActiveReservations { .. }
            | ApiError::RateLimited { .. }
            | ApiError::AddressThrottled { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if status.is_server_error() {
            tracing::error!(error = ?self, "request failed");
        }
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("urn:token-billing:problem:{}", self.code())),
        );
        body.insert("title".into(), json!(self.title()));
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), json!(self.detail()));
        body.insert("code".into(), json!(self.code()));
        body.extend(self.extensions());
        if let Some(request_id) = crate::telemetry::current_request_id() {
            body.insert("request_id".into(), json!(request_id));
        }
        let mut response = HttpResponse::build(status);
        response.insert_header((header::CONTENT_TYPE, "application/problem+json"));
        match self {
            ApiError::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            // Held reservations of the other booths are settled within
            // seconds (a job's) or minutes (a TTL): try again shortly.
            ApiError::Unavailable(_) | ApiError::TooManyActiveReservations { .. } => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            ApiError::MethodNotAllowed { allowed } => {
                response.insert_header((header::ALLOW, allowed.join(", ")));
            }
            ApiError::RateLimited {
                retry_after_seconds,
            }
            | ApiError::AddressThrottled {
                retry_after_seconds,
            }
            | ApiError::InstantNotClosed {
                retry_after_seconds,
                ..
            } => {
                response.insert_header((header::RETRY_AFTER, retry_after_seconds.to_string()));
            }
            _ => {}
        }
        response.body(Value::Object(body).to_string())
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(error: diesel::result::Error) -> Self {
        use diesel::result::{DatabaseErrorKind, Error};
        match error {
            Error::NotFound => ApiError::NotFound("resource"),
            // The connection is dead (its server went away: a crash, a
            // restart, a failover) or points at a server that no longer
            // takes writes (a demoted primary). It is marked so the pool
            // discards it; the next connection goes to the primary of the
            // moment (`DATABASE_URL`'s `target_session_attrs=read-write`).
            Error::DatabaseError(
                DatabaseErrorKind::ClosedConnection
                | DatabaseErrorKind::UnableToSendCommand
                | DatabaseErrorKind::ReadOnlyTransaction,
                info,
            ) => {
                connection_lost();
                ApiError::Unavailable(info.message().to_owned())
            }
            // A deadlock victim or a serialization failure was rolled back:
            // nothing was changed and a retry is safe.
            Error::DatabaseError(DatabaseErrorKind::SerializationFailure, info) => {
                ApiError::Unavailable(info.message().to_owned())
            }
            Error::DatabaseError(DatabaseErrorKind::Unknown, ref info)
                if is_connection_lost_message(info.message()) =>
            {
                connection_lost();
                ApiError::Unavailable(info.message().to_owned())
            }
            // Binding the engine's composite type (`engine_request`) looks
            // its OID up on a connection's first use; on a connection that
            // died, that lookup fails and diesel says only that it found no
            // such type. The engine's types are installed before the
            // service serves (`engine::install`), so it means the
            // connection is gone: a 503 to retry, never a 500 (caught by
            // `failover::lost_connections_answer_503_then_the_pool_reconnects`
            // under load). (diesel's FailedToLookupTypeError is not public:
            // its message is read.)
            Error::SerializationError(ref error)
                if error
                    .to_string()
                    .starts_with("Failed to find a type oid for") =>
            {
                connection_lost();
                ApiError::Unavailable(error.to_string())
            }
            // A statement cancelled by statement_timeout, or a deadlock
            // victim, rolled back: nothing was changed and a retry is safe.
            Error::DatabaseError(DatabaseErrorKind::Unknown, ref info)
                if is_transient_message(info.message()) =>
            {
                ApiError::Unavailable(info.message().to_owned())
            }
            // The server cannot write its files (a full disk or tablespace,
            // a file system gone read-only, an I/O error): the statement was
            // rolled back, the connection is sound, and writes come back
            // when the storage does. Like every "the server takes no writes"
            // state, a 503 to retry, never a 500 a kiosk gives up on.
            Error::DatabaseError(DatabaseErrorKind::Unknown, ref info)
                if is_storage_message(info.message()) =>
            {
                ApiError::Unavailable(info.message().to_owned())
            }
            // COMMIT failed and so did the ROLLBACK after it: what counts is
            // why the commit failed (a lost connection, typically).
            Error::RollbackErrorOnCommit { commit_error, .. } => ApiError::from(*commit_error),
            // A transaction's connection broke under diesel's transaction
            // manager; the pool discards such a connection.
            Error::BrokenTransactionManager => {
                connection_lost();
                ApiError::Unavailable("the connection's transaction state is broken".into())
            }
            other => ApiError::Internal(format!("{other:?}")),
        }
    }
}

/// Messages of a server that went away or is not (yet, or any longer) a
/// primary: libpq's own when the socket breaks, and the server's when it
/// shuts down, crashes, restarts or recovers.
fn is_connection_lost_message(message: &str) -> bool {
    const LOST: [&str; 8] = [
        "terminating connection",
        "server closed the connection",
        "no connection to the server",
        "could not receive data from server",
        "could not send data to server",
        "connection to server",
        "the database system is",
        "read-only transaction",
    ];
    LOST.iter().any(|needle| message.contains(needle))
}

/// Messages of a server that cannot write (or read) its files: the
/// operating system's words for ENOSPC, EDQUOT, EROFS and EIO, which
/// PostgreSQL puts after the file it could not extend, write or open
/// (`could not extend file "…": No space left on device`). The server's
/// `lc_messages` must be English (`C`, the default of `initdb` without a
/// locale, or `en_*`) for these and the other messages here to be read.
fn is_storage_message(message: &str) -> bool {
    const STORAGE: [&str; 4] = [
        "No space left on device",
        "Disk quota exceeded",
        "Read-only file system",
        "Input/output error",
    ];
    STORAGE.iter().any(|needle| message.contains(needle))
}

fn is_transient_message(message: &str) -> bool {
    const TRANSIENT: [&str; 3] = [
        "canceling statement due to statement timeout",
        "deadlock detected",
        "connection",
    ];
    TRANSIENT.iter().any(|needle| message.contains(needle))
}

impl From<r2d2::Error> for ApiError {
    fn from(error: r2d2::Error) -> Self {
        ApiError::Unavailable(error.to_string())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The stable `code` of a problem, one per `ApiError` variant as `code()`
/// spells it. Clients branch on this, never on `title` or `detail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    InsufficientTokens,
    KeyBudgetExhausted,
    ReservationNotHeld,
    ReservationOwnedByJob,
    AccountSuspended,
    PayloadTooLarge,
    IdempotencyKeyReused,
    TooManyActiveReservations,
    InstantNotClosed,
    ThresholdRuleExists,
    RateLimited,
    Unavailable,
    InternalError,
}

/// The body of every error answer (RFC 9457 `application/problem+json`) as
/// `error_response` writes it. The extension members appear only with the
/// codes named on them.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:token-billing:problem:{code}`.
    #[serde(rename = "type")]
    #[schema(example = "urn:token-billing:problem:insufficient_tokens")]
    pub problem_type: String,
    /// A short summary of the kind of problem.
    #[schema(example = "Insufficient tokens")]
    pub title: String,
    /// The HTTP status code of the answer.
    #[schema(example = 402)]
    pub status: u16,
    /// What went wrong with this request and what to fix.
    pub detail: String,
    pub code: ProblemCode,
    /// With `insufficient_tokens`: the tokens that could be reserved.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub available: Option<i64>,
    /// With `insufficient_tokens`: the tokens held by open reservations.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reserved: Option<i64>,
    /// With `key_budget_exhausted`: the tokens the key's budget has left in
    /// its period.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub remaining: Option<i64>,
    /// With `key_budget_exhausted`: when the budget's period ends (RFC
    /// 3339); null for a `total` budget, which never resets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<String>,
    /// With `reservation_not_held`: the reservation's state.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub state: Option<String>,
    /// With `too_many_active_reservations`: the account's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_active_reservations: Option<i32>,
    /// With `idempotency_key_reused` of a credit or adjustment: the booking
    /// that already holds the `external_ref` (credits and adjustments share
    /// one namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub existing: Option<ExistingBooking>,
    /// With `threshold_rule_exists`: the account's threshold top-up rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub rule_id: Option<uuid::Uuid>,
    /// The request's id, as in the `X-Request-Id` header: quote it when
    /// reporting a problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub request_id: Option<String>,
}

/// The booking that holds an `external_ref`: a credit or an adjustment.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ExistingBooking {
    /// `credit` or `adjustment`.
    #[schema(example = "credit")]
    pub kind: String,
    /// The credit's or adjustment's id (`credit_id` / `adjustment_id`).
    pub id: uuid::Uuid,
    pub account_id: uuid::Uuid,
    /// Its (last) ledger entry.
    pub entry_id: Option<i64>,
}

// Connection marks. An error that means "this connection is dead or points
// at a server that cannot take writes" marks the thread that holds the
// connection; the pool (`db::failover`) reads the mark when the connection
// comes back and discards it, and checks every checkout for a while after
// any loss.

thread_local! {
    /// Set when a statement on this thread failed because its connection
    /// is unusable; read (and cleared) when that connection is returned.
    static LOST_ON_THIS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Milliseconds since `EPOCH` of the last loss, plus one (0: none yet).
static LAST_LOSS_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn now_ms() -> u64 {
    let epoch = EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// Records that the connection in use on this thread is unusable (the
/// server went away, or it no longer accepts writes).
pub fn connection_lost() {
    LOST_ON_THIS_THREAD.with(|lost| lost.set(true));
    LAST_LOSS_MS.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
}

/// True when the connection in use on this thread was found unusable
/// (until it is returned to the pool).
pub fn lost_on_this_thread() -> bool {
    LOST_ON_THIS_THREAD.with(std::cell::Cell::get)
}

/// [`lost_on_this_thread`], and clears the mark (the connection is being
/// returned to the pool).
pub fn take_lost_on_this_thread() -> bool {
    LOST_ON_THIS_THREAD.with(std::cell::Cell::take)
}

/// True within `window` of the last [`connection_lost`] on any thread.
pub fn lost_within(window: std::time::Duration) -> bool {
    let last = LAST_LOSS_MS.load(std::sync::atomic::Ordering::Relaxed);
    last != 0 && now_ms().saturating_sub(last) < window.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;
    use utoipa::PartialSchema;

    /// A failover's errors are 503 and mark the connection for discarding;
    /// a bug's are 500 and do not.
    #[test]
    fn connection_class_errors_are_unavailable_and_mark_the_connection() {
        use diesel::result::{DatabaseErrorKind, Error};
        let database =
            |kind, message: &str| Error::DatabaseError(kind, Box::new(message.to_owned()));
        // Each case on a thread of its own: the mark is per thread.
        let classify = |error: Error| {
            std::thread::spawn(move || {
                let api = ApiError::from(error);
                (api, lost_on_this_thread())
            })
            .join()
            .expect("thread")
        };
        let lost = [
            database(
                DatabaseErrorKind::ClosedConnection,
                "server closed the connection unexpectedly",
            ),
            database(
                DatabaseErrorKind::UnableToSendCommand,
                "no connection to the server",
            ),
            database(
                DatabaseErrorKind::ReadOnlyTransaction,
                "cannot execute SELECT in a read-only transaction",
            ),
            database(
                DatabaseErrorKind::Unknown,
                "terminating connection due to administrator command",
            ),
            database(
                DatabaseErrorKind::Unknown,
                "the database system is in recovery mode",
            ),
            Error::RollbackErrorOnCommit {
                rollback_error: Box::new(database(DatabaseErrorKind::UnableToSendCommand, "x")),
                commit_error: Box::new(database(
                    DatabaseErrorKind::ClosedConnection,
                    "server closed the connection unexpectedly",
                )),
            },
            Error::BrokenTransactionManager,
        ];
        for error in lost {
            let text = format!("{error:?}");
            let (api, marked) = classify(error);
            assert!(matches!(api, ApiError::Unavailable(_)), "{text} → {api:?}");
            assert!(marked, "{text} did not mark the connection");
        }
        let (api, marked) = classify(database(
            DatabaseErrorKind::Unknown,
            "canceling statement due to statement timeout",
        ));
        assert!(matches!(api, ApiError::Unavailable(_)) && !marked);
        let (api, marked) = classify(database(DatabaseErrorKind::Unknown, "division by zero"));
        assert!(matches!(api, ApiError::Internal(_)) && !marked, "{api:?}");
    }

    /// A server that cannot write its files answers 503 (retry), not 500,
    /// and the connection stays in the pool: it is sound. The messages are
    /// PostgreSQL 15's.
    #[test]
    fn storage_errors_are_unavailable_and_keep_the_connection() {
        use diesel::result::{DatabaseErrorKind, Error};
        for message in [
            "could not extend file \"pg_tblspc/16385/PG_15_202209061/16386/16390\": No space left on device",
            "could not write to file \"base/pgsql_tmp/pgsql_tmp4242.0\": No space left on device",
            "could not extend file \"base/16384/16390\": Disk quota exceeded",
            "could not open file \"pg_tblspc/16385/PG_15_202209061/16386/16390\": Read-only file system",
            "could not read block 3 in file \"base/16384/16390\": Input/output error",
        ] {
            let error = Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()));
            let (api, marked) = std::thread::spawn(move || (ApiError::from(error), lost_on_this_thread()))
                .join()
                .expect("thread");
            assert!(matches!(api, ApiError::Unavailable(_)), "{message} → {api:?}");
            assert!(!marked, "{message} marked a sound connection");
        }
    }

    fn schema_json<T: PartialSchema>() -> Value {
        serde_json::to_value(T::schema()).expect("schema serializes")
    }

    #[test]
    fn problem_code_schema_lists_exactly_the_codes() {
        let mut documented: Vec<String> = schema_json::<ProblemCode>()["enum"]
            .as_array()
            .expect("code is an enum")
            .iter()
            .map(|code| code.as_str().expect("code is a string").to_owned())
            .collect();
        let mut codes: Vec<String> = ApiError::one_of_each()
            .iter()
            .map(|error| error.code().to_owned())
            .collect();
        documented.sort();
        codes.sort();
        // Two variants share `rate_limited` (per key, per address).
        codes.dedup();
        assert_eq!(documented, codes);
    }

    #[test]
    fn every_member_written_is_documented() {
        let problem = schema_json::<Problem>();
        let properties = problem["properties"]
            .as_object()
            .expect("problem has properties");
        for error in ApiError::one_of_each() {
            let body = error
                .error_response()
                .into_body()
                .try_into_bytes()
                .expect("a complete body");
            let body: Value = serde_json::from_slice(&body).expect("JSON body");
            for member in body.as_object().expect("an object").keys() {
                assert!(
                    properties.contains_key(member),
                    "{member} of {} is not in the Problem schema",
                    error.code()
                );
            }
        }
    }
}
