//! Thin HTTP handlers: extract and validate input, hand the work to the
//! domain, map the result to JSON. No SQL here.
//!
//! Most handlers make one `run_blocking` call (a domain function on a pooled
//! connection). The spending requests of an account — reserve, commit,
//! release — go through `state.coalescer` instead, which joins concurrent
//! ones into one transaction; a job's wait (`wait_seconds`) holds no
//! connection while it waits and reads the job before and after.

// `pub(crate)` so that `crate::openapi` can name each handler's
// `#[utoipa::path]` in the document.
pub(crate) mod accounts;
pub(crate) mod api_keys;
pub(crate) mod audit;
pub(crate) mod console;
pub(crate) mod credits;
pub(crate) mod docs;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod jobs;
pub(crate) mod reconciliation;
pub(crate) mod reservations;
pub(crate) mod system;
pub(crate) mod webhooks;

use std::future::Future;
use std::pin::Pin;

use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use serde::Serialize;

use crate::db::run_blocking;
use crate::domain::api_keys::{Caller, Credentials};
use crate::error::ApiError;
use crate::rate_limit;
use crate::startup::AppState;

pub type State = web::Data<AppState>;

pub fn configure(config: &mut web::ServiceConfig) {
    // actix-web tries routes in this order (a regular expression each), and
    // the metrics middleware looks the pattern up the same way: the kiosks'
    // hot routes come first. No two patterns match the same path, so the
    // order changes nothing else.
    reservations::configure(config);
    jobs::configure(config);
    accounts::configure(config);
    credits::configure(config);
    api_keys::configure(config);
    audit::configure(config);
    events::configure(config);
    webhooks::configure(config);
    reconciliation::configure(config);
    system::configure(config);
    health::configure(config);
    docs::configure(config);
    console::configure(config);
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

/// The request's `Idempotency-Key`, if it sent one; validated by
/// `domain::idempotency::Claim::new`.
pub fn idempotency_key(request: &actix_web::HttpRequest) -> Result<Option<String>, ApiError> {
    use crate::domain::idempotency::IDEMPOTENCY_KEY_HEADER;
    request
        .headers()
        .get(IDEMPOTENCY_KEY_HEADER)
        .map(|value| {
            value.to_str().map(str::to_owned).map_err(|_| {
                ApiError::InvalidRequest(format!(
                    "the {IDEMPOTENCY_KEY_HEADER} header must be printable ASCII"
                ))
            })
        })
        .transpose()
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
            let object = integral_numbers(object.await?.into_inner());
            if object
                .iter()
                .any(|(key, value)| key.contains('\0') || has_nul(value))
            {
                return Err(ApiError::InvalidRequest(
                    "the JSON body must not contain the character U+0000 (\\u0000) anywhere".into(),
                )
                .into());
            }
            from_json_object(object)
                .map(JsonObject)
                .map_err(actix_web::Error::from)
        })
    }
}

/// A number without a fraction written with one (`5.0`) is the integer 5, as
/// JSON Schema and so the OpenAPI document say; serde would refuse it for
/// an integer field. Only the body's own fields are read this way: nested
/// values (a job's `params`) reach the provider exactly as sent. A number
/// with a fraction (`5.5`) stays what it is, and is refused as before.
fn integral_numbers(
    mut object: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    for value in object.values_mut() {
        let integral = value
            .as_f64()
            .filter(|_| !value.is_i64() && !value.is_u64())
            .filter(|number| number.fract() == 0.0 && number.abs() < 9.0e15);
        if let Some(number) = integral {
            // Exact: |number| < 2^53, and it has no fraction.
            #[allow(clippy::cast_possible_truncation)]
            let integer = number as i64;
            *value = serde_json::Value::from(integer);
        }
    }
    object
}

/// True when a string or a key anywhere in `value` holds U+0000, which
/// PostgreSQL cannot store (in `text` or `jsonb`): refused up front as a
/// bad request rather than failing at the database.
fn has_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => text.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(has_nul),
        serde_json::Value::Object(object) => object
            .iter()
            .any(|(key, value)| key.contains('\0') || has_nul(value)),
        _ => false,
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
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::InvalidRequest(format!("invalid JSON body: {error}")))?;
    let serde_json::Value::Object(object) = value else {
        return Err(ApiError::InvalidRequest(
            "the JSON body must be an object".into(),
        ));
    };
    from_json_object(integral_numbers(object))
}

/// Reads `T` from a body's object; an error names the field it is about
/// (`invalid JSON body: amount: invalid type: string "50", expected i64`),
/// nested ones by their path (`params.simulate.delay_ms`).
fn from_json_object<T: serde::de::DeserializeOwned>(
    object: serde_json::Map<String, serde_json::Value>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(serde_json::Value::Object(object)).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path.is_empty() || path == "." || path == "?" {
            ApiError::InvalidRequest(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::InvalidRequest(format!("invalid JSON body: {path}: {inner}"))
        }
    })
}

/// `Authorization: Bearer <key>` → the presented credentials, without a
/// database lookup: a missing or malformed key is 401, the bootstrap admin
/// key is recognised by its hash in memory, and the rate limit applies
/// before any database work (a flood never reaches the pool).
impl FromRequest for Credentials {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Credentials, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(credentials_of(request))
    }
}

fn credentials_of(request: &HttpRequest) -> Result<Credentials, ApiError> {
    let state = request
        .app_data::<State>()
        .ok_or_else(|| ApiError::Internal("application state missing".into()))?;
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, key) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        })
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
    if state.is_bootstrap_key(presented) {
        limit("bootstrap-admin")?;
        return Ok(Credentials::Bootstrap);
    }
    limit(&rate_limit::bucket_of(presented))?;
    Credentials::parse(presented).ok_or(ApiError::Unauthorized)
}

/// The verified caller: the credentials, then the key looked up (`revoked_at`
/// read on every request, so a revocation takes effect at once).
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Caller, ApiError>>>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        let credentials = credentials_of(request);
        let state = request.app_data::<State>().cloned();
        Box::pin(async move {
            match credentials? {
                Credentials::Bootstrap => Ok(Caller::bootstrap_admin()),
                key => {
                    let state = state
                        .ok_or_else(|| ApiError::Internal("application state missing".into()))?;
                    run_blocking(&state.pool, move |conn| key.verify(conn)).await
                }
            }
        })
    }
}

/// For handlers that verify the key inside their own statement: an input
/// error (path, body) is answered only once the key has been checked, so a
/// bad key is 401 whatever else is wrong, as with [`Caller`].
pub async fn after_key_check<T>(
    state: &State,
    credentials: &Credentials,
    input: Result<T, actix_web::Error>,
) -> Result<T, actix_web::Error> {
    let error = match input {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    if let Credentials::Key { .. } = credentials {
        let credentials = credentials.clone();
        run_blocking(&state.pool, move |conn| credentials.verify(conn)).await?;
    }
    Err(error)
}
