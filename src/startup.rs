//! Builds the actix application: shared state, input limits, the route
//! table, and the bound server (port 0 picks a free port, for tests).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::dev::ServiceResponse;
use actix_web::error::{JsonPayloadError, PathError, QueryPayloadError};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::{web, App, HttpRequest, HttpServer, ResponseError};

use crate::config::BODY_LIMIT_BYTES;
use crate::error::ApiError;
use crate::provider::AnyProvider;
use crate::rate_limit::Admitted;
use crate::routes;
use crate::scheduler;
use crate::telemetry;
use crate::worker::{self, Background, WorkerContext};
use tokio_cron_scheduler::JobScheduler;
use tracing::Instrument;

pub use crate::routes::AppState;

fn json_error(error: JsonPayloadError, _request: &HttpRequest) -> actix_web::Error {
    let api_error = match error {
        JsonPayloadError::Overflow { limit }
        | JsonPayloadError::OverflowKnownLength { limit, .. } => {
            ApiError::PayloadTooLarge { limit_bytes: limit }
        }
        JsonPayloadError::ContentType => {
            ApiError::InvalidRequest("Content-Type must be application/json".into())
        }
        JsonPayloadError::Deserialize(error) => {
            ApiError::InvalidRequest(format!("invalid JSON body: {error}"))
        }
        other => ApiError::InvalidRequest(format!("invalid JSON body: {other}")),
    };
    api_error.into()
}

/// Safety net: an error answered by actix itself (an oversized raw body, a
/// malformed request) becomes problem+json like every other error.
fn problem_json_for_framework_errors<B>(
    response: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = response
        .response()
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/problem+json"));
    if is_problem {
        return Ok(ErrorHandlerResponse::Response(
            response.map_into_left_body(),
        ));
    }
    let status = response.status();
    let error = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge {
            limit_bytes: BODY_LIMIT_BYTES,
        },
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => ApiError::NotFound("route"),
        StatusCode::SERVICE_UNAVAILABLE => ApiError::Unavailable(status.to_string()),
        status if status.is_server_error() => ApiError::Internal(status.to_string()),
        status => ApiError::InvalidRequest(format!("the request was refused ({status})")),
    };
    let (request, _) = response.into_parts();
    let response = ServiceResponse::new(request, error.error_response());
    Ok(ErrorHandlerResponse::Response(
        response.map_into_right_body(),
    ))
}

/// Outside CORS: a preflight it refuses (an origin not in
/// `CORS_ALLOWED_ORIGINS`, a method or header the API does not use) is a
/// plain-text 400 from actix-cors; it becomes problem+json like every other
/// refusal. Everything else reached it as problem+json already.
fn problem_json_for_cors_refusals<B>(
    response: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = response
        .response()
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/problem+json"));
    if is_problem || response.status() != StatusCode::BAD_REQUEST {
        return problem_json_for_framework_errors(response);
    }
    let error = ApiError::InvalidRequest(
        "CORS preflight refused: the page's origin is not one of CORS_ALLOWED_ORIGINS, or it \
         asked for a method or header the API does not take"
            .into(),
    );
    let (request, _) = response.into_parts();
    let response = ServiceResponse::new(request, error.error_response());
    Ok(ErrorHandlerResponse::Response(
        response.map_into_right_body(),
    ))
}

/// CORS (`CORS_ALLOWED_ORIGINS`): exact origins only, never `*`, no
/// credentials (keys travel in `Authorization`, never in cookies). A
/// preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered
/// for every path with the methods and request headers the API takes; the
/// response headers a client reads are exposed. Off (no origins): the
/// middleware is not installed at all.
fn cors(origins: &[String]) -> actix_cors::Cors {
    let mut cors = actix_cors::Cors::default()
        .allowed_methods(["GET", "HEAD", "POST", "PATCH", "DELETE"])
        .allowed_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            header::IF_NONE_MATCH,
            header::HeaderName::from_static("idempotency-key"),
            header::HeaderName::from_static(telemetry::REQUEST_ID_HEADER),
        ])
        .expose_headers([
            header::LOCATION,
            header::ETAG,
            header::RETRY_AFTER,
            header::CONTENT_DISPOSITION,
            header::HeaderName::from_static("idempotent-replayed"),
            header::HeaderName::from_static(telemetry::REQUEST_ID_HEADER),
        ])
        .max_age(600);
    for origin in origins {
        cors = cors.allowed_origin(origin);
    }
    cors
}

