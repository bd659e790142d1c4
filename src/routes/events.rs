//! The event feed (admin and finance: every account; a kiosk key: its own).

use std::time::Duration;

use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use tokio::time::Instant;
use uuid::Uuid;

use super::{recheck_key, State};
use crate::config::{JOB_WAIT_SECONDS_MAX, JOB_WATCH_POLL};
use crate::db::run_blocking;
use crate::domain::api_keys::{Caller, Scope};
use crate::domain::events::{self, EventFilter, EventPage};
use crate::engine::types::AccountId;
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(list_events);
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct EventQuery {
    /// Events after this one: the previous answer's `next_after`.
    after: Option<Uuid>,
    /// Events per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only events of this type.
    #[param(
        rename = "type",
        pattern = "^(account\\.balance_low|account\\.balance_recovered|account\\.balance_depleted|credit\\.created|adjustment\\.created|reservation\\.expired|grant\\.expired|grant\\.expiring|topup\\.granted|topup\\.requested|topup\\.request_expired|topup\\.cap_reached|job\\.succeeded|job\\.failed|invariant\\.violated|endpoint\\.disabled)$"
    )]
    #[serde(rename = "type")]
    event_type: Option<String>,
    /// Only this account's events (a kiosk key sees only its own account's).
    account_id: Option<Uuid>,
    /// When nothing new has committed, wait up to this many seconds for
    /// something (long poll; no connection is held while waiting).
    #[param(minimum = 0, maximum = 30)]
    wait_seconds: Option<u64>,
}

/// What happened to the money, oldest first.
///
/// In commit order: low balance,
/// top-ups, adjustments, expiries, finished jobs, broken invariants,
/// disabled webhook endpoints. Page with `after` = the previous
/// `next_after`; nothing committed later is ever skipped.
#[utoipa::path(
    tag = "events",
    params(EventQuery),
    responses(
        (status = 200, description = "The next events (possibly none); `next_after` is the next \
                                      call's `after`", body = EventPage),
        (status = 400, description = "Invalid cursor, limit, type, account or wait_seconds",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Another account than the kiosk key's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/events")]
async fn list_events(
    caller: Caller,
    state: State,
    request: HttpRequest,
    query: web::Query<EventQuery>,
) -> Result<HttpResponse, ApiError> {
    let EventQuery {
        after,
        limit,
        event_type,
        account_id,
        wait_seconds,
    } = query.into_inner();
    let account = match (caller.scope, account_id) {
        (Scope::Kiosk, None) => Some(caller.account_id.ok_or(ApiError::Forbidden)?.0),
        (_, Some(account)) => {
            caller.authorize_read(AccountId(account))?;
            Some(account)
        }
        (_, None) => None,
    };
    let wait = wait_seconds.unwrap_or(0);
    if wait > JOB_WAIT_SECONDS_MAX {
        return Err(ApiError::InvalidRequest(format!(
            "wait_seconds must be at most {JOB_WAIT_SECONDS_MAX}"
        )));
    }
    let filter = EventFilter::parse(after, limit, event_type.as_deref(), account)?;
    let deadline = Instant::now() + Duration::from_secs(wait);
    let mut waited = false;
    let for_kiosk = caller.scope == Scope::Kiosk;
    loop {
        let filter = filter.clone();
        let page = run_blocking(&state.pool, move |conn| {
            let page = events::list_events(conn, &filter)?;
            if for_kiosk {
                events::as_kiosk_sees_it(conn, page)
            } else {
                Ok(page)
            }
        })
        .await?;
        if !page.events.is_empty() || Instant::now() >= deadline {
            if waited {
                // The key may have been revoked while this request waited.
                recheck_key(&state, &request).await?;
            }
            return Ok(HttpResponse::Ok().json(page));
        }
        waited = true;
        // Between looks no connection is held.
        tokio::time::sleep_until((Instant::now() + JOB_WATCH_POLL).min(deadline)).await;
    }
}
