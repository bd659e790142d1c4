//! The audit log (admin and finance).

use actix_web::{get, web, HttpResponse};
use serde::Deserialize;

use super::State;
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::audit::{self, AuditFilter, AuditPage};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(list_audit_events);
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// Events after this cursor: the previous page's `next_after`.
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Events per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only events of this target: `account:<account_id>` or
    /// `api_key:<key_id>`.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    target: Option<String>,
}

/// Who changed what, oldest first (admin, finance): account creations and
/// changes, key creations and revocations, credits and adjustments.
#[utoipa::path(
    tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, description = "One page of events; `next_after` is the next page's \
                                      `after`, null on the last page", body = AuditPage),
        (status = 400, description = "Invalid cursor, limit or target",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A kiosk key",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/audit-events")]
async fn list_audit_events(
    caller: Caller,
    state: State,
    query: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let AuditQuery {
        after,
        limit,
        target,
    } = query.into_inner();
    let filter = AuditFilter::parse(after, limit, target)?;
    let page = run_blocking(&state.pool, move |conn| audit::list_events(conn, &filter)).await?;
    Ok(HttpResponse::Ok().json(page))
}
