//! Usage per key of one account (admin, finance; a kiosk key sees its own
//! usage alone): JSON, or CSV with `Accept: text/csv`.

use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::State;
use crate::db::run_blocking;
use crate::domain::api_keys::{Caller, Scope};
use crate::domain::reconciliation::{report_period, InstantParam};
use crate::domain::usage::{to_csv, usage, GroupBy, UsageReport};
use crate::engine::types::AccountId;
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(get_usage);
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    /// Start of the period, included: a date `YYYY-MM-DD` (its midnight
    /// UTC) or an RFC 3339 timestamp. Default: 30 days before `to`.
    #[param(value_type = Option<InstantParam>, example = "2026-11-01")]
    from: Option<String>,
    /// End of the period, excluded. Default: now. At most 366 days after
    /// `from`.
    #[param(value_type = Option<InstantParam>, example = "2026-12-01")]
    to: Option<String>,
    /// One line per key (default), per job kind, or per UTC day.
    #[param(value_type = Option<GroupBy>)]
    group_by: Option<GroupBy>,
}

/// Usage per key of an account in a period (admin, finance, or a kiosk
/// key for its own usage alone).
///
/// Tokens reserved, used, released and expired, and jobs succeeded and
/// failed, per key (a reservation's entries count for the key that made
/// it), per job kind or per UTC day, counted from the ledger. Only closed
/// instants are answered (the reconciliation's horizon). `Accept:
/// text/csv` answers CSV (`usage_<from>_<to>.csv`). docs/fleet.md explains
/// every figure.
#[utoipa::path(
    tag = "accounts",
    params(("account_id" = Uuid, Path, description = "The account"), UsageQuery),
    responses(
        (status = 200, description = "The report", content(
            (UsageReport = "application/json"),
            (String = "text/csv"),
        ), headers(
            ("Content-Disposition" = String, description = "CSV only: `attachment; \
             filename=\"usage_<from>_<to>.csv\"`"),
        )),
        (status = 400, description = "Invalid query: timestamps, `group_by`, `from` not \
         before `to`, period too long", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed`: `to` is not closed yet; retry \
         after `Retry-After`", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/usage")]
async fn get_usage(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<UsageQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let UsageQuery { from, to, group_by } = query.into_inner();
    let (from, to) = report_period(from.as_deref(), to.as_deref())?;
    // A kiosk key sees its own usage alone.
    let only_key = match caller.scope {
        Scope::Kiosk => Some(caller.key_id.ok_or(ApiError::Forbidden)?.0),
        Scope::Admin | Scope::Finance => None,
    };
    let report = run_blocking(&state.pool, move |conn| {
        crate::domain::accounts::get_account(conn, account)?;
        usage(
            conn,
            account.0,
            from,
            to,
            group_by.unwrap_or_default(),
            only_key,
        )
    })
    .await?;
    Ok(super::reconciliation::csv_or_json(
        &request,
        report.csv_file_name(),
        || to_csv(&report),
        &report,
    ))
}
