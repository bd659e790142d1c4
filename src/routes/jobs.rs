//! Generation jobs: create (idempotent on the kiosk's request_id), read
//! (optionally waiting for a terminal status), list.

use std::time::Duration;

use actix_web::{get, post, web, HttpResponse};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::{after_key_check, created, replayed, JsonObject, State};
use crate::config::{JOB_PAGE_DEFAULT, JOB_PAGE_MAX, JOB_WAIT_SECONDS_MAX};
use crate::db::run_blocking;
use crate::db::states::{parse_param, JobStatus};
use crate::domain::api_keys::{Caller, Credentials};
use crate::domain::jobs::{self, JobPage, JobRequest, JobView};
use crate::domain::paging::page_limit;
use crate::engine::types::{AccountId, RequestId};
use crate::engine::{Authority, Op, Operation, Replay};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_job)
        .service(get_job)
        .service(list_jobs);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateJob {
    /// The kiosk's idempotency key: the same id, kind and params replay.
    request_id: Uuid,
    /// A kind from the service's price list (`PRICE_LIST`); its price is the
    /// job's cost. `/openapi.json` lists this replica's kinds.
    kind: String,
    /// The provider's parameters, handed over as sent: a JSON object of at
    /// most 16 KiB serialized, at most 32 levels deep, with no U+0000
    /// anywhere.
    #[schema(value_type = Object)]
    params: Value,
}

/// Creates a generation job and reserves its cost.
///
/// 201 + `Location` for a new job; 200 + `Idempotent-Replayed` for a
/// replay, also while the first request is still in flight.
#[utoipa::path(
    tag = "jobs",
    params(("account_id" = Uuid, Path, description = "The account paying for the job")),
    request_body = CreateJob,
    responses(
        (status = 201, description = "Queued, its cost reserved", body = JobView,
         headers(("Location" = String, description = "The job's URL"))),
        (status = 200, description = "A replay of the same request: no new job", body = JobView,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, description = "Invalid JSON or path, unknown kind, params not an object \
         or too large", body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "Not enough available tokens for the cost",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A finance key cannot spend",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The account is suspended",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`request_id` already used for a different job",
         body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many held reservations (`max_active_reservations`)",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/jobs")]
async fn create_job(
    credentials: Credentials,
    state: State,
    path: Result<web::Path<Uuid>, actix_web::Error>,
    body: Result<JsonObject<CreateJob>, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let account = AccountId(
        after_key_check(&state, &credentials, path)
            .await?
            .into_inner(),
    );
    let CreateJob {
        request_id,
        kind,
        params,
    } = after_key_check(&state, &credentials, body)
        .await?
        .into_inner();
    let request = JobRequest::parse(RequestId(request_id), kind, params, &state.prices)
        .map_err(actix_web::Error::from);
    let request = after_key_check(&state, &credentials, request).await?;
    let operation = Operation {
        account,
        authority: Authority::from(credentials),
        op: Op::CreateJob {
            request,
            ttl_seconds: state.config.reservation_ttl_seconds,
        },
    };
    let (operation, answer) = state.coalescer.submit(operation).await;
    let (view, replay) = answer?.into_job(&operation)?;
    Ok(match replay {
        Replay::Created => {
            // Best effort: an idle worker polls anyway within WORKER_IDLE_POLL.
            state.signals.queued.notify_one();
            created(format!("/v1/accounts/{account}/jobs/{request_id}"), &view)
        }
        Replay::Replayed => replayed(&view),
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    /// Wait up to this long for a terminal status. Default 0: answer now.
    #[param(minimum = 0, maximum = 30)]
    wait_seconds: Option<u64>,
}

/// One job, optionally waiting for it to finish.
///
/// The job; with `wait_seconds`, answers as soon as it is terminal (or when
/// the wait ends). The wait holds no database connection.
#[utoipa::path(
    tag = "jobs",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        ("request_id" = Uuid, Path, description = "The job's `request_id`"),
        WaitQuery,
    ),
    responses(
        (status = 200, description = "The job, terminal or as it is when the wait ends",
         body = JobView),
        (status = 400, description = "Invalid path or `wait_seconds`",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account or job, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/jobs/{request_id}")]
async fn get_job(
    credentials: Credentials,
    state: State,
    path: Result<web::Path<(Uuid, Uuid)>, actix_web::Error>,
    query: Result<web::Query<WaitQuery>, actix_web::Error>,
) -> Result<HttpResponse, actix_web::Error> {
    let (account, request_id) = after_key_check(&state, &credentials, path)
        .await?
        .into_inner();
    let (account, request_id) = (AccountId(account), RequestId(request_id));
    let wait = after_key_check(&state, &credentials, query)
        .await?
        .wait_seconds
        .unwrap_or(0);
    if wait > JOB_WAIT_SECONDS_MAX {
        let error = Err(ApiError::InvalidRequest(format!(
            "wait_seconds must be at most {JOB_WAIT_SECONDS_MAX}"
        ))
        .into());
        return after_key_check(&state, &credentials, error).await;
    }
    let fetch = || {
        run_blocking(&state.pool, move |conn| {
            jobs::get_job(conn, account, request_id)
        })
    };
    // The key is verified in the same trip to the pool as the first read.
    let recheck = credentials.clone();
    let view = run_blocking(&state.pool, move |conn| {
        credentials.verify(conn)?.authorize_read(account)?;
        jobs::get_job(conn, account, request_id)
    })
    .await?;
    if wait == 0 || view.is_terminal() {
        return Ok(HttpResponse::Ok().json(view));
    }
    // Subscribe before looking again, so a finish in between is not missed.
    let finished = state.signals.subscribe(view.job_id);
    let view = fetch().await?;
    if view.is_terminal() {
        return Ok(HttpResponse::Ok().json(view));
    }
    let _ = tokio::time::timeout(Duration::from_secs(wait), finished).await;
    // After the wait the key is verified again, with the last read: a key
    // revoked while this request waited gets 401, not the job.
    let view = run_blocking(&state.pool, move |conn| {
        recheck.verify(conn)?;
        jobs::get_job(conn, account, request_id)
    })
    .await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Only jobs in this status: `queued`, `running`, `succeeded` or `failed`.
    #[param(pattern = "^(queued|running|succeeded|failed)$")]
    status: Option<String>,
    /// Jobs per page, default 50.
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// Jobs older than this `job_id`: the previous page's `next_after`.
    after: Option<Uuid>,
}

/// The account's jobs, newest first.
///
/// `next_after` continues the list.
#[utoipa::path(
    tag = "jobs",
    params(("account_id" = Uuid, Path, description = "The account"), ListQuery),
    responses(
        (status = 200, description = "One page of jobs", body = JobPage),
        (status = 400, description = "Invalid path, `status`, `limit` or `after`",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/jobs")]
async fn list_jobs(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let ListQuery {
        status,
        limit,
        after,
    } = query.into_inner();
    let status = status
        .map(|status| parse_param("status", &status, JobStatus::ALL, JobStatus::parse))
        .transpose()?;
    let limit = page_limit(limit, JOB_PAGE_DEFAULT, JOB_PAGE_MAX)?;
    let page = run_blocking(&state.pool, move |conn| {
        crate::domain::accounts::get_account(conn, account)?;
        jobs::list_jobs(conn, account, status, after, limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
}
