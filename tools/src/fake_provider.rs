//! `token-billing-tools fake-provider`: the fake backend served over the `http`
//! provider protocol, with real network faults (a 503, a request that never
//! answers, a connection dropped after the prediction was created).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde::Deserialize;
use serde_json::{json, Value};

use token_billing::provider::fake::{prediction_json, FakeBackend, SubmitOutcome};

/// Where `token-billing-tools fake-provider` listens by default: a port
/// that neither the service (8080) nor compose's Prometheus (9090) and
/// Grafana (3000) use, so all of them run side by side.
pub const DEFAULT_BIND: &str = "127.0.0.1:8090";

#[derive(Deserialize)]
struct SubmitBody {
    input: Value,
}

async fn create_prediction(
    backend: web::Data<FakeBackend>,
    request: HttpRequest,
    body: web::Json<SubmitBody>,
) -> HttpResponse {
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
    else {
        return HttpResponse::BadRequest()
            .json(json!({"error": "Idempotency-Key header is required"}));
    };
    match backend.submit(key, &body.input) {
        SubmitOutcome::Accepted(prediction) => {
            HttpResponse::Created().json(prediction_json(&prediction))
        }
        SubmitOutcome::Unavailable => {
            HttpResponse::ServiceUnavailable().json(json!({"error": "simulated provider outage"}))
        }
        SubmitOutcome::Hang => std::future::pending().await,
        SubmitOutcome::DropConnection(_) => {
            // Headers go out, then the body fails: the client sees the
            // connection break after the prediction was created.
            let broken = futures_util::stream::once(async {
                Err::<web::Bytes, std::io::Error>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "simulated drop after success",
                ))
            });
            HttpResponse::Created()
                .content_type("application/json")
                .streaming(broken)
        }
    }
}

async fn get_prediction(backend: web::Data<FakeBackend>, path: web::Path<String>) -> HttpResponse {
    match backend.fetch(&path.into_inner()) {
        Some(prediction) => HttpResponse::Ok().json(prediction_json(&prediction)),
        None => HttpResponse::NotFound().json(json!({"error": "no such prediction"})),
    }
}

async fn stats(backend: web::Data<FakeBackend>) -> HttpResponse {
    HttpResponse::Ok().json(backend.stats())
}

/// Binds the fake provider on `bind` (port 0 picks one).
pub fn build_fake_provider(
    bind: &str,
    backend: Arc<FakeBackend>,
) -> anyhow::Result<(Server, SocketAddr)> {
    let listener =
        TcpListener::bind(bind).map_err(|error| anyhow::anyhow!("binding {bind}: {error}"))?;
    let address = listener.local_addr()?;
    let data = web::Data::from(backend);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(web::JsonConfig::default().limit(64 * 1024))
            .route("/predictions", web::post().to(create_prediction))
            .route("/predictions/{id}", web::get().to(get_prediction))
            .route("/stats", web::get().to(stats))
    })
    .workers(2)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    Ok((server, address))
}
