//! Admin and finance keys; the key list; revocation of any key.

use actix_web::{delete, get, patch, post, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{idempotency_key, idempotency_scope, replayed, JsonObject, State};
use crate::db::run_blocking;
use crate::domain::api_keys::{
    self, create_api_key_by, parse_expires_at, revoke_api_key, ApiKeyPage, Caller, CreatedApiKey,
    Scope,
};
use crate::domain::audit::Audit;
use crate::domain::idempotency::{self, Claim, Created, ReplayedApiKey};
use crate::domain::key_budgets::{set_budget, BudgetSpec, KeyBudget};
use crate::engine::types::AccountId;
use crate::engine::types::{ApiKeyId, Label};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_key)
        .service(list_keys)
        .service(update_key)
        .service(revoke_key);
}

/// Creates a key, once per `Idempotency-Key` when there is one: 201 with
/// the secret, or 200 with the earlier key and no secret.
pub(super) async fn create_key_once(
    state: &State,
    claim: Option<Claim>,
    create: impl FnOnce(&mut diesel::PgConnection) -> Result<CreatedApiKey, ApiError> + Send + 'static,
) -> Result<HttpResponse, ApiError> {
    let outcome = run_blocking(&state.pool, move |conn| match claim {
        None => create(conn).map(Created::New),
        Some(claim) => match idempotency::create_once(conn, &claim, |conn| {
            create(conn).map(|key| (key.key_id.0, key))
        })? {
            Created::New(key) => Ok(Created::New(key)),
            Created::Existing(id) => idempotency::replayed_api_key(conn, id).map(Created::Existing),
        },
    })
    .await?;
    Ok(match outcome {
        Created::New(key) => HttpResponse::Created().json(key),
        Created::Existing(key) => replayed(&key),
    })
}

/// The canonical request of a key creation, for its `Idempotency-Key`.
pub(super) fn key_canonical(
    scope: Scope,
    label: &Label,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    budget: Option<&BudgetSpec>,
) -> serde_json::Value {
    let mut canonical = serde_json::json!({"scope": scope.as_str(), "label": label.as_str()});
    if let Some(expires_at) = expires_at {
        canonical["expires_at"] = serde_json::json!(expires_at);
    }
    if let Some(budget) = budget {
        canonical["budget"] = serde_json::json!([
            budget.budget_tokens,
            budget.budget_period,
            budget.budget_time_zone,
            budget.budget_low_percent
        ]);
    }
    canonical
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// `admin` or `finance`; kiosk keys are created on their account
    /// (`POST /v1/accounts/{account_id}/api-keys`).
    scope: UnboundScope,
    label: Label,
    /// When the key stops working (RFC 3339, in the future); absent: never.
    #[schema(format = DateTime, value_type = Option<String>)]
    expires_at: Option<String>,
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
        (status = 400, description = "Invalid JSON, label or expires_at, or a scope other \
                                      than admin or finance",
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
    let CreateKey {
        scope,
        label,
        expires_at,
    } = body.into_inner();
    let scope = match scope {
        UnboundScope::Admin => Scope::Admin,
        UnboundScope::Finance => Scope::Finance,
    };
    let expires_at = parse_expires_at(expires_at.as_deref())?;
    let claim = idempotency_key(&request)?
        .map(|key| {
            let canonical = key_canonical(scope, &label, expires_at, None);
            Claim::new(
                caller.actor(),
                idempotency_scope(&request),
                &key,
                &canonical,
            )
        })
        .transpose()?;
    let by = Audit::of(&caller);
    create_key_once(&state, claim, move |conn| {
        create_api_key_by(conn, &by, scope, None, &label, expires_at, None)
    })
    .await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct KeyListQuery {
    /// Keys after this key id: the previous page's `next_after`.
    after: Option<Uuid>,
    /// Keys per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only the kiosk keys of this account.
    account_id: Option<Uuid>,
}

/// Lists keys, without their secrets, in key id order (admin): what an
/// operator needs to rotate a key — create the new one, move the kiosk,
/// revoke the old one.
#[utoipa::path(
    tag = "api-keys",
    params(KeyListQuery),
    responses(
        (status = 200, description = "One page of keys; `next_after` is the next page's \
                                      `after`, null on the last page", body = ApiKeyPage),
        (status = 400, description = "Invalid cursor, limit or account id",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/api-keys")]
async fn list_keys(
    caller: Caller,
    state: State,
    query: web::Query<KeyListQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let KeyListQuery {
        after,
        limit,
        account_id,
    } = query.into_inner();
    let page = run_blocking(&state.pool, move |conn| {
        api_keys::list_api_keys(conn, after.map(ApiKeyId), limit, account_id.map(AccountId))
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
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
    let by = Audit::of(&caller);
    run_blocking(&state.pool, move |conn| revoke_api_key(conn, &by, key)).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A key's change: its budget (only a kiosk key has one).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateKey {
    /// The kiosk key's new spending limit; null removes it. Required: it is
    /// what a PATCH changes.
    #[schema(required = true)]
    budget: Option<BudgetSpec>,
}

/// A kiosk key's budget after a PATCH.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct UpdatedKey {
    key_id: ApiKeyId,
    /// The limit and what the key spent in the current period; null: none.
    budget: Option<KeyBudget>,
}

/// Sets or removes a kiosk key's budget (admin).
///
/// `{"budget": {"budget_tokens": 200, "budget_period": "day",
/// "budget_time_zone": "Europe/Berlin"}}`; `{"budget": null}` removes it.
/// The same period and time zone keep the period's count; another starts
/// a new count. Decided under the account's row lock, as the engine
/// counts it.
#[utoipa::path(
    tag = "api-keys",
    params(("key_id" = Uuid, Path, description = "The kiosk key (its `key_id`)")),
    request_body = UpdateKey,
    responses(
        (status = 200, description = "The key's budget now", body = UpdatedKey),
        (status = 400, description = "Invalid JSON, budget or time zone, no `budget`, or not \
                                      a kiosk key",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such key",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[patch("/v1/api-keys/{key_id}")]
async fn update_key(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<serde_json::Map<String, serde_json::Value>>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let key = ApiKeyId(path.into_inner());
    let body = body.into_inner();
    if !body.contains_key("budget") {
        return Err(ApiError::InvalidRequest(
            "send budget: the new budget, or null to remove it".into(),
        ));
    }
    let UpdateKey { budget } = serde_json::from_value(serde_json::Value::Object(body))
        .map_err(|error| ApiError::InvalidRequest(format!("invalid JSON body: {error}")))?;
    let by = Audit::of(&caller);
    let budget = run_blocking(&state.pool, move |conn| set_budget(conn, &by, key, budget)).await?;
    Ok(HttpResponse::Ok().json(UpdatedKey {
        key_id: key,
        budget,
    }))
}
