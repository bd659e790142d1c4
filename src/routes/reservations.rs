//! Reservations: reserve, read, commit, release, extend.

use actix_web::{get, post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{after_key_check, created, optional_json_body, replayed, JsonObject, State};

use crate::db::models::ReservationRow;
use crate::db::run_blocking;
use crate::domain::api_keys::{Caller, Credentials};
use crate::domain::batches::{ReserveItem, ResolveItem};
use crate::domain::reservations::{self, Outcome, ReservationView, ReserveRequest};
use crate::domain::types::{AccountId, RequestId, ReservationId, Tokens, TtlSeconds};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_reservation)
        .service(get_reservation)
        .service(commit_reservation)
        .service(release_reservation)
        .service(extend_reservation);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateReservation {
    /// The kiosk's idempotency key: the same id and amount replay.
    request_id: Uuid,
    amount: Tokens,
    /// Default: the service's `RESERVATION_TTL_SECONDS`.
    ttl_seconds: Option<TtlSeconds>,
}

fn respond(row: ReservationRow, outcome: Outcome) -> HttpResponse {
    let view = ReservationView::from(row);
    match outcome {
        Outcome::Created => HttpResponse::Ok().json(view),
        Outcome::Replayed => replayed(&view),
    }
}

/// Reserves tokens: 201 new, 200 + `Idempotent-Replayed` for a replay.
#[utoipa::path(
    tag = "reservations",
    params(("account_id" = Uuid, Path, description = "The account")),
    request_body = CreateReservation,
    responses(
        (status = 201, description = "Reserved", body = ReservationView,
         headers(("Location" = String, description = "The reservation's URL"))),
        (status = 200, description = "A replay of the same request: nothing new was reserved",
         body = ReservationView,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, description = "Invalid JSON, path, amount or TTL",
         body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "Not enough available tokens (`available`, `reserved`)",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A finance key cannot spend",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The account is suspended",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`request_id` already used for a different reservation",
         body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many held reservations (`max_active_reservations`)",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/reservations")]
async fn create_reservation(
    credentials: Credentials,
    state: State,
    path: Result<web::Path<Uuid>, actix_web::Error>,
    body: Result<JsonObject<CreateReservation>, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let account = AccountId(
        after_key_check(&state, &credentials, path)
            .await?
            .into_inner(),
    );
    let CreateReservation {
        request_id,
        amount,
        ttl_seconds,
    } = after_key_check(&state, &credentials, body)
        .await?
        .into_inner();
    let request = ReserveRequest {
        request_id: RequestId(request_id),
        amount,
        ttl_seconds,
    };
    let item = ReserveItem {
        credentials,
        request,
    };
    let (row, outcome) = state.coalescer.reserve(account, item).await?;
    let view = ReservationView::from(row);
    Ok(match outcome {
        Outcome::Created => created(
            format!(
                "/v1/accounts/{account}/reservations/{}",
                view.reservation_id
            ),
            &view,
        ),
        Outcome::Replayed => replayed(&view),
    })
}

