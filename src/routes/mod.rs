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
pub(crate) mod revenue;
mod state;
pub(crate) mod system;
pub(crate) mod topups;
pub(crate) mod usage;
pub(crate) mod webhooks;

pub use state::AppState;

use std::future::Future;
use std::pin::Pin;

use actix_web::http::header;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, HttpResponse};
use serde::Serialize;

use crate::db::run_blocking;
use crate::domain::api_keys::{Caller, Credentials};
use crate::error::ApiError;
use crate::rate_limit::{self, Known};

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
    topups::configure(config);
    api_keys::configure(config);
    audit::configure(config);
    events::configure(config);
    webhooks::configure(config);
    reconciliation::configure(config);
    revenue::configure(config);
    usage::configure(config);
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

/// What an `Idempotency-Key` is scoped to besides its caller: the route's
/// pattern with its parameters as parsed (an id in its one printed form),
/// never the raw text of the path, so two spellings of one endpoint share
/// their keys. The form is the canonical path's (`/v1/accounts/<id>/…`),
/// the one recorded before this rule, so recorded keys keep their scope.
pub fn idempotency_scope(request: &HttpRequest) -> String {
    let Some(pattern) = request.match_pattern() else {
        return request.path().to_owned();
    };
    request
        .match_info()
        .iter()
        .fold(pattern, |scope, (name, value)| {
            let value = uuid::Uuid::try_parse(value)
                .map_or_else(|_| value.to_owned(), |id| id.hyphenated().to_string());
            scope.replace(&format!("{{{name}}}"), &value)
        })
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
pub(crate) fn from_json_object<T: serde::de::DeserializeOwned>(
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

/// The key of `Authorization: Bearer <key>`, if any.
pub fn bearer_key(request: &HttpRequest) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, key) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        })
        .filter(|key| !key.is_empty())
}

/// What a request's `Authorization` header presents: read (the key parsed,
/// its secret and the bootstrap comparison hashed) once per request and
/// kept in the request's extensions, for the address throttle and the
/// credentials extractor both.
#[derive(Clone)]
enum Presentation {
    Nothing,
    /// The bootstrap admin key (compared in constant time), or a
    /// well-formed key.
    Credentials(Credentials),
    /// A key that can only fail.
    Malformed,
}

fn presentation(state: &AppState, request: &HttpRequest) -> Presentation {
    if let Some(read) = request.extensions().get::<Presentation>() {
        return read.clone();
    }
    let read = match bearer_key(request) {
        None => Presentation::Nothing,
        Some(key) if state.is_bootstrap_key(key) => {
            Presentation::Credentials(Credentials::Bootstrap)
        }
        Some(key) => {
            Credentials::parse(key).map_or(Presentation::Malformed, Presentation::Credentials)
        }
    };
    request.extensions_mut().insert(read.clone());
    read
}

/// What a request presents, for the address throttle (before any lookup):
/// nothing, the bootstrap key, a well-formed key, or a key that can only
/// fail.
pub fn presented_to_the_guard(state: &AppState, request: &HttpRequest) -> rate_limit::Presented {
    use rate_limit::Presented;
    match presentation(state, request) {
        Presentation::Nothing => Presented::Nothing,
        Presentation::Credentials(Credentials::Bootstrap) => Presented::Bootstrap,
        Presentation::Credentials(credentials) => credentials
            .presented()
            .map_or(Presented::Refused, Presented::Key),
        Presentation::Malformed => Presented::Refused,
    }
}

/// The presented credentials and what this replica already knows of them,
/// without a database lookup: a missing or malformed key is 401, the
/// bootstrap admin key is recognised by its hash in memory, and a key whose
/// secret this replica has verified is charged to its rate bucket here,
/// before any database work (its flood never reaches the pool). A key this
/// replica does not know is charged only once the database has verified
/// it (`verify_and_remember`); one whose id it knows with another secret is
/// 401 at once.
fn presented_credentials(request: &HttpRequest) -> Result<(Credentials, Known), ApiError> {
    let state = state_of(request)?;
    let credentials = match presentation(state, request) {
        Presentation::Nothing | Presentation::Malformed => return Err(ApiError::Unauthorized),
        Presentation::Credentials(credentials) => credentials,
    };
    let Some(key) = credentials.presented() else {
        // The bootstrap key, recognised by its hash in memory.
        limit(state, "bootstrap-admin")?;
        return Ok((credentials, Known::Verified));
    };
    match state.auth_guard.recognise(&key) {
        Known::Verified => {
            limit(state, &rate_limit::bucket_of(&key.0))?;
            Ok((credentials, Known::Verified))
        }
        Known::WrongSecret => Err(ApiError::Unauthorized),
        Known::Unknown => Ok((credentials, Known::Unknown)),
    }
}

