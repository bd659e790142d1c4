//! Webhook endpoints (admin): create, list, read, change, delete, rotate
//! the secret, the delivery log, and redelivery of an event.

use actix_web::{delete, get, patch, post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{created, JsonObject, State};
use crate::db::run_blocking;
use crate::db::states::EventType;
use crate::domain::api_keys::Caller;
use crate::domain::audit::Audit;
use crate::error::{ApiError, Problem};
use crate::webhooks::endpoints::{
    self, parse_description, parse_event_types, parse_limit, AttemptPage, DeliveryView,
    EndpointChange, EndpointPage, EndpointView, EndpointWithSecret, NewEndpoint,
};
use crate::webhooks::url_guard::check_url;

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_endpoint)
        .service(list_endpoints)
        .service(get_endpoint)
        .service(update_endpoint)
        .service(delete_endpoint)
        .service(rotate_secret)
        .service(list_attempts)
        .service(redeliver);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateEndpoint {
    /// Where to POST events: an http(s) URL resolving to a public address
    /// (unless `WEBHOOK_ALLOW_PRIVATE_URLS=true`).
    #[schema(max_length = 2000, example = "https://ops.example.com/token-billing")]
    url: String,
    /// The event types to send, at least one.
    #[schema(min_items = 1, example = json!(["account.balance_low", "credit.created"]))]
    events: Vec<EventType>,
    /// Only this account's events; absent: every account's.
    account_id: Option<Uuid>,
    #[schema(max_length = 500)]
    description: Option<String>,
}

