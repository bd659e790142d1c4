//! Finance reconciliation: JSON, or CSV with `Accept: text/csv`.

use actix_web::http::header;
use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::State;
use crate::db::read_replica::run_read_blocking;
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::history;
use crate::domain::reconciliation::{reconcile, report_period, to_csv, InstantParam, Report};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(get_reconciliation);
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PeriodQuery {
    /// Start of the period, included: a date `YYYY-MM-DD` (its midnight UTC)
    /// or an RFC 3339 timestamp. Default: 30 days before `to`.
    #[param(
        value_type = Option<InstantParam>,
        example = "2026-11-01"
    )]
    from: Option<String>,
    /// End of the period, excluded: a date `YYYY-MM-DD` (its midnight UTC) or
    /// an RFC 3339 timestamp. Default: now. At most 366 days after `from`.
    #[param(
        value_type = Option<InstantParam>,
        example = "2026-12-01"
    )]
    to: Option<String>,
    /// Only this account.
    account_id: Option<Uuid>,
}

/// The finance report of a period (finance or admin).
///
/// The books of `[from, to)`, per account and in total, in tokens, with
/// every instant in UTC. `Accept: text/csv` answers CSV, one line per
/// account, as a download named after the period
/// (`reconciliation_2026-11-01_2026-12-01.csv`). docs/finance.md explains
/// every figure.
#[utoipa::path(
    tag = "reconciliation",
    params(PeriodQuery),
    responses(
        (status = 200, description = "The report", content(
            (Report = "application/json"),
            (String = "text/csv"),
        ), headers(
            ("Content-Disposition" = String, description = "CSV only: `attachment; \
             filename=\"reconciliation_<from>_<to>.csv\"`"),
        )),
        (status = 400, description = "Invalid query: timestamps, `from` not before `to`, \
         period too long", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A kiosk key cannot read the books",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed`: `to` is not closed yet (a \
         transaction that began before it is still running and may still write into the \
         period); the service waited a second for it; retry after `Retry-After`",
         body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/reconciliation")]
async fn get_reconciliation(
    caller: Caller,
    state: State,
    query: web::Query<PeriodQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let PeriodQuery {
        from,
        to,
        account_id,
    } = query.into_inner();
    let (from, to) = report_period(from.as_deref(), to.as_deref())?;
    // The horizon is the primary's (its writers run there): the period must
    // be closed there (else 409 instant_not_closed), and a read replica
    // answers only once it has replayed that far; a replica that lags
    // behind it leaves the report to the primary.
    let horizon = run_blocking(&state.pool, move |conn| {
        history::closed_at_lsn(conn, to.min(chrono::Utc::now()))
    })
    .await?;
    let report = run_read_blocking(&state.pool, state.read_replica.as_deref(), move |conn| {
        if !history::replayed_to(conn, &horizon)? {
            return Ok(None);
        }
        reconcile(conn, from, to, account_id).map(Some)
    })
    .await?;
    let report = match report {
        Some(report) => report,
        None => {
            run_blocking(&state.pool, move |conn| {
                reconcile(conn, from, to, account_id)
            })
            .await?
        }
    };
    Ok(csv_or_json(
        &request,
        report.csv_file_name(),
        || to_csv(&report),
        &report,
    ))
}

/// A report's answer: CSV, as a download named `file_name`, when the
/// request's `Accept` asks for `text/csv`; else JSON.
pub(crate) fn csv_or_json(
    request: &HttpRequest,
    file_name: String,
    csv: impl FnOnce() -> String,
    json: &impl serde::Serialize,
) -> HttpResponse {
    let wants_csv = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/csv"));
    if wants_csv {
        HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .insert_header(header::ContentDisposition {
                disposition: header::DispositionType::Attachment,
                parameters: vec![header::DispositionParam::Filename(file_name)],
            })
            .body(csv())
    } else {
        HttpResponse::Ok().json(json)
    }
}
