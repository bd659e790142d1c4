//! CORS (`CORS_ALLOWED_ORIGINS`): off by default; for the listed origins,
//! a preflight of every route is answered with the methods and headers the
//! API takes, answers expose the headers a client reads; other origins get
//! nothing a browser would accept. The browser itself: tests/cors/run.sh.

use reqwest::{Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

const KIOSK_ORIGIN: &str = "http://kiosk.example.test:5173";
const OTHER_ORIGIN: &str = "https://evil.example.test";

async fn app_with_cors() -> TestApp {
    TestApp::spawn_with_flags(&[
        "--cors-allowed-origins",
        "http://kiosk.example.test:5173,https://kiosk.example.com",
    ])
    .await
}

async fn preflight(
    app: &TestApp,
    path: &str,
    origin: &str,
    method: &str,
    headers: &str,
) -> reqwest::Response {
    app.client
        .request(Method::OPTIONS, app.url(path))
        .header("Origin", origin)
        .header("Access-Control-Request-Method", method)
        .header("Access-Control-Request-Headers", headers)
        .send()
        .await
        .expect("sent")
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|value| value.to_str().expect("ASCII").to_owned())
}

fn listed(value: Option<String>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(|item| item.trim().to_ascii_lowercase())
        .filter(|item| !item.is_empty())
        .collect()
}

#[tokio::test]
async fn off_by_default_no_cors_header_and_preflight_is_405() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let path = format!("/v1/accounts/{account}/jobs");
    let response = preflight(&app, &path, KIOSK_ORIGIN, "POST", "authorization").await;
    assert!(header(&response, "access-control-allow-origin").is_none());
    let (status, body) = problem(response).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["code"], "method_not_allowed");

    let response = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .bearer_auth(ADMIN_KEY)
        .header("Origin", KIOSK_ORIGIN)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(header(&response, "access-control-allow-origin").is_none());
    assert!(header(&response, "access-control-expose-headers").is_none());
}

/// Every route of the document answers a preflight for each of its
/// methods, with the headers the API takes.
#[tokio::test]
async fn every_route_answers_a_preflight_from_an_allowed_origin() {
    let app = app_with_cors().await;
    let document: serde_json::Value = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let id = Uuid::new_v4().to_string();
    let mut checked = 0;
    for (template, item) in document["paths"].as_object().expect("paths") {
        let path = template
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    id.as_str()
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        for method in item.as_object().expect("item").keys() {
            let method = method.to_ascii_uppercase();
            let response = preflight(
                &app,
                &path,
                KIOSK_ORIGIN,
                &method,
                "authorization,content-type,idempotency-key,if-none-match,x-request-id",
            )
            .await;
            assert_eq!(response.status(), StatusCode::OK, "{method} {template}");
            assert_eq!(
                header(&response, "access-control-allow-origin").as_deref(),
                Some(KIOSK_ORIGIN),
                "{method} {template}"
            );
            assert!(
                listed(header(&response, "access-control-allow-methods"))
                    .contains(&method.to_ascii_lowercase()),
                "{method} {template}"
            );
            let allowed_headers = listed(header(&response, "access-control-allow-headers"));
            for name in [
                "authorization",
                "content-type",
                "idempotency-key",
                "if-none-match",
                "x-request-id",
            ] {
                assert!(
                    allowed_headers.contains(&name.to_owned()),
                    "{method} {template}: {name} in {allowed_headers:?}"
                );
            }
            assert!(header(&response, "access-control-allow-credentials").is_none());
            assert!(listed(header(&response, "vary")).contains(&"origin".to_owned()));
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} operations");
}

#[tokio::test]
async fn answers_to_an_allowed_origin_expose_the_headers_a_client_reads() {
    let app = app_with_cors().await;
    let account = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();
    let body = json!({"request_id": request_id, "kind": "standard", "params": {"prompt": "a cat"}});
    for expected in ["201", "200"] {
        let response = app
            .client
            .post(app.url(&format!("/v1/accounts/{account}/jobs")))
            .bearer_auth(&kiosk)
            .header("Origin", KIOSK_ORIGIN)
            .json(&body)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status().as_str(), expected);
        assert_eq!(
            header(&response, "access-control-allow-origin").as_deref(),
            Some(KIOSK_ORIGIN)
        );
        let exposed = listed(header(&response, "access-control-expose-headers"));
        for name in [
            "location",
            "etag",
            "retry-after",
            "idempotent-replayed",
            "x-request-id",
        ] {
            assert!(exposed.contains(&name.to_owned()), "{name} in {exposed:?}");
        }
    }
    // Errors carry the headers too: a page can read a refusal's problem.
    let response = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .bearer_auth("tbk_not_a_key")
        .header("Origin", KIOSK_ORIGIN)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        header(&response, "access-control-allow-origin").as_deref(),
        Some(KIOSK_ORIGIN)
    );
    let (status, _) = problem(response).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn another_origin_a_strange_method_or_header_is_refused_as_problem_json() {
    let app = app_with_cors().await;
    let account = app.funded_account(5).await;
    let path = format!("/v1/accounts/{account}/jobs");
    for (origin, method, headers) in [
        (OTHER_ORIGIN, "POST", "authorization"),
        // The same host on another port or scheme is another origin.
        ("http://kiosk.example.test:5174", "POST", "authorization"),
        ("https://kiosk.example.test:5173", "POST", "authorization"),
        (KIOSK_ORIGIN, "PUT", "authorization"),
        (KIOSK_ORIGIN, "POST", "authorization,x-secret-debug"),
    ] {
        let response = preflight(&app, &path, origin, method, headers).await;
        assert!(
            header(&response, "access-control-allow-origin").is_none(),
            "{origin} {method} {headers}"
        );
        let (status, body) = problem(response).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{origin} {method} {headers}"
        );
        assert_eq!(body["code"], "invalid_request");
        assert!(
            body["detail"].as_str().unwrap_or_default().contains("CORS"),
            "{body}"
        );
    }
    // An ordinary request from another origin is served (CORS is not
    // authentication), without a header that would let a browser read it.
    let response = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .bearer_auth(ADMIN_KEY)
        .header("Origin", OTHER_ORIGIN)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(header(&response, "access-control-allow-origin").is_none());
    // An OPTIONS that is not a preflight is still 405 with Allow.
    let response = app
        .client
        .request(Method::OPTIONS, app.url(&path))
        .send()
        .await
        .expect("sent");
    let (status, _) = problem(response).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}
