//! Admin and finance keys; revocation of any key.

use actix_web::{delete, post, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::accounts::create_key_once;
use super::{idempotency_key, JsonObject, State};
use crate::db::run_blocking;
use crate::domain::api_keys::{create_api_key, revoke_api_key, Caller, CreatedApiKey, Scope};
use crate::domain::idempotency::{Claim, ReplayedApiKey};
use crate::domain::types::{ApiKeyId, Label};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(create_key).service(revoke_key);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// `admin` or `finance`; kiosk keys are created on their account
    /// (`POST /v1/accounts/{account_id}/api-keys`).
    scope: UnboundScope,
    label: Label,
}

/// The scopes of a key not bound to an account.
#[derive(Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum UnboundScope {
    Admin,
    Finance,
}

/// An admin or finance key, not bound to an account.
///
/// With an `Idempotency-Key` header, a retry with the same key and body
/// answers 200 with the key created earlier — without its secret, which
/// is never shown again: a client that lost it revokes that key and
/// creates a new one.
#[utoipa::path(
    tag = "api-keys",
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
         pattern = "^[\\x20-\\x7E]+$",
         description = "1–200 printable ASCII characters chosen by the client; a retry \
                        with the same key and body creates nothing and answers 200"),
    ),
    request_body = CreateKey,
    responses(
        (status = 201, description = "The new key, with its secret (shown only now)",
         body = CreatedApiKey),
        (status = 200, description = "A replay: the key created earlier with this \
                                      `Idempotency-Key`, without its secret (`key` is null)",
         body = ReplayedApiKey,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 422, description = "This Idempotency-Key was used with another body",
         body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid JSON or label, or a scope other than admin or finance",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/api-keys")]
async fn create_key(
    caller: Caller,
    state: State,
    request: HttpRequest,
    body: JsonObject<CreateKey>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let CreateKey { scope, label } = body.into_inner();
    let scope = match scope {
        UnboundScope::Admin => Scope::Admin,
        UnboundScope::Finance => Scope::Finance,
    };
    let claim = idempotency_key(&request)?
        .map(|key| {
            let canonical = serde_json::json!({"scope": scope.as_str(), "label": label.as_str()});
            Claim::new(caller.actor(), request.path().to_owned(), &key, &canonical)
        })
        .transpose()?;
    create_key_once(&state, claim, move |conn| {
        create_api_key(conn, scope, None, &label)
    })
    .await
}

/// Revokes a key; every replica refuses it from the next request on.
///
/// Revoking a revoked key again is a 204 too.
#[utoipa::path(
    tag = "api-keys",
    params(("key_id" = Uuid, Path, description = "The key (its `key_id`)")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "The key id is not a UUID",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such key",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[delete("/v1/api-keys/{key_id}")]
async fn revoke_key(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let key = ApiKeyId(path.into_inner());
    run_blocking(&state.pool, move |conn| revoke_api_key(conn, key)).await?;
    Ok(HttpResponse::NoContent().finish())
}
