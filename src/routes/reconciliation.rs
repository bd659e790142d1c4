//! Finance reconciliation: JSON, or CSV with `Accept: text/csv`.

use actix_web::http::header;
use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::State;
use crate::config::{RECONCILIATION_RANGE_DEFAULT, RECONCILIATION_RANGE_MAX};
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::reconciliation::{parse_period, reconcile, to_csv};
use crate::error::ApiError;

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(get_reconciliation);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeriodQuery {
    from: Option<String>,
    to: Option<String>,
    account_id: Option<Uuid>,
}

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
    let (from, to) = parse_period(
        from.as_deref(),
        to.as_deref(),
        chrono::Utc::now(),
        RECONCILIATION_RANGE_DEFAULT,
        RECONCILIATION_RANGE_MAX,
    )?;
    let report = run_blocking(&state.pool, move |conn| {
        reconcile(conn, from, to, account_id)
    })
    .await?;
    let wants_csv = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/csv"));
    Ok(if wants_csv {
        HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .body(to_csv(&report))
    } else {
        HttpResponse::Ok().json(report)
    })
}
