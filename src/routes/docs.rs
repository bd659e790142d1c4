//! The API's own documentation: the OpenAPI document at `/openapi.json`
//! and Swagger UI at `/docs`. No API key, like the probes: the document
//! holds no secret. Swagger UI is vendored in `static/swagger-ui/` and
//! compiled into the binary, so nothing is downloaded at build or run time
//! and the UI works on a kiosk network with no way out.

use actix_web::http::header;
use actix_web::{get, web, HttpResponse};

use crate::error::{ApiError, Problem};
use crate::openapi;

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(openapi_json)
        .service(swagger_ui)
        // `/docs/`, as people type it, is the same page (an alias, not an
        // operation of the document).
        .route("/docs/", web::get().to(swagger_ui_page))
        .service(swagger_ui_asset);
}

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(
    tag = "docs",
    responses(
        (status = 200, description = "The document", body = Object,
         content_type = "application/json"),
        (status = 500, description = "The document could not be serialized", body = Problem,
         content_type = "application/problem+json"),
    ),
)]
#[get("/openapi.json")]
async fn openapi_json(state: super::State) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(openapi::document_with_prices(&state.prices)?))
}

/// Swagger UI reads `/openapi.json`; `validatorUrl: null` because the
/// default validator badge would call swagger.io from the browser.
const SWAGGER_UI_PAGE: &str = r##"<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>token-billing API</title>
  <link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({
      url: "/openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      validatorUrl: null
    });
  </script>
</body>
</html>
"##;

/// Swagger UI on this API's document.
#[utoipa::path(
    tag = "docs",
    responses((status = 200, description = "The Swagger UI page", body = String,
               content_type = "text/html; charset=utf-8")),
)]
#[get("/docs")]
async fn swagger_ui() -> HttpResponse {
    swagger_ui_page().await
}

async fn swagger_ui_page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(SWAGGER_UI_PAGE)
}

/// The vendored files, as shipped in the npm package `swagger-ui-dist`.
const ASSETS: [(&str, &str, &[u8]); 3] = [
    (
        "swagger-ui-bundle.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../static/swagger-ui/swagger-ui-bundle.js"),
    ),
    (
        "swagger-ui.css",
        "text/css; charset=utf-8",
        include_bytes!("../../static/swagger-ui/swagger-ui.css"),
    ),
    (
        "LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../../static/swagger-ui/LICENSE"),
    ),
];

/// A Swagger UI file: only the vendored ones; any other name is 404.
#[utoipa::path(
    tag = "docs",
    params(("file" = String, Path,
            description = "`swagger-ui-bundle.js`, `swagger-ui.css` or `LICENSE`")),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/javascript"),
            (String = "text/css"),
            (String = "text/plain"),
        )),
        (status = 400, description = "A name with a percent-escape of anything but a letter, \
                                        digit, `-`, `.`, `_` or `~` (every path is read in its \
                                        canonical form first)", body = Problem,
         content_type = "application/problem+json"),
        (status = 404, description = "Not a vendored file", body = Problem,
         content_type = "application/problem+json"),
    ),
)]
#[get("/docs/{file}")]
async fn swagger_ui_asset(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (_, content_type, bytes) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file.as_str())
        .ok_or(ApiError::NotFound("file"))?;
    Ok(HttpResponse::Ok()
        .content_type(*content_type)
        // The names carry no version: a day bounds how long a browser keeps
        // an old copy after an upgrade of the vendored files.
        .insert_header((header::CACHE_CONTROL, "public, max-age=86400"))
        .body(*bytes))
}
