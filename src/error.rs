//! One error type for the whole service, rendered once as RFC 9457
//! `application/problem+json` with a stable `code`.
//!
//! Rules: a 4xx tells the client exactly what to fix; a 5xx never leaks
//! internals (the cause is logged, not sent); a database that cannot be
//! reached is a 503 `unavailable`, meaning nothing was changed.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
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
    #[error("insufficient tokens")]
    InsufficientTokens { available: i64, reserved: i64 },
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
    #[error("too many active reservations (limit {limit})")]
    TooManyActiveReservations { limit: i32 },
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
            ApiError::InsufficientTokens { .. } => "insufficient_tokens",
            ApiError::ReservationNotHeld { .. } => "reservation_not_held",
            ApiError::ReservationOwnedByJob => "reservation_owned_by_job",
            ApiError::AccountSuspended => "account_suspended",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::IdempotencyKeyReused(_) => "idempotency_key_reused",
            ApiError::TooManyActiveReservations { .. } => "too_many_active_reservations",
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
            ApiError::InsufficientTokens { .. } => "Insufficient tokens",
            ApiError::ReservationNotHeld { .. } => "Reservation not held",
            ApiError::ReservationOwnedByJob => "Reservation owned by a job",
            ApiError::AccountSuspended => "Account suspended",
            ApiError::PayloadTooLarge { .. } => "Payload too large",
            ApiError::IdempotencyKeyReused(_) => "Idempotency key reused",
            ApiError::TooManyActiveReservations { .. } => "Too many active reservations",
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
                "the database is unreachable; nothing was changed, retry later".to_owned()
            }
            ApiError::Internal(_) => "an internal error occurred; nothing was changed".to_owned(),
            other => other.to_string(),
        }
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
            ApiError::ReservationNotHeld { state } => {
                extra.insert("state".into(), json!(state));
            }
            ApiError::TooManyActiveReservations { limit } => {
                extra.insert("max_active_reservations".into(), json!(limit));
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
            ApiError::InsufficientTokens { .. } => StatusCode::PAYMENT_REQUIRED,
            ApiError::ReservationNotHeld { .. }
            | ApiError::ReservationOwnedByJob
            | ApiError::AccountSuspended => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::IdempotencyKeyReused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TooManyActiveReservations { .. } => StatusCode::TOO_MANY_REQUESTS,
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
        let mut response = HttpResponse::build(status);
        response.insert_header((header::CONTENT_TYPE, "application/problem+json"));
        match self {
            ApiError::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            ApiError::Unavailable(_) => {
                response.insert_header((header::RETRY_AFTER, "1"));
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
            Error::DatabaseError(DatabaseErrorKind::ClosedConnection, info) => {
                ApiError::Unavailable(info.message().to_owned())
            }
            // A statement cancelled by statement_timeout, or a server shutting
            // down, rolled back: nothing was changed and a retry is safe.
            Error::DatabaseError(DatabaseErrorKind::Unknown, ref info)
                if is_transient_message(info.message()) =>
            {
                ApiError::Unavailable(info.message().to_owned())
            }
            other => ApiError::Internal(format!("{other:?}")),
        }
    }
}

fn is_transient_message(message: &str) -> bool {
    const TRANSIENT: [&str; 5] = [
        "canceling statement due to statement timeout",
        "terminating connection",
        "server closed the connection",
        "connection",
        "the database system is",
    ];
    TRANSIENT.iter().any(|needle| message.contains(needle))
}

impl From<r2d2::Error> for ApiError {
    fn from(error: r2d2::Error) -> Self {
        ApiError::Unavailable(error.to_string())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