/// Creates an endpoint (admin). The answer holds its signing secret, shown
/// only this once.
#[utoipa::path(
    tag = "webhooks",
    request_body = CreateEndpoint,
    responses(
        (status = 201, description = "The endpoint and its secret (shown once)",
         body = EndpointWithSecret,
         headers(("Location" = String, description = "The endpoint's URL"))),
        (status = 400, description = "Invalid JSON, URL (or a non-public address), event type \
                                      or description",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/webhook-endpoints")]
async fn create_endpoint(
    caller: Caller,
    state: State,
    body: JsonObject<CreateEndpoint>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let CreateEndpoint {
        url,
        events,
        account_id,
        description,
    } = body.into_inner();
    let url = check_url(&url, state.config.webhook_allow_private_urls)
        .await
        .map_err(ApiError::InvalidRequest)?;
    let new = NewEndpoint {
        url: url.to_string(),
        events: parse_event_types(&events)?,
        account_id,
        description: parse_description(description)?,
    };
    let by = Audit::of(&caller);
    let endpoint = run_blocking(&state.pool, move |conn| endpoints::create(conn, &by, new)).await?;
    Ok(created(
        format!("/v1/webhook-endpoints/{}", endpoint.endpoint.endpoint_id),
        &endpoint,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct EndpointListQuery {
    /// Endpoints after this `endpoint_id`: the previous page's `next_after`.
    after: Option<Uuid>,
    /// Endpoints per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// The endpoints, oldest first (admin); secrets are never listed.
#[utoipa::path(
    tag = "webhooks",
    params(EndpointListQuery),
    responses(
        (status = 200, description = "One page of endpoints", body = EndpointPage),
        (status = 400, description = "Invalid cursor or limit",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/webhook-endpoints")]
async fn list_endpoints(
    caller: Caller,
    state: State,
    query: web::Query<EndpointListQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let EndpointListQuery { after, limit } = query.into_inner();
    let limit = parse_limit(limit)?;
    let page = run_blocking(&state.pool, move |conn| endpoints::list(conn, after, limit)).await?;
    Ok(HttpResponse::Ok().json(page))
}

/// One endpoint (admin).
#[utoipa::path(
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint")),
    responses(
        (status = 200, description = "The endpoint", body = EndpointView),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/webhook-endpoints/{endpoint_id}")]
async fn get_endpoint(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let endpoint = path.into_inner();
    let view = run_blocking(&state.pool, move |conn| endpoints::get(conn, endpoint)).await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateEndpoint {
    #[schema(max_length = 2000)]
    url: Option<String>,
    #[schema(min_items = 1)]
    events: Option<Vec<EventType>>,
    #[schema(max_length = 500)]
    description: Option<String>,
    /// false stops deliveries (they wait); true resumes them and forgets a
    /// failure streak.
    enabled: Option<bool>,
}

/// Changes an endpoint (admin): URL, events, description, enabled.
#[utoipa::path(
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint")),
    request_body = UpdateEndpoint,
    responses(
        (status = 200, description = "The changed endpoint", body = EndpointView),
        (status = 400, description = "Invalid JSON, path, URL, event type or description",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[patch("/v1/webhook-endpoints/{endpoint_id}")]
async fn update_endpoint(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<UpdateEndpoint>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let endpoint = path.into_inner();
    let UpdateEndpoint {
        url,
        events,
        description,
        enabled,
    } = body.into_inner();
    let url = match url {
        None => None,
        Some(url) => Some(
            check_url(&url, state.config.webhook_allow_private_urls)
                .await
                .map_err(ApiError::InvalidRequest)?
                .to_string(),
        ),
    };
    let change = EndpointChange {
        url,
        events: events.as_deref().map(parse_event_types).transpose()?,
        description: parse_description(description)?,
        enabled,
    };
    let by = Audit::of(&caller);
    let view = run_blocking(&state.pool, move |conn| {
        endpoints::update(conn, &by, endpoint, change)
    })
    .await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Deletes an endpoint (admin): nothing more is sent to it.
#[utoipa::path(
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[delete("/v1/webhook-endpoints/{endpoint_id}")]
async fn delete_endpoint(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let endpoint = path.into_inner();
    let by = Audit::of(&caller);
    run_blocking(&state.pool, move |conn| {
        endpoints::delete(conn, &by, endpoint)
    })
    .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A new signing secret (admin), shown this once; the previous one keeps
/// signing beside it for 24 hours.
#[utoipa::path(
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint")),
    responses(
        (status = 200, description = "The endpoint and its new secret (shown once)",
         body = EndpointWithSecret),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/webhook-endpoints/{endpoint_id}/rotate-secret")]
async fn rotate_secret(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let endpoint = path.into_inner();
    let by = Audit::of(&caller);
    let rotated = run_blocking(&state.pool, move |conn| {
        endpoints::rotate_secret(conn, &by, endpoint)
    })
    .await?;
    Ok(HttpResponse::Ok().json(rotated))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AttemptQuery {
    /// Attempts after this `attempt_id`: the previous page's `next_after`.
    /// Absent or 0: from the oldest attempt kept. Refused (400) once retention
    /// has deleted attempts of this endpoint after it.
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Attempts per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// Every delivery attempt to the endpoint, oldest first (admin): the event,
/// when, the status code or the error, the latency.
///
/// Pages go by `attempt_id`: pass each page's `next_after` as `after`.
/// Retention (`RETENTION_WEBHOOK_ATTEMPTS`, 30 days by default) deletes
/// finished deliveries with all their attempts, and a redelivered old
/// delivery's attempts can have ids above a reader's cursor. Once retention
/// has deleted an attempt of this endpoint with an `attempt_id` above
/// `after`, that cursor is answered 400 `invalid_request` whose `detail`
/// says so, never with a page that silently skips attempts: the deleted
/// attempts are in the archive (`ARCHIVE_DIR/webhook_attempts/`, when
/// `ARCHIVE_DIR` is set); start again without `after` to read from the
/// oldest attempt kept. Another endpoint's retention never refuses this
/// endpoint's cursor.
#[utoipa::path(
    tag = "webhooks",
    params(("endpoint_id" = Uuid, Path, description = "The endpoint"), AttemptQuery),
    responses(
        (status = 200, description = "One page of attempts", body = AttemptPage),
        (status = 400, description = "Invalid path, cursor or limit; or a cursor (after) that \
                                      retention has overtaken: attempts of this endpoint after it \
                                      were deleted (RETENTION_WEBHOOK_ATTEMPTS; ARCHIVE_DIR keeps \
                                      them), start again without after",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/webhook-endpoints/{endpoint_id}/deliveries")]
async fn list_attempts(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<AttemptQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let endpoint = path.into_inner();
    let AttemptQuery { after, limit } = query.into_inner();
    if after.is_some_and(|after| after < 0) {
        return Err(ApiError::InvalidRequest(
            "after must be a non-negative attempt cursor".into(),
        ));
    }
    let limit = parse_limit(limit)?;
    let page = run_blocking(&state.pool, move |conn| {
        endpoints::attempts(conn, endpoint, after, limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
}

/// Sends an event to the endpoint again as soon as possible (admin).
#[utoipa::path(
    tag = "webhooks",
    params(
        ("endpoint_id" = Uuid, Path, description = "The endpoint"),
        ("event_id" = Uuid, Path, description = "The event"),
    ),
    responses(
        (status = 202, description = "The delivery, pending again", body = DeliveryView),
        (status = 400, description = "Invalid path",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint, or no such event for it",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/webhook-endpoints/{endpoint_id}/events/{event_id}/redeliver")]
async fn redeliver(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let (endpoint, event) = path.into_inner();
    let by = Audit::of(&caller);
    let delivery = run_blocking(&state.pool, move |conn| {
        endpoints::redeliver(conn, &by, endpoint, event)
    })
    .await?;
    Ok(HttpResponse::Accepted().json(delivery))
}
