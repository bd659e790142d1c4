//! Automatic top-up rules (docs/topups.md): admins write them; finance and
//! the account's kiosks read them.

use actix_web::{delete, get, patch, post, web, HttpResponse};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{created, from_json_object, JsonObject, State};
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::audit::Audit;
use crate::domain::topups::{self, RuleSpec, TopupRuleBody, TopupRulePage, TopupRuleView};
use crate::engine::types::AccountId;
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_rule)
        .service(list_rules)
        .service(get_rule)
        .service(update_rule)
        .service(delete_rule);
}

/// Creates a top-up rule.
///
/// A `threshold` rule fires once per crossing of `threshold_tokens`, in
/// the transaction of the movement that crossed (one per account; it
/// starts armed, so an account already below gets its top-up at once). A
/// `schedule` rule fires once per period, from the next reaper pass on.
#[utoipa::path(
    tag = "topups",
    params(("account_id" = Uuid, Path, description = "The account")),
    request_body = TopupRuleBody,
    responses(
        (status = 201, description = "The rule", body = TopupRuleView,
         headers(("Location" = String, description = "The rule"))),
        (status = 400, description = "Invalid JSON, path, or a field the rule's trigger, method or mode does not take",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The account has a threshold rule already (`threshold_rule_exists`, naming it)",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/topup-rules")]
async fn create_rule(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<TopupRuleBody>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let spec = RuleSpec::try_from(body.into_inner())?;
    let by = Audit::of(&caller);
    let (view, credited) = run_blocking(&state.pool, move |conn| {
        topups::create_rule(conn, &by, account, spec)
    })
    .await?;
    state.metrics.tokens("credited", credited);
    Ok(created(
        format!("/v1/accounts/{account}/topup-rules/{}", view.rule_id),
        &view,
    ))
}

/// The account's top-up rules, oldest first, each with its last firing.
#[utoipa::path(
    tag = "topups",
    params(("account_id" = Uuid, Path, description = "The account")),
    responses(
        (status = 200, description = "The rules", body = TopupRulePage),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/topup-rules")]
async fn list_rules(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let page = run_blocking(&state.pool, move |conn| topups::list_rules(conn, account)).await?;
    Ok(HttpResponse::Ok().json(page))
}

/// One top-up rule, with its last firing.
#[utoipa::path(
    tag = "topups",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("rule_id" = Uuid, Path, description = "The rule"),
    ),
    responses(
        (status = 200, description = "The rule", body = TopupRuleView),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or rule, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/topup-rules/{rule_id}")]
async fn get_rule(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
) -> Result<HttpResponse, ApiError> {
    let (account, rule) = path.into_inner();
    let account = AccountId(account);
    caller.authorize_read(account)?;
    let view = run_blocking(&state.pool, move |conn| {
        topups::get_rule(conn, account, rule)
    })
    .await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Changes a top-up rule.
///
/// The body's members replace the rule's (null removes an optional one:
/// a cap, an expiry); the result must be a valid rule, as for POST.
/// A new threshold, or enabling a disabled threshold rule, arms it and
/// judges it at once. A schedule whose period, anchor or time zone changes
/// looks at its current period again.
#[utoipa::path(
    tag = "topups",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("rule_id" = Uuid, Path, description = "The rule"),
    ),
    request_body(content = Object, description = "Any members of the POST body"),
    responses(
        (status = 200, description = "The rule", body = TopupRuleView),
        (status = 400, description = "Invalid JSON, path, or the rule it would make",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or rule",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It would make a second threshold rule",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[patch("/v1/accounts/{account_id}/topup-rules/{rule_id}")]
async fn update_rule(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
    body: JsonObject<Map<String, Value>>,
) -> Result<HttpResponse, ApiError> {
    let (account, rule) = path.into_inner();
    let account = AccountId(account);
    caller.authorize_admin_on(account)?;
    let patch = body.into_inner();
    let by = Audit::of(&caller);
    let (view, credited) = run_blocking(&state.pool, move |conn| {
        topups::update_rule(conn, &by, account, rule, patch, |merged| {
            from_json_object::<TopupRuleBody>(merged)
        })
    })
    .await?;
    state.metrics.tokens("credited", credited);
    Ok(HttpResponse::Ok().json(view))
}

/// Deletes a top-up rule: it never fires again.
///
/// Its grants and firings keep naming it; a request it opened stays open
/// until the customer's credit answers it or it expires.
#[utoipa::path(
    tag = "topups",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("rule_id" = Uuid, Path, description = "The rule"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or rule",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[delete("/v1/accounts/{account_id}/topup-rules/{rule_id}")]
async fn delete_rule(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
) -> Result<HttpResponse, ApiError> {
    let (account, rule) = path.into_inner();
    let account = AccountId(account);
    caller.authorize_admin_on(account)?;
    let by = Audit::of(&caller);
    run_blocking(&state.pool, move |conn| {
        topups::delete_rule(conn, &by, account, rule)
    })
    .await?;
    Ok(HttpResponse::NoContent().finish())
}
