//! Admin and finance keys; revocation of any key.

use actix_web::{delete, post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::State;
use crate::db::run_blocking;
use crate::domain::api_keys::{create_api_key, revoke_api_key, Caller, Scope};
use crate::domain::types::{ApiKeyId, Label};
use crate::error::ApiError;

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(create_key).service(revoke_key);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    scope: Scope,
    label: Label,
}

/// An admin or finance key, not bound to an account.
#[post("/v1/api-keys")]
async fn create_key(
    caller: Caller,
    state: State,
    body: web::Json<CreateKey>,
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
