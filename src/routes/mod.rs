//! Thin HTTP handlers: extract and validate input, call one domain function
//! inside `run_blocking`, map the result to JSON. No SQL here.

// `pub(crate)` so that `crate::openapi` can name each handler's
// `#[utoipa::path]` in the document.
pub(crate) mod accounts;
pub(crate) mod api_keys;
pub(crate) mod credits;
pub(crate) mod docs;
pub(crate) mod health;
pub(crate) mod jobs;
pub(crate) mod reconciliation;
pub(crate) mod reservations;

use std::future::Future;
use std::pin::Pin;

use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::db::run_blocking;
use crate::domain::api_keys::{authenticate, sha256, Caller};
use crate::error::ApiError;
use crate::rate_limit;
use crate::startup::AppState;

pub type State = web::Data<AppState>;

pub fn configure(config: &mut web::ServiceConfig) {
    health::configure(config);
    docs::configure(config);
    accounts::configure(config);
    api_keys::configure(config);
    credits::configure(config);
    jobs::configure(config);
    reconciliation::configure(config);
    reservations::configure(config);
}

/// No route matched: 405 with `Allow` when the path exists with other
/// methods, else 404.
pub async fn not_found(request: HttpRequest) -> Result<HttpResponse, ApiError> {
    match crate::openapi::allowed_methods(request.path()) {
        Some(allowed) => Err(ApiError::MethodNotAllowed { allowed }),
        None => Err(ApiError::NotFound("route")),
    }
}

/// Header telling the client this answer replays an earlier identical request.
pub const IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";

pub fn created(location: String, body: &impl Serialize) -> HttpResponse {
    HttpResponse::Created()
        .insert_header((header::LOCATION, location))
        .json(body)
}

pub fn replayed(body: &impl Serialize) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((IDEMPOTENT_REPLAYED, "true"))
        .json(body)
}

/// A JSON body that must be an object. `web::Json` alone would also
/// accept an array for a struct (serde's positional form), which is not
/// what the API documents.
pub struct JsonObject<T>(pub T);

impl<T> JsonObject<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: serde::de::DeserializeOwned + 'static> FromRequest for JsonObject<T> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<JsonObject<T>, actix_web::Error>>>>;

    fn from_request(request: &HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        // The app's JsonConfig (size limit, problem+json errors) applies.
        let object =
            web::Json::<serde_json::Map<String, serde_json::Value>>::from_request(request, payload);
        Box::pin(async move {
            let object = object.await?.into_inner();
            serde_json::from_value(serde_json::Value::Object(object))
                .map(JsonObject)
                .map_err(|error| {
                    ApiError::InvalidRequest(format!("invalid JSON body: {error}")).into()
                })
        })
    }
}

/// A body that may be absent (empty means all defaults) but, when present,
/// must be valid JSON for `T`: a malformed body never falls back to defaults.
pub fn optional_json_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body).map(str::trim).unwrap_or("?");
    if text.is_empty() || text == "null" {
        return Ok(T::default());
    }
    let invalid =
        |error: serde_json::Error| ApiError::InvalidRequest(format!("invalid JSON body: {error}"));
    let value: serde_json::Value = serde_json::from_slice(body).map_err(invalid)?;
    if !value.is_object() {
        return Err(ApiError::InvalidRequest(
            "the JSON body must be an object".into(),
        ));
    }
    serde_json::from_value(value).map_err(invalid)
}

/// `Authorization: Bearer <key>` → the caller, or 401.
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Caller, ApiError>>>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        let state = request.app_data::<State>().cloned();
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                let (scheme, key) = value.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| key.trim().to_owned())
            });
        Box::pin(async move {
            let state =
                state.ok_or_else(|| ApiError::Internal("application state missing".into()))?;
            let presented = presented
                .filter(|key| !key.is_empty())
                .ok_or(ApiError::Unauthorized)?;
            let limit = |bucket: &str| {
                state
                    .rate_limiter
                    .check(bucket)
                    .map_err(|retry_after_seconds| ApiError::RateLimited {
                        retry_after_seconds,
                    })
            };
            if let Some(admin_hash) = state.admin_key_hash {
                if bool::from(sha256(presented.as_bytes()).ct_eq(&admin_hash)) {
                    limit("bootstrap-admin")?;
                    return Ok(Caller::bootstrap_admin());
                }
            }
            // Before the database lookup: a flood never reaches the pool.
            limit(&rate_limit::bucket_of(&presented))?;
            run_blocking(&state.pool, move |conn| authenticate(conn, &presented)).await
        })
    }
}
