//! Liveness, readiness and metrics: no API key, so probes and scrapers need
//! no secret.

use actix_web::{get, web, HttpResponse};
use serde::Serialize;

use super::State;
use crate::db::{migrations_applied, run_blocking};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(healthz)
        .service(readyz)
        .service(metrics_endpoint);
}

/// The body of a successful probe.
#[derive(Serialize, utoipa::ToSchema)]
struct ProbeStatus {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    status: &'static str,
}

/// The process is up.
#[utoipa::path(
    tag = "health",
    responses((status = 200, description = "Up", body = ProbeStatus,
               example = json!({"status": "ok"}))),
)]
#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(ProbeStatus { status: "ok" })
}

/// Prometheus text exposition.
#[utoipa::path(
    tag = "health",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String,
               content_type = "text/plain; version=0.0.4; charset=utf-8")),
)]
#[get("/metrics")]
async fn metrics_endpoint(state: State) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

/// Ready for traffic: accepting work, database reachable, migrations applied.
#[utoipa::path(
    tag = "health",
    responses(
        (status = 200, description = "Ready", body = ProbeStatus,
         example = json!({"status": "ready"})),
        (status = 500, description = "Internal error", body = Problem,
         content_type = "application/problem+json"),
        (status = 503, description = "Shutting down, database unreachable or migrations \
         pending", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
)]
#[get("/readyz")]
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    if !state.is_accepting() {
        return Err(ApiError::Unavailable("shutting down".into()));
    }
    let applied = run_blocking(&state.pool, migrations_applied).await?;
    if !applied {
        return Err(ApiError::Unavailable("migrations pending".into()));
    }
    Ok(HttpResponse::Ok().json(ProbeStatus { status: "ready" }))
}
