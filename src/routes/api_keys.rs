//! Admin and finance keys; revocation of any key.

use actix_web::{delete, post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{JsonObject, State};
use crate::db::run_blocking;
use crate::domain::api_keys::{create_api_key, revoke_api_key, Caller, CreatedApiKey, Scope};
use crate::domain::types::{ApiKeyId, Label};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(create_key).service(revoke_key);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// `admin` or `finance`; kiosk keys are created on their account.
    scope: Scope,
    label: Label,
}

/// An admin or finance key, not bound to an account.
#[utoipa::path(
    tag = "api-keys",
    request_body = CreateKey,
    responses(
        (status = 201, description = "The new key, with its secret (shown only now)",
         body = CreatedApiKey),
        (status = 400, description = "Invalid JSON or label, or scope kiosk",
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
    body: JsonObject<CreateKey>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let CreateKey { scope, label } = body.into_inner();
    if scope == Scope::Kiosk {
        return Err(ApiError::InvalidRequest(
            "kiosk keys are bound to an account: use POST /v1/accounts/{account_id}/api-keys"
                .into(),
        ));
    }
    let key = run_blocking(&state.pool, move |conn| {
        create_api_key(conn, scope, None, &label)
    })
    .await?;
    Ok(HttpResponse::Created().json(key))
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
