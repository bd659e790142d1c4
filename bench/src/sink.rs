//! A webhook receiver for benchmarks: answers every POST 204 at once and
//! counts deliveries and distinct `webhook-id`s (`GET /count`). It checks
//! no signature (the tests do that, with an independent library): it is
//! here to cost the machine as little as possible while the service is
//! measured beside it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

#[derive(Default)]
struct Counts {
    received: AtomicU64,
    ids: Mutex<HashSet<String>>,
}

async fn receive(counts: web::Data<Counts>, request: HttpRequest) -> HttpResponse {
    counts.received.fetch_add(1, Ordering::Relaxed);
    if let Some(id) = request
        .headers()
        .get("webhook-id")
        .and_then(|id| id.to_str().ok())
    {
        counts
            .ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.to_owned());
    }
    HttpResponse::NoContent().finish()
}

async fn count(counts: web::Data<Counts>) -> HttpResponse {
    let distinct = counts
        .ids
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len();
    HttpResponse::Ok().json(serde_json::json!({
        "received": counts.received.load(Ordering::Relaxed),
        "distinct": distinct,
    }))
}

/// Serves until stopped (SIGINT / SIGTERM).
pub async fn run_sink(bind: &str) -> anyhow::Result<()> {
    let counts = web::Data::new(Counts::default());
    HttpServer::new(move || {
        App::new()
            .app_data(counts.clone())
            .route("/count", web::get().to(count))
            .default_service(web::post().to(receive))
    })
    .workers(1)
    .bind(bind)?
    .run()
    .await?;
    Ok(())
}
