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
    /// Where to start instead of `after` (not with it): `now` (only what
    /// is listed from now on, without reading the history) or an RFC 3339
    /// instant (the events after the last one created before it, in feed
    /// order). The answer's `next_after` is the cursor to go on with.
    #[param(example = "now")]
    start: Option<String>,
}

/// Where `start` puts the cursor: the last event of the feed (of this
/// account, when filtered) that is listed now (`now`), or the last one
/// created before the instant. `None`: no such event, so the feed's start.
/// Only the `events` table is read (its newest rows, by position), with
/// the feed's own rule of what is listed: transactions older than every
/// one still running.
fn start_cursor(
    conn: &mut diesel::PgConnection,
    start: &str,
    account: Option<Uuid>,
) -> Result<Option<Uuid>, ApiError> {
    use diesel::prelude::*;
    use diesel::sql_types::{Nullable, Timestamptz, Uuid as SqlUuid};

    #[derive(QueryableByName)]
    struct Cursor {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
    }
    let before: Option<chrono::DateTime<chrono::Utc>> = if start == "now" {
        None
    } else {
        Some(
            chrono::DateTime::parse_from_rfc3339(start)
                .map_err(|_| {
                    ApiError::InvalidRequest(
                        "start must be `now` or an RFC 3339 instant (2026-12-05T18:00:00Z)".into(),
                    )
                })?
                .with_timezone(&chrono::Utc),
        )
    };
    let cursor: Option<Cursor> = diesel::sql_query(
        "SELECT id FROM events \
         WHERE txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint \
           AND ($1::uuid IS NULL OR account_id = $1) \
           AND ($2::timestamptz IS NULL OR created_at < $2) \
         ORDER BY txid DESC, seq DESC LIMIT 1",
    )
    .bind::<Nullable<SqlUuid>, _>(account)
    .bind::<Nullable<Timestamptz>, _>(before)
    .get_result(conn)
    .optional()?;
    Ok(cursor.map(|cursor| cursor.id))
}

/// What happened to the money, oldest first.
///
/// In commit order: low balance,
/// top-ups, adjustments, expiries, finished jobs, broken invariants,
/// disabled webhook endpoints. Page with `after` = the previous
/// `next_after`; nothing committed later is ever skipped. `start=now`
/// begins at the end of the feed without reading its history (a watcher
/// that wants only what comes), `start=<instant>` after the last event
/// created before that instant.
#[utoipa::path(
    tag = "events",
    params(EventQuery),
    responses(
        (status = 200, description = "The next events (possibly none); `next_after` is the next \
                                      call's `after`", body = EventPage),
        (status = 400, description = "Invalid cursor, limit, type, account, wait_seconds or start, \
                                      or both after and start",
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
        start,
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
    if after.is_some() && start.is_some() {
        return Err(ApiError::InvalidRequest(
            "give after or start, not both".into(),
        ));
    }
    let after = match start {
        None => after,
        Some(start) => {
            run_blocking(&state.pool, move |conn| start_cursor(conn, &start, account)).await?
        }
    };
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
