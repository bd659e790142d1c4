//! Logging and request ids.
//!
//! Logs go to stderr, so that a command's result alone is on stdout. They
//! are human-readable text by default, coloured only when stderr is a
//! terminal and `NO_COLOR` is unset, JSON lines with `LOG_FORMAT=json`;
//! `RUST_LOG` overrides the filter. Every request gets an
//! id — the client's `X-Request-Id` when it is a sane token, else a new
//! UUID — which is echoed in the `X-Request-Id` response header, written
//! into problem+json bodies, and carried by the request's log span. Logs
//! never contain headers, and every line passes through
//! `secrets::ScrubbingWriter`, so no API key or password reaches them.

use std::future::Future;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use uuid::Uuid;

use crate::config::LogFormat;

pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Longest client-supplied request id kept.
const REQUEST_ID_LENGTH_MAX: usize = 64;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The filter without `RUST_LOG`: INFO, but the scheduler crate's own INFO
/// lines (its state machine's `Uninited` → `Inited` at every start) only
/// from WARN up; the service logs its schedules itself.
pub const DEFAULT_FILTER: &str = "info,tokio_cron_scheduler=warn";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::secrets::ScrubbingWriter)
        .with_ansi(colour_wanted(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_target(true);
    // A second init (tests, embedding) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
pub fn colour_wanted(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
}

/// The id of the request being served on this task, if any.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// The client's id when it is 1–64 characters of `[A-Za-z0-9._-]`, else a
/// new one: a client cannot inject anything into logs or headers.
/// A request's method as the metrics and the access log name it: one of
/// the methods HTTP defines, or `other`. The method is the client's to
/// choose (any token is a method), so writing it as sent would let anyone
/// without a key grow the metrics' label set and the log without bound.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

pub fn request_id_from(header: Option<&str>) -> String {
    header
        .filter(|id| {
            !id.is_empty()
                && id.len() <= REQUEST_ID_LENGTH_MAX
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
        .map_or_else(|| Uuid::new_v4().to_string(), str::to_owned)
}

/// The span of one request: every log line of the request carries its id.
pub fn request_span(request_id: &str, method: &str, route: &str) -> tracing::Span {
    tracing::info_span!("request", request_id = %request_id, method = %method, route = %route)
}

/// Runs `start` (which builds the request's future) with the request id in
/// scope: an error rendered while building can name the request.
pub fn sync_scope<R>(request_id: String, start: impl FnOnce() -> R) -> R {
    REQUEST_ID.sync_scope(request_id, start)
}

/// Runs `future` with the request id in scope: an error rendered anywhere
/// inside can name the request.
pub fn scope<F: Future>(request_id: String, future: F) -> impl Future<Output = F::Output> {
    REQUEST_ID.scope(request_id, future)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Instrument;

    #[test]
    fn keeps_sane_client_ids_only() {
        assert_eq!(request_id_from(Some("kiosk-7.retry_2")), "kiosk-7.retry_2");
        for bad in ["", "has space", "new\nline", &"x".repeat(65)] {
            let id = request_id_from(Some(bad));
            assert_ne!(id, bad);
            assert!(Uuid::parse_str(&id).is_ok());
        }
        assert!(Uuid::parse_str(&request_id_from(None)).is_ok());
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some("".into())));
        assert!(!colour_wanted(true, Some("1".into())));
        assert!(!colour_wanted(false, None));
    }

    #[tokio::test]
    async fn the_id_is_visible_inside_the_scope_only() {
        assert_eq!(current_request_id(), None);
        let seen = scope("abc".into(), async { current_request_id() })
            .instrument(request_span("abc", "GET", "/x"))
            .await;
        assert_eq!(seen.as_deref(), Some("abc"));
    }
}