/// Authentication failures per client address (`AuthFailureGuard`): a
/// blocked client is answered 429 before any handler runs (so before any
/// database lookup), unless it presents a key whose secret this replica
/// has verified. Every key is throttled, the bootstrap admin key included;
/// a failure certain before any lookup (a key that is neither the
/// bootstrap key nor well formed) is counted before the answer, every
/// other `/v1` answer with a key afterwards (a 401 counts against the
/// address); a request with no key never counts.
fn guard_authentication_failures<S>(
    request: actix_web::dev::ServiceRequest,
    service: &S,
) -> futures_util::future::LocalBoxFuture<'static, Result<ServiceResponse, actix_web::Error>>
where
    S: actix_web::dev::Service<
        actix_web::dev::ServiceRequest,
        Response = ServiceResponse,
        Error = actix_web::Error,
    >,
    S::Future: 'static,
{
    use futures_util::FutureExt;
    let state = request.app_data::<web::Data<AppState>>().cloned();
    let guarded = state
        .filter(|_| request.path().starts_with("/v1/"))
        .and_then(|state| {
            let presented = routes::presented_to_the_guard(&state, request.request());
            // Bytes, not text: one non-ASCII byte must not drop the line.
            let lines: Vec<&[u8]> = request
                .headers()
                .get_all(state.auth_guard.forwarded_header().name())
                .map(|value| value.as_bytes())
                .collect();
            let client = state
                .auth_guard
                .client_address(request.peer_addr().map(|peer| peer.ip()), &lines)?;
            Some((state, client, presented))
        });
    let Some((state, client, presented)) = guarded else {
        return service
            .call(request)
            .map(|response| {
                let response = response?;
                if let Some(state) = response.request().app_data::<web::Data<AppState>>() {
                    let status = response.status().as_u16();
                    routes::remember_verified_by_the_answer(state, response.request(), status);
                }
                Ok(response)
            })
            .boxed_local();
    };
    let admitted = match state.auth_guard.admit(client, &presented) {
        Ok(admitted) => admitted,
        Err(retry_after_seconds) => {
            state
                .metrics
                .auth_failures_total
                .with_label_values(&["throttled"])
                .inc();
            let response = ApiError::AddressThrottled {
                retry_after_seconds,
            }
            .error_response();
            return std::future::ready(Ok(request.into_response(response))).boxed_local();
        }
    };
    let response = service.call(request);
    async move {
        let response = response.await?;
        let status = response.status().as_u16();
        if status == 401 {
            state
                .metrics
                .auth_failures_total
                .with_label_values(&["unauthorized"])
                .inc();
        }
        if admitted == Admitted::ByTheAnswer {
            state.auth_guard.record(client, status);
        }
        routes::remember_verified_by_the_answer(&state, response.request(), status);
        Ok(response)
    }
    .boxed_local()
}

/// Replaces the request's path by its canonical form
/// (`request_path::canonical`) before anything reads it; `Err` is the 400
/// to answer instead.
fn canonicalise_path(request: &mut actix_web::dev::ServiceRequest) -> Result<(), ApiError> {
    let canonical =
        crate::request_path::canonical(request.path()).map_err(ApiError::InvalidRequest)?;
    let Some(path) = canonical else {
        return Ok(());
    };
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|_| ApiError::InvalidRequest("the path is not a valid URI path".into()))?,
    );
    let uri = actix_web::http::Uri::from_parts(parts)
        .map_err(|_| ApiError::InvalidRequest("the path is not a valid URI path".into()))?;
    request.match_info_mut().get_mut().update(&uri);
    request.head_mut().uri = uri;
    Ok(())
}

/// `HEAD` on a `GET` route answers as `GET` would, without the body (RFC
/// 9110 §9.3.2): the request is routed as `GET`, and actix's HTTP layer,
/// which saw `HEAD`, sends the headers (`Content-Length` included) only.
/// Other methods are untouched, so `HEAD` on a `POST`-only route is still
/// refused.
fn head_as_get<S>(mut request: actix_web::dev::ServiceRequest, service: &S) -> S::Future
where
    S: actix_web::dev::Service<actix_web::dev::ServiceRequest>,
{
    if request.method() == actix_web::http::Method::HEAD {
        request.head_mut().method = actix_web::http::Method::GET;
    }
    service.call(request)
}

fn path_error(error: PathError, _request: &HttpRequest) -> actix_web::Error {
    ApiError::InvalidRequest(format!("invalid path parameter: {error}")).into()
}

fn query_error(error: QueryPayloadError, _request: &HttpRequest) -> actix_web::Error {
    ApiError::InvalidRequest(format!("invalid query string: {error}")).into()
}

