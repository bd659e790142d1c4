//! Reservations: reserve, read, commit, release, extend.

use actix_web::{get, post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{after_key_check, created, optional_json_body, replayed, JsonObject, State};

use crate::config::{RESERVATION_PAGE_DEFAULT, RESERVATION_PAGE_MAX};
use crate::db::models::ReservationRow;
use crate::db::run_blocking;
use crate::db::states::{parse_param, ReservationState};
use crate::domain::api_keys::{Caller, Credentials};
use crate::domain::paging::page_limit;
use crate::domain::reservations::{self, ReservationPage, ReservationView};
use crate::engine::types::{AccountId, RequestId, ReservationId, Tokens, TtlSeconds};
use crate::engine::{Answer, Authority, CommitAmount, Op, Operation, Outcome, Replay};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_reservation)
        .service(get_reservation)
        .service(list_reservations)
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

/// Runs a spending operation through the engine (alone or coalesced with
/// concurrent ones): the reservation it leaves, or the refusal.
async fn spend(
    state: &State,
    credentials: Credentials,
    account: AccountId,
    op: Op,
) -> Result<(ReservationRow, Replay), ApiError> {
    let (operation, answer) = submit(state, credentials, account, op).await?;
    answer.into_reservation(&operation)
}

/// One operation of a caller through the coalescer: the operation, and the
/// engine's answer (before it is turned into a view or an error).
async fn submit(
    state: &State,
    credentials: Credentials,
    account: AccountId,
    op: Op,
) -> Result<(Operation, Answer), ApiError> {
    let operation = Operation {
        account,
        authority: Authority::from(credentials),
        op,
    };
    let (operation, answer) = state.coalescer.submit(operation).await;
    Ok((operation, answer?))
}

fn respond(row: ReservationRow, replay: Replay) -> HttpResponse {
    let view = ReservationView::from(row);
    match replay {
        Replay::Created => HttpResponse::Ok().json(view),
        Replay::Replayed => replayed(&view),
    }
}

/// Reserves tokens.
///
/// 201 when new; 200 with `Idempotent-Replayed: true` for a replay.
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
    let op = Op::Reserve {
        request_id: RequestId(request_id),
        amount,
        ttl_seconds,
        effective_ttl_seconds: ttl_seconds
            .map_or(state.config.reservation_ttl_seconds, TtlSeconds::get),
    };
    let (row, replay) = spend(&state, credentials, account, op).await?;
    let view = ReservationView::from(row);
    Ok(match replay {
        Replay::Created => created(
            format!(
                "/v1/accounts/{account}/reservations/{}",
                view.reservation_id
            ),
            &view,
        ),
        Replay::Replayed => replayed(&view),
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
    let view = run_blocking(&state.pool, move |conn| {
        reservations::get_reservation(conn, account, reservation)
    })
    .await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Only reservations in this state: `held`, `committed`, `released` or `expired`.
    #[param(pattern = "^(held|committed|released|expired)$")]
    state: Option<String>,
    /// Reservations per page, default 50.
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// Reservations older than this `reservation_id`: the previous page's `next_after`.
    after: Option<Uuid>,
}

/// The account's reservations, newest first.
///
/// `next_after` continues the list; `state=held` lists the tokens in flight with their `expires_at`.
#[utoipa::path(
    tag = "reservations",
    params(("account_id" = Uuid, Path, description = "The account"), ListQuery),
    responses(
        (status = 200, description = "One page of reservations", body = ReservationPage),
        (status = 400, description = "Invalid path, `state`, `limit` or `after`",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/reservations")]
async fn list_reservations(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let ListQuery {
        state: wanted,
        limit,
        after,
    } = query.into_inner();
    let wanted = wanted
        .map(|text| {
            parse_param(
                "state",
                &text,
                ReservationState::ALL,
                ReservationState::parse,
            )
        })
        .transpose()?;
    let limit = page_limit(limit, RESERVATION_PAGE_DEFAULT, RESERVATION_PAGE_MAX)?;
    let page = run_blocking(&state.pool, move |conn| {
        crate::domain::accounts::get_account(conn, account)?;
        reservations::list_reservations(conn, account, wanted, after, limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CommitBody {
    /// Tokens to spend, at most the amount held. Default: all held.
    amount: Option<Tokens>,
}

/// Spends held tokens; the rest goes back to available.
///
/// `amount` defaults to all held.
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
    let op = Op::Commit {
        reservation: ReservationId(reservation),
        amount: amount.map_or(CommitAmount::All, CommitAmount::Exactly),
    };
    let (row, replay) = spend(&state, credentials, AccountId(account), op).await?;
    Ok(respond(row, replay))
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
    let op = Op::Release {
        reservation: ReservationId(reservation),
    };
    let (row, replay) = spend(&state, credentials, AccountId(account), op).await?;
    Ok(respond(row, replay))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    ttl_seconds: TtlSeconds,
}

/// Heartbeat: extends a reservation.
///
/// It now expires `ttl_seconds` from now — but never past the earliest
/// `expires_at` of the grants its tokens came from (grant expiry dominates
/// extension): an extension that asks for more is capped there (or keeps
/// the expiry it had, when that is later), and the answer carries
/// `Extension-Capped: grant-expiry`.
#[utoipa::path(
    tag = "reservations",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("reservation_id" = Uuid, Path, description = "The reservation"),
    ),
    request_body = ExtendBody,
    responses(
        (status = 200, description = "Extended; capped at its grants' expiry when \
         `Extension-Capped` is present (`expires_at` shows what it got)", body = ReservationView,
         headers(("Extension-Capped" = String, description = "`grant-expiry` when the \
         extension was capped at the earliest expiry of the grants the reservation drew from"))),
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
    credentials: Credentials,
    state: State,
    path: Result<web::Path<(Uuid, Uuid)>, actix_web::Error>,
    body: Result<JsonObject<ExtendBody>, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let (account, reservation) = after_key_check(&state, &credentials, path)
        .await?
        .into_inner();
    let ttl_seconds = after_key_check(&state, &credentials, body)
        .await?
        .into_inner()
        .ttl_seconds;
    let op = Op::Extend {
        reservation: ReservationId(reservation),
        ttl_seconds,
    };
    let (operation, answer) = submit(&state, credentials, AccountId(account), op).await?;
    let capped = answer.outcome == Outcome::ExtendedCapped;
    let (row, _) = answer.into_reservation(&operation)?;
    let mut response = HttpResponse::Ok();
    if capped {
        response.insert_header(("Extension-Capped", "grant-expiry"));
    }
    Ok(response.json(ReservationView::from(row)))
}
