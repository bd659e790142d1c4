//! The operator and finance console at `/console`: a page and its scripts
//! and styles, vendored in `static/console/` and compiled into the binary
//! (no CDN, no Node at run time). The page itself needs no key; everything
//! it shows comes from the public `/v1` API with the key the person signs
//! in with, which the page keeps in the tab's `sessionStorage`.
//!
//! Every answer carries a Content-Security-Policy that allows scripts,
//! styles and requests from this origin only: no inline script, no inline
//! event handler, no `eval`, no framing.

use actix_web::http::header;
use actix_web::{get, web, HttpResponse};

use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(console_page).service(console_asset);
}

/// The policy of every console answer. `img-src data:` is for nothing
/// today but keeps the door open for inline SVG icons; `connect-src 'self'`
/// is the API.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// The console's files: name, content type, bytes.
const ASSETS: [(&str, &str, &[u8]); 11] = [
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("../../static/console/console.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/api.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/dom.js"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/chart.js"),
    ),
    (
        "accounts.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/accounts.js"),
    ),
    (
        "account.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/account.js"),
    ),
    (
        "period.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/period.js"),
    ),
    (
        "reconciliation.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/reconciliation.js"),
    ),
    (
        "revenue.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/revenue.js"),
    ),
    (
        "system.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/console/system.js"),
    ),
];

const PAGE: &[u8] = include_bytes!("../../static/console/index.html");

fn console_response(content_type: &str, body: &'static [u8]) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // The files are small and carry no version in their names: a
        // browser revalidates them, so an upgrade shows at the next load.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

/// The console: sign in with an admin or finance key.
#[utoipa::path(
    tag = "console",
    responses((status = 200, description = "The console page", body = String,
               content_type = "text/html; charset=utf-8",
               headers(("Content-Security-Policy" = String,
                        description = "Scripts, styles and requests from this origin only")))),
)]
#[get("/console")]
async fn console_page() -> HttpResponse {
    console_response("text/html; charset=utf-8", PAGE)
}

/// A script or style sheet of the console; any other name is 404.
#[utoipa::path(
    tag = "console",
    params(("file" = String, Path,
            description = "`app.js`, `api.js`, `dom.js`, `chart.js`, `accounts.js`, \
                           `account.js`, `period.js`, `reconciliation.js`, `revenue.js`, \
                           `system.js` or `console.css`")),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/javascript"),
            (String = "text/css"),
        )),
        (status = 400, description = "A name with a percent-escape of anything but a letter, \
                                        digit, `-`, `.`, `_` or `~` (every path is read in its \
                                        canonical form first)", body = Problem,
         content_type = "application/problem+json"),
        (status = 404, description = "Not a console file", body = Problem,
         content_type = "application/problem+json"),
    ),
)]
#[get("/console/{file}")]
async fn console_asset(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (_, content_type, bytes) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file.as_str())
        .ok_or(ApiError::NotFound("file"))?;
    Ok(console_response(content_type, bytes))
}