fn state_of(request: &HttpRequest) -> Result<&State, ApiError> {
    request
        .app_data::<State>()
        .ok_or_else(|| ApiError::Internal("application state missing".into()))
}

fn limit(state: &State, bucket: &str) -> Result<(), ApiError> {
    state
        .rate_limiter
        .check(bucket)
        .map_err(|retry_after_seconds| ApiError::RateLimited {
            retry_after_seconds,
        })
}

/// Verifies a key in the database and keeps the replica's memory in step:
/// a success is remembered (and, when the key was not known before,
/// charged to its bucket now); a refusal of a remembered key forgets it.
async fn verify_and_remember(
    state: &State,
    credentials: Credentials,
    known: Known,
) -> Result<Caller, ApiError> {
    let presented = credentials.presented();
    let verified = run_blocking(&state.pool, move |conn| credentials.verify(conn)).await;
    match (&verified, presented) {
        (Ok(_), Some(key)) if known == Known::Unknown => {
            state.auth_guard.remember(&key);
            limit(state, &rate_limit::bucket_of(&key.0))?;
        }
        (Ok(_), Some(key)) => state.auth_guard.remember(&key),
        (Err(ApiError::Unauthorized), Some(key)) => state.auth_guard.forget(&key.0),
        _ => {}
    }
    verified
}

/// A key that a handler hands to the money engine before this replica has
/// verified it: the engine verifies it in the spending statement, and a
/// success answer is the proof. The middleware then remembers the key and
/// charges its bucket (`startup::remember_engine_verified`), so a cold
/// key's first requests cost no extra lookup.
#[derive(Clone, Copy)]
pub struct VerifiedByTheAnswer(pub rate_limit::PresentedKey);

/// A key this replica remembered as verified, handed to the money engine
/// without a lookup: when the engine refuses it (401: revoked or expired
/// since), the middleware forgets it, as `verify_and_remember` does for
/// a handler that looks the key up. Without this, a revoked key that only
/// spends kept passing a blocked address for the memory's lifetime.
#[derive(Clone, Copy)]
pub struct RememberedByThisReplica(pub rate_limit::PresentedKey);

/// The presented credentials, for handlers that hand the key to the money
/// engine (which verifies it in the spending statement, or the handler
/// with its first read). A key this replica knows is charged to its
/// bucket here; one it does not know is charged once a success answer has
/// shown it valid ([`VerifiedByTheAnswer`]), never before.
impl FromRequest for Credentials {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Credentials, ApiError>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        let presented = presented_credentials(request).map(|(credentials, known)| {
            match (known, credentials.presented()) {
                (Known::Unknown, Some(key)) => {
                    request.extensions_mut().insert(VerifiedByTheAnswer(key));
                }
                (Known::Verified, Some(key)) => {
                    request
                        .extensions_mut()
                        .insert(RememberedByThisReplica(key));
                }
                _ => {}
            }
            credentials
        });
        std::future::ready(presented)
    }
}

/// After a success answer: a key the handler handed on unverified was
/// verified by the engine (or the handler's read); remember it and charge
/// its bucket now. After a 401: a remembered key the engine refused is
/// forgotten.
pub fn remember_verified_by_the_answer(state: &State, request: &HttpRequest, status: u16) {
    if status == 401 {
        let key = request
            .extensions()
            .get::<RememberedByThisReplica>()
            .copied();
        if let Some(RememberedByThisReplica(key)) = key {
            state.auth_guard.forget(&key.0);
        }
        return;
    }
    if !(200..300).contains(&status) {
        return;
    }
    let key = request.extensions().get::<VerifiedByTheAnswer>().copied();
    if let Some(VerifiedByTheAnswer(key)) = key {
        state.auth_guard.remember(&key);
        // The request is answered already; the charge counts for the next.
        let _ = limit(state, &rate_limit::bucket_of(&key.0));
    }
}

/// The verified caller: the credentials, then the key looked up (`revoked_at`
/// read on every request, so a revocation takes effect at once).
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Caller, ApiError>>>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        let presented = presented_credentials(request);
        let state = state_of(request).cloned();
        Box::pin(async move {
            match presented? {
                (Credentials::Bootstrap, _) => Ok(Caller::bootstrap_admin()),
                (key, known) => verify_and_remember(&state?, key, known).await,
            }
        })
    }
}

/// For a long poll about to answer: the key is looked up again, so a key
/// revoked (or expired) while the request waited gets 401, not the answer.
pub async fn recheck_key(state: &State, request: &HttpRequest) -> Result<(), ApiError> {
    let presented = bearer_key(request).ok_or(ApiError::Unauthorized)?;
    if state.is_bootstrap_key(presented) {
        return Ok(());
    }
    let credentials = Credentials::parse(presented).ok_or(ApiError::Unauthorized)?;
    verify_and_remember(state, credentials, Known::Verified)
        .await
        .map(|_| ())
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