/// Binds the listener and returns the server (not yet running) and its
/// address. Signals are handled by the caller, which drains the workers
/// before stopping the server.
pub fn build_server(state: Arc<AppState>, workers: usize) -> anyhow::Result<(Server, SocketAddr)> {
    let listener = TcpListener::bind(&state.config.bind_addr)
        .map_err(|error| anyhow::anyhow!("binding {}: {error}", state.config.bind_addr))?;
    let address = listener.local_addr()?;
    let grace = state.config.shutdown_grace_seconds;
    let cors_origins = state
        .config
        .cors_origins()
        .map_err(|error| anyhow::anyhow!(error))?;
    let data = web::Data::from(state);
    let server = HttpServer::new(move || {
        App::new()
            .wrap_fn(head_as_get)
            .wrap_fn(guard_authentication_failures)
            .wrap(ErrorHandlers::new().default_handler(problem_json_for_framework_errors))
            .wrap(actix_web::middleware::Condition::new(
                !cors_origins.is_empty(),
                cors(&cors_origins),
            ))
            .wrap(ErrorHandlers::new().default_handler(problem_json_for_cors_refusals))
            .wrap_fn(|mut request, service| {
                // The canonical path first (every check below reads it),
                // then request id, log line and metrics; metrics are
                // labelled by route pattern, never by the raw path.
                let started = std::time::Instant::now();
                let refused = canonicalise_path(&mut request).err();
                let route = request
                    .match_pattern()
                    .unwrap_or_else(|| "unmatched".to_owned());
                let method = telemetry::method_label(request.method());
                let request_id = telemetry::request_id_from(
                    request
                        .headers()
                        .get(telemetry::REQUEST_ID_HEADER)
                        .and_then(|v| v.to_str().ok()),
                );
                let metrics = request
                    .app_data::<web::Data<AppState>>()
                    .map(|state| Arc::clone(&state.metrics));
                let header_value = header::HeaderValue::from_str(&request_id).ok();
                let span = telemetry::request_span(&request_id, method, &route);
                let response = telemetry::sync_scope(request_id.clone(), || match refused {
                    Some(error) => {
                        futures_util::future::Either::Left(std::future::ready(Ok(request
                            .into_response(error.error_response())
                            .map_into_right_body())))
                    }
                    None => futures_util::future::Either::Right(actix_web::dev::Service::call(
                        service, request,
                    )),
                });
                let response = telemetry::scope(request_id, response);
                async move {
                    let mut response = response.await?;
                    if let Some(value) = header_value {
                        response.headers_mut().insert(
                            header::HeaderName::from_static(telemetry::REQUEST_ID_HEADER),
                            value,
                        );
                    }
                    let status = response.status().as_u16();
                    let elapsed = started.elapsed();
                    if let Some(metrics) = metrics {
                        let status = status.to_string();
                        metrics
                            .http_requests_total
                            .with_label_values(&[method, &route, &status])
                            .inc();
                        metrics
                            .http_request_duration_seconds
                            .with_label_values(&[&route])
                            .observe(elapsed.as_secs_f64());
                    }
                    tracing::info!(
                        status,
                        elapsed_ms = elapsed.as_secs_f64() * 1000.0,
                        "served"
                    );
                    Ok(response)
                }
                .instrument(span)
            })
            .app_data(data.clone())
            .app_data(
                web::JsonConfig::default()
                    .limit(BODY_LIMIT_BYTES)
                    .error_handler(json_error),
            )
            .app_data(web::PayloadConfig::default().limit(BODY_LIMIT_BYTES))
            .app_data(web::PathConfig::default().error_handler(path_error))
            .app_data(web::QueryConfig::default().error_handler(query_error))
            .configure(routes::configure)
            .default_service(web::to(routes::not_found))
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(grace)
    .listen(listener)?
    .run();
    Ok((server, address))
}

/// One running replica: the HTTP server, the background workers and the
/// scheduled reaper.
pub struct Replica {
    pub state: Arc<AppState>,
    pub server: Server,
    pub address: SocketAddr,
    pub background: Background,
    pub scheduler: JobScheduler,
}

/// Runs the start-up reaper pass, then binds the server and starts the
/// workers and the scheduled reaper: the first request is served on a
/// database that the pass has made consistent.
pub async fn start_replica(
    state: Arc<AppState>,
    provider: AnyProvider,
    http_workers: usize,
) -> anyhow::Result<Replica> {
    let settings = scheduler::settings(&state.config);
    // A failed pass is logged and counted inside; the schedule retries it.
    // (`serve` only gets here after migrating, so the database was up.)
    let _ = scheduler::reaper_pass(state.pool.clone(), settings, Arc::clone(&state.metrics)).await;
    let context = Arc::new(WorkerContext {
        pool: state.pool.clone(),
        read_replica: state.read_replica.clone(),
        config: state.config.clone(),
        provider: Arc::new(provider),
        signals: Arc::clone(&state.signals),
        metrics: Arc::clone(&state.metrics),
        rate_limiter: Arc::clone(&state.rate_limiter),
        auth_guard: Arc::clone(&state.auth_guard),
        replica: format!(
            "replica-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        coalescer: Arc::clone(&state.coalescer),
    });
    let (server, address) = build_server(Arc::clone(&state), http_workers)?;
    let background = worker::start(context);
    let scheduler = scheduler::start(
        state.pool.clone(),
        &state.config,
        Arc::clone(&state.metrics),
    )
    .await?;
    Ok(Replica {
        state,
        server,
        address,
        background,
        scheduler,
    })
}

/// Waits for SIGTERM or SIGINT and names it (never returns when the
/// handlers cannot be installed).
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    }
}
