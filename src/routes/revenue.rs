//! Revenue in money (finance, admin): the period report, JSON or CSV with
//! `Accept: text/csv`, and the deferred balance at an instant.

use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::State;
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::reconciliation::{report_period, InstantParam};
use crate::domain::revenue::{deferred_at, revenue, to_csv, DeferredReport, RevenueReport};
use crate::engine::types::Currency;
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(get_revenue).service(get_deferred);
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct RevenueQuery {
    /// Start of the period, included: a date `YYYY-MM-DD` (its midnight
    /// UTC) or an RFC 3339 timestamp. Default: 30 days before `to`.
    #[param(value_type = Option<InstantParam>, example = "2026-11-01")]
    from: Option<String>,
    /// End of the period, excluded. Default: now. At most 366 days after
    /// `from`.
    #[param(value_type = Option<InstantParam>, example = "2026-12-01")]
    to: Option<String>,
    /// Only this currency (ISO 4217); the unpriced tokens are then left
    /// out (null).
    #[param(value_type = Option<String>, pattern = "^[A-Z]{3}$", example = "EUR")]
    currency: Option<Currency>,
    /// Only this account.
    account_id: Option<Uuid>,
}

/// Revenue of a period, in money (finance or admin).
///
/// Per currency and per account: deferred revenue at `from`, `sales`,
/// `recognized` (tokens used), `breakage` (tokens lapsed), `adjustments`
/// and deferred revenue at `to`, in integer minor units; the same in
/// tokens, and the tokens of unpriced grants, which tie out to the
/// reconciliation of the period. Only closed instants are answered (the
/// reconciliation's horizon). `Accept: text/csv` answers CSV
/// (`revenue_<from>_<to>.csv`). docs/finance.md explains every figure.
#[utoipa::path(
    tag = "reconciliation",
    params(RevenueQuery),
    responses(
        (status = 200, description = "The report", content(
            (RevenueReport = "application/json"),
            (String = "text/csv"),
        ), headers(
            ("Content-Disposition" = String, description = "CSV only: `attachment; \
             filename=\"revenue_<from>_<to>.csv\"`"),
        )),
        (status = 400, description = "Invalid query: timestamps, currency, `from` not before \
         `to`, period too long", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A kiosk key cannot read the books",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed`: `to` is not closed yet; retry \
         after `Retry-After`", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/revenue")]
async fn get_revenue(
    caller: Caller,
    state: State,
    query: web::Query<RevenueQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let RevenueQuery {
        from,
        to,
        currency,
        account_id,
    } = query.into_inner();
    let (from, to) = report_period(from.as_deref(), to.as_deref())?;
    let report = run_blocking(&state.pool, move |conn| {
        revenue(
            conn,
            from,
            to,
            account_id,
            currency.as_ref().map(Currency::as_str),
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

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct DeferredQuery {
    /// The instant: the books before it (a date is its midnight UTC).
    /// Default: now.
    #[param(value_type = Option<InstantParam>, example = "2026-12-01")]
    as_of: Option<String>,
    /// Only this currency (ISO 4217).
    #[param(value_type = Option<String>, pattern = "^[A-Z]{3}$", example = "EUR")]
    currency: Option<Currency>,
    /// Only this account.
    account_id: Option<Uuid>,
}

/// Deferred revenue at an instant, per account and currency (finance or
/// admin): the month-end close's balance of prepaid tokens not yet used or
/// lapsed, in integer minor units. Only closed instants are answered.
#[utoipa::path(
    tag = "reconciliation",
    params(DeferredQuery),
    responses(
        (status = 200, description = "The deferred balances", body = DeferredReport),
        (status = 400, description = "Invalid instant or currency",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A kiosk key cannot read the books",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed`: retry after `Retry-After`",
         body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/revenue/deferred")]
async fn get_deferred(
    caller: Caller,
    state: State,
    query: web::Query<DeferredQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let DeferredQuery {
        as_of,
        currency,
        account_id,
    } = query.into_inner();
    let as_of = match as_of {
        Some(text) => crate::time::instant_of("as_of", &text).map_err(ApiError::InvalidRequest)?,
        None => chrono::Utc::now(),
    };
    let report = run_blocking(&state.pool, move |conn| {
        deferred_at(
            conn,
            as_of,
            account_id,
            currency.as_ref().map(Currency::as_str),
        )
    })
    .await?;
    Ok(HttpResponse::Ok().json(report))
}
