//! Liveness and readiness.

use actix_web::{get, web, HttpResponse};
use serde_json::json;

use super::State;
use crate::db::{migrations_applied, run_blocking};
use crate::error::ApiError;

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(healthz)
        .service(readyz)
        .service(metrics_endpoint);
}

/// The process is up.
#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Prometheus text exposition.
#[get("/metrics")]
async fn metrics_endpoint(state: State) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

/// Ready for traffic: accepting work, database reachable, migrations applied.
#[get("/readyz")]
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    if !state.is_accepting() {
        return Err(ApiError::Unavailable("shutting down".into()));
    }
    let applied = run_blocking(&state.pool, migrations_applied).await?;
    if !applied {
        return Err(ApiError::Unavailable("migrations pending".into()));
    }
    Ok(HttpResponse::Ok().json(json!({"status": "ready"})))
}