/// One reservation, in whatever state.
#[utoipa::path(
    tag = "reservations",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("reservation_id" = Uuid, Path, description = "The reservation"),
    ),
    responses(
        (status = 200, description = "The reservation", body = ReservationView),
        (status = 400, description = "An id is not a UUID",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or reservation, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/reservations/{reservation_id}")]
async fn get_reservation(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
) -> Result<HttpResponse, ApiError> {
    let (account, reservation) = path.into_inner();
    let (account, reservation) = (AccountId(account), ReservationId(reservation));
    caller.authorize_read(account)?;
    let row = run_blocking(&state.pool, move |conn| {
        reservations::get_reservation(conn, account, reservation)
    })
    .await?;
    Ok(HttpResponse::Ok().json(ReservationView::from(row)))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CommitBody {
    /// Tokens to spend, at most the amount held. Default: all held.
    amount: Option<Tokens>,
}

/// Spends `amount` (default: all held); the rest goes back to available.
///
/// The body may be empty.
#[utoipa::path(
    tag = "reservations",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("reservation_id" = Uuid, Path, description = "The reservation"),
    ),
    request_body(content = Option<CommitBody>, description = "Optional: empty means commit all"),
    responses(
        (status = 200, description = "Committed; with `Idempotent-Replayed: true` a replay of \
         the same commit", body = ReservationView,
         headers(("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 400, description = "Invalid JSON or path, or more than is held",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A finance key cannot spend",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or reservation, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not held any more (`state`), or owned by a job",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/reservations/{reservation_id}/commit")]
async fn commit_reservation(
    credentials: Credentials,
    state: State,
    path: Result<web::Path<(Uuid, Uuid)>, actix_web::Error>,
    body: Result<web::Bytes, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let (account, reservation) = after_key_check(&state, &credentials, path)
        .await?
        .into_inner();
    let body = after_key_check(&state, &credentials, body).await?;
    let amount = optional_json_body::<CommitBody>(&body).map_err(actix_web::Error::from);
    let amount = after_key_check(&state, &credentials, amount).await?.amount;
    resolve(
        state,
        credentials,
        AccountId(account),
        ReservationId(reservation),
        amount,
        false,
    )
    .await
}

/// A commit or a release: one statement in the common case (or one
/// transaction for concurrent ones on the account), the full path (which
/// answers replays and explains refusals) otherwise.
async fn resolve(
    state: State,
    credentials: Credentials,
    account: AccountId,
    reservation: ReservationId,
    amount: Option<Tokens>,
    release: bool,
) -> Result<HttpResponse, actix_web::Error> {
    let item = ResolveItem {
        credentials,
        reservation,
        amount,
        release,
    };
    let (row, outcome) = state.coalescer.resolve(account, item).await?;
    Ok(respond(row, outcome))
}

/// Returns all held tokens to available. Any body is ignored.
#[utoipa::path(
    tag = "reservations",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("reservation_id" = Uuid, Path, description = "The reservation"),
    ),
    responses(
        (status = 200, description = "Released; with `Idempotent-Replayed: true` a replay of \
         the same release", body = ReservationView,
         headers(("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 400, description = "An id is not a UUID",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A finance key cannot spend",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or reservation, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not held any more (`state`), or owned by a job",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/reservations/{reservation_id}/release")]
async fn release_reservation(
    credentials: Credentials,
    state: State,
    path: Result<web::Path<(Uuid, Uuid)>, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let (account, reservation) = after_key_check(&state, &credentials, path)
        .await?
        .into_inner();
    resolve(
        state,
        credentials,
        AccountId(account),
        ReservationId(reservation),
        None,
        true,
    )
    .await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    ttl_seconds: TtlSeconds,
}

/// Heartbeat: the reservation now expires `ttl_seconds` from now.
#[utoipa::path(
    tag = "reservations",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("reservation_id" = Uuid, Path, description = "The reservation"),
    ),
    request_body = ExtendBody,
    responses(
        (status = 200, description = "Extended", body = ReservationView),
        (status = 400, description = "Invalid JSON, path or TTL",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A finance key cannot spend",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or reservation, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not held any more (`state`; an expired one is expired \
         now), or owned by a job", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/reservations/{reservation_id}/extend")]
async fn extend_reservation(
    caller: Caller,
    state: State,
    path: web::Path<(Uuid, Uuid)>,
    body: JsonObject<ExtendBody>,
) -> Result<HttpResponse, ApiError> {
    let (account, reservation) = path.into_inner();
    let (account, reservation) = (AccountId(account), ReservationId(reservation));
    caller.authorize_spend(account)?;
    let ttl = body.into_inner().ttl_seconds;
    let actor = caller.actor();
    let row = run_blocking(&state.pool, move |conn| {
        reservations::extend(conn, account, reservation, ttl, &actor)
    })
    .await?;
    Ok(HttpResponse::Ok().json(ReservationView::from(row)))
}
