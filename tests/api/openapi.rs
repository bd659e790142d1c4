use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

/// Every route the application registers, as actix spells the path. The
/// document must list exactly these, and the app must answer each.
const ROUTES: [(&str, &str); 51] = [
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("get", "/docs"),
    ("get", "/docs/{file}"),
    ("post", "/v1/accounts"),
    ("get", "/v1/accounts"),
    ("get", "/v1/accounts/{account_id}"),
    ("patch", "/v1/accounts/{account_id}"),
    ("post", "/v1/accounts/{account_id}/api-keys"),
    ("get", "/v1/accounts/{account_id}/ledger"),
    ("get", "/v1/accounts/{account_id}/grants"),
    ("get", "/v1/accounts/{account_id}/usage"),
    ("post", "/v1/api-keys"),
    ("get", "/v1/api-keys"),
    ("delete", "/v1/api-keys/{key_id}"),
    ("get", "/v1/audit-events"),
    ("post", "/v1/accounts/{account_id}/credits"),
    ("post", "/v1/accounts/{account_id}/adjustments"),
    ("post", "/v1/accounts/{account_id}/topup-rules"),
    ("get", "/v1/accounts/{account_id}/topup-rules"),
    ("get", "/v1/accounts/{account_id}/topup-rules/{rule_id}"),
    ("patch", "/v1/accounts/{account_id}/topup-rules/{rule_id}"),
    ("delete", "/v1/accounts/{account_id}/topup-rules/{rule_id}"),
    ("post", "/v1/accounts/{account_id}/reservations"),
    (
        "get",
        "/v1/accounts/{account_id}/reservations/{reservation_id}",
    ),
    (
        "post",
        "/v1/accounts/{account_id}/reservations/{reservation_id}/commit",
    ),
    (
        "post",
        "/v1/accounts/{account_id}/reservations/{reservation_id}/release",
    ),
    (
        "post",
        "/v1/accounts/{account_id}/reservations/{reservation_id}/extend",
    ),
    ("post", "/v1/accounts/{account_id}/jobs"),
    ("get", "/v1/accounts/{account_id}/jobs/{request_id}"),
    ("get", "/v1/accounts/{account_id}/jobs"),
    ("get", "/v1/reconciliation"),
    ("get", "/v1/revenue"),
    ("get", "/v1/revenue/deferred"),
    ("patch", "/v1/api-keys/{key_id}"),
    ("get", "/v1/events"),
    ("post", "/v1/webhook-endpoints"),
    ("get", "/v1/webhook-endpoints"),
    ("get", "/v1/webhook-endpoints/{endpoint_id}"),
    ("patch", "/v1/webhook-endpoints/{endpoint_id}"),
    ("delete", "/v1/webhook-endpoints/{endpoint_id}"),
    ("post", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
    ("get", "/v1/webhook-endpoints/{endpoint_id}/deliveries"),
    (
        "post",
        "/v1/webhook-endpoints/{endpoint_id}/events/{event_id}/redeliver",
    ),
    ("get", "/v1/accounts/{account_id}/reservations"),
    ("get", "/v1/system/summary"),
    ("get", "/v1/me"),
    ("get", "/console"),
    ("get", "/console/{file}"),
];

/// The codes of `ApiError::code()`.
const PROBLEM_CODES: [&str; 18] = [
    "invalid_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "insufficient_tokens",
    "key_budget_exhausted",
    "reservation_not_held",
    "reservation_owned_by_job",
    "account_suspended",
    "payload_too_large",
    "idempotency_key_reused",
    "too_many_active_reservations",
    "instant_not_closed",
    "threshold_rule_exists",
    "rate_limited",
    "unavailable",
    "internal_error",
];

const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

async fn document(app: &TestApp) -> Value {
    let response = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    response.json().await.expect("the document is JSON")
}

/// Every operation of the document as (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut found = Vec::new();
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            if HTTP_METHODS.contains(&method.as_str()) {
                found.push((method.clone(), path.clone(), operation.clone()));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_is_openapi_3() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().expect("openapi is a string");
    assert!(version.starts_with("3."), "{version}");
    assert_eq!(doc["info"]["title"], "token-billing");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_lists_exactly_the_routes() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    for (method, path) in ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{} {path} is not documented",
            method.to_uppercase()
        );
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect();
    for (method, path, _) in operations(&doc) {
        assert!(
            expected.contains(&(method.clone(), path.clone())),
            "{} {path} is documented but not a route of the app",
            method.to_uppercase()
        );
    }
}

/// The list above is the app's: each (method, path) reaches a handler, not
/// the catch-all "route not found". Random ids and no body make every call
/// a refusal, so nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_route_is_served() {
    let app = TestApp::spawn().await;
    for (method, path) in ROUTES {
        let concrete = path
            .replace("{account_id}", &Uuid::new_v4().to_string())
            .replace("{reservation_id}", &Uuid::new_v4().to_string())
            .replace("{request_id}", &Uuid::new_v4().to_string())
            .replace("{key_id}", &Uuid::new_v4().to_string())
            .replace("{file}", "swagger-ui.css");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        let response = app
            .client
            .request(method.clone(), app.url(&concrete))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .expect("sent");
        if response.status() == StatusCode::NOT_FOUND {
            let (_, body) = problem(response).await;
            assert_ne!(
                body["detail"], "route not found",
                "{method} {concrete} is not served"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_operations_need_a_bearer_key_and_document_401() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let mut checked = 0;
    for (method, path, operation) in operations(&doc) {
        if !path.starts_with("/v1/") {
            continue;
        }
        checked += 1;
        assert!(
            operation["responses"]["401"].is_object(),
            "{method} {path} does not document 401"
        );
        let security = operation["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path} has no security"));
        assert!(
            security
                .iter()
                .any(|requirement| requirement.get("bearer").is_some()),
            "{method} {path} does not require the bearer scheme"
        );
    }
    assert_eq!(checked, 43, "every /v1 operation was checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_response_is_a_problem() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    for (method, path, operation) in operations(&doc) {
        let responses = operation["responses"].as_object().expect("responses");
        for (status, response) in responses {
            let is_error = status.parse::<u16>().map_or(true, |code| code >= 400);
            if !is_error {
                continue;
            }
            // Each status its own problems (openapi_types.rs checks them).
            assert_eq!(
                response["content"]["application/problem+json"]["schema"]["$ref"],
                format!("#/components/schemas/Problem{status}"),
                "{method} {path} {status}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_codes_are_the_api_error_codes() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["Problem"]["properties"]["code"]["$ref"],
        "#/components/schemas/ProblemCode"
    );
    let documented: BTreeSet<&str> = schemas["ProblemCode"]["enum"]
        .as_array()
        .expect("code is an enum")
        .iter()
        .map(|code| code.as_str().expect("a string"))
        .collect();
    let expected: BTreeSet<&str> = PROBLEM_CODES.into_iter().collect();
    assert_eq!(documented, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_is_served_from_vendored_files() {
    let app = TestApp::spawn().await;
    let get = |path: &str| app.client.get(app.url(path)).send();
    let content_type = |response: &reqwest::Response| {
        response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };

    let page = get("/docs").await.expect("sent");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(content_type(&page).starts_with("text/html"));
    let html = page.text().await.expect("text");
    assert!(html.contains("swagger-ui"), "{html}");
    assert!(html.contains("/openapi.json"), "{html}");

    let bundle = get("/docs/swagger-ui-bundle.js").await.expect("sent");
    assert_eq!(bundle.status(), StatusCode::OK);
    assert!(
        content_type(&bundle).contains("javascript"),
        "{}",
        content_type(&bundle)
    );
    let script = bundle.bytes().await.expect("body");
    assert!(script.len() > 100_000, "{} bytes", script.len());
    assert!(String::from_utf8_lossy(&script).contains("SwaggerUIBundle"));

    let css = get("/docs/swagger-ui.css").await.expect("sent");
    assert_eq!(css.status(), StatusCode::OK);
    assert!(content_type(&css).starts_with("text/css"));

    // Only the vendored files: not the README beside them, nor anything else.
    for other in ["/docs/README.md", "/docs/swagger-ui.js"] {
        let (status, body) = problem(get(other).await.expect("sent")).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{other}"
        );
    }
    // An escaped `/` never reaches the file lookup: the path is refused.
    let (status, body) = problem(get("/docs/..%2FCargo.toml").await.expect("sent")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_path_with_another_method_is_405_with_allow() {
    let app = TestApp::spawn().await;
    let response = app
        .client
        .put(app.url("/v1/accounts"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.headers()["allow"], "GET, POST");
    let (status, body) = crate::helpers::problem(response).await;
    assert_eq!(
        (status.as_u16(), body["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    let response = app
        .client
        .delete(app.url(&format!("/v1/accounts/{}", uuid::Uuid::new_v4())))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 405);
    assert_eq!(response.headers()["allow"], "GET, PATCH");
    let (status, _) = crate::helpers::problem(
        app.client
            .get(app.url("/v1/nowhere"))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status.as_u16(), 404);
}

/// A schema by `$ref` (or the `$ref` of a nullable `oneOf`), or the node
/// itself.
fn resolved<'a>(doc: &'a Value, node: &'a Value) -> &'a Value {
    let node = node["oneOf"]
        .as_array()
        .and_then(|choices| choices.iter().find(|choice| choice.get("$ref").is_some()))
        .unwrap_or(node);
    match node["$ref"].as_str() {
        Some(reference) => {
            let name = reference.rsplit('/').next().expect("a name");
            &doc["components"]["schemas"][name]
        }
        None => node,
    }
}

fn enum_of(doc: &Value, node: &Value) -> BTreeSet<String> {
    resolved(doc, node)["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("{node} is an enum"))
        .iter()
        .map(|value| value.as_str().expect("a string").to_owned())
        .collect()
}

fn texts<T: Copy + Into<&'static str>>(all: &[T]) -> BTreeSet<String> {
    all.iter().map(|value| (*value).into().to_owned()).collect()
}

/// Every status, state and event type is an enum of the service's own
/// values, in the bodies and in the query filters: a generated client
/// refuses a misspelling at compile time.
#[tokio::test]
async fn states_are_enums_of_the_services_values() {
    use token_billing::db::states::{
        AccountStatus, EventType, GrantStatus, JobStatus, ReservationState,
    };
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    for (schema, property, values) in [
        ("JobView", "status", texts(JobStatus::ALL)),
        ("JobReservation", "state", texts(ReservationState::ALL)),
        ("ReservationView", "state", texts(ReservationState::ALL)),
        ("AccountView", "status", texts(AccountStatus::ALL)),
        ("UpdateAccount", "status", texts(AccountStatus::ALL)),
        ("GrantView", "status", texts(GrantStatus::ALL)),
    ] {
        assert_eq!(
            enum_of(&doc, &schemas[schema]["properties"][property]),
            values,
            "{schema}.{property}"
        );
    }
    // A PATCH's optional state admits null, as the service does (it leaves
    // the status unchanged): a stricter document has schemathesis report
    // `"status": null` accepted.
    assert!(
        schemas["UpdateAccount"]["properties"]["status"]["oneOf"]
            .as_array()
            .is_some_and(|choices| choices.contains(&serde_json::json!({"type": "null"}))),
        "UpdateAccount.status is nullable: {}",
        schemas["UpdateAccount"]["properties"]["status"]
    );
    for (path, name, values) in [
        (
            "/v1/accounts/{account_id}/jobs",
            "status",
            texts(JobStatus::ALL),
        ),
        (
            "/v1/accounts/{account_id}/reservations",
            "state",
            texts(ReservationState::ALL),
        ),
        ("/v1/accounts", "status", texts(AccountStatus::ALL)),
        (
            "/v1/accounts/{account_id}/grants",
            "status",
            texts(GrantStatus::ALL),
        ),
        ("/v1/events", "type", texts(EventType::ALL)),
    ] {
        let parameter = doc["paths"][path]["get"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|parameter| parameter["name"] == name)
            .unwrap_or_else(|| panic!("{path} has {name}"));
        assert_eq!(enum_of(&doc, &parameter["schema"]), values, "{path} {name}");
    }
    // No other string status, state, outcome or scope is left open.
    let mut open = Vec::new();
    for (name, schema) in schemas.as_object().expect("schemas") {
        for (property, node) in schema["properties"].as_object().into_iter().flatten() {
            let named = ["status", "state", "outcome", "scope"].contains(&property.as_str())
                || property.ends_with("_status");
            let node = resolved(&doc, node);
            let string = node["type"] == "string"
                || node["type"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "string"));
            if named && string && node.get("enum").is_none() {
                open.push(format!("{name}.{property}"));
            }
        }
    }
    assert!(open.is_empty(), "strings without their values: {open:?}");
    let types = texts(EventType::ALL);
    assert!(types.contains("grant.expired") && types.contains("grant.expiring"));
    // The server takes every type the document lists.
    for event_type in &types {
        let response = app
            .get(&format!("/v1/events?type={event_type}"), ADMIN_KEY)
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{event_type}");
    }
}

/// Generators read a bare `{"type": "object"}` as an object with no
/// members: every object without properties says it is open, a job's
/// `result` and `error` have schemas, `kind` is a string with this
/// replica's kinds described (not an enum another deployment would break).
#[tokio::test]
async fn open_objects_job_outcomes_and_kinds_are_described() {
    let app = TestApp::spawn_with_flags(&["--price-list", "standard=1,hd=3"]).await;
    let doc = document(&app).await;
    fn closed_objects(node: &Value, at: &str, found: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                let object = match map.get("type") {
                    Some(Value::String(kind)) => kind == "object",
                    Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
                    _ => false,
                };
                if object
                    && !map.contains_key("properties")
                    && !map.contains_key("additionalProperties")
                {
                    found.push(at.to_owned());
                }
                for (key, child) in map {
                    closed_objects(child, &format!("{at}/{key}"), found);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    closed_objects(child, &format!("{at}/{index}"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    closed_objects(&doc, "", &mut found);
    assert!(found.is_empty(), "objects with no members: {found:#?}");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["CreateJob"]["properties"]["params"]["additionalProperties"],
        true
    );
    // An event's data: typed by its type, open to new members.
    for variant in schemas["EventView"]["oneOf"].as_array().expect("a union") {
        let name = variant["$ref"].as_str().expect("a ref").rsplit('/').next();
        let data = &schemas[name.expect("a name")]["properties"]["data"];
        assert_eq!(data["additionalProperties"], true, "{name:?}");
    }
    let result = &schemas["JobView"]["properties"]["result"]["oneOf"];
    assert_eq!(result[0]["$ref"], "#/components/schemas/JobResult");
    assert_eq!(result[1]["type"], "null");
    assert!(schemas["JobResult"]["properties"]["output"].is_object());
    let error = &schemas["JobView"]["properties"]["error"]["oneOf"];
    assert_eq!(error[0]["$ref"], "#/components/schemas/JobError");
    let required: Vec<&str> = schemas["JobError"]["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["code", "message"]);
    let kind = &schemas["CreateJob"]["properties"]["kind"];
    assert_eq!(kind["type"], "string");
    assert!(kind.get("enum").is_none(), "{kind}");
    let description = kind["description"].as_str().expect("described");
    assert!(
        description.contains("`hd` (3 tokens)") && description.contains("`standard` (1 token)"),
        "{description}"
    );
}

/// The headers a client reads are declared where they are sent.
#[tokio::test]
async fn replay_and_retry_headers_are_declared() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let mut replayable = 0;
    for (method, path, operation) in operations(&doc) {
        let responses = operation["responses"].as_object().expect("responses");
        if method == "post" && responses.contains_key("201") && responses.contains_key("200") {
            let header = &responses["200"]["headers"]["Idempotent-Replayed"];
            assert_eq!(header["schema"]["enum"][0], "true", "{method} {path}");
            replayable += 1;
        }
        for status in ["429", "503"] {
            if let Some(response) = responses.get(status) {
                // A header is text: openapi-fetch hands it over as a string.
                let schema = &response["headers"]["Retry-After"]["schema"];
                assert_eq!(schema["type"], "string", "{method} {path} {status}");
                assert_eq!(schema["pattern"], "^[0-9]+$", "{method} {path} {status}");
            }
        }
    }
    assert!(replayable >= 6, "{replayable} replayable creations");
    for path in [
        "/v1/accounts/{account_id}/jobs",
        "/v1/accounts/{account_id}/reservations",
        "/v1/accounts/{account_id}/credits",
    ] {
        assert!(
            doc["paths"][path]["post"]["responses"]["200"]["headers"]["Idempotent-Replayed"]
                .is_object(),
            "{path}"
        );
    }
}

/// Generators type the document exactly (issue 59): members always sent,
/// as null when they have no value, are required and nullable; a member
/// the service omits stays optional; a `servers` entry names the base URL.
#[tokio::test]
async fn always_sent_members_are_required_and_servers_named() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    let required = |schema: &str| -> Vec<String> {
        schemas[schema]["required"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema} has no required"))
            .iter()
            .map(|name| name.as_str().expect("a name").to_owned())
            .collect()
    };
    for (schema, members) in [
        ("JobView", &["result", "error", "finished_at"][..]),
        ("EventPage", &["next_after"][..]),
        ("ReservationView", &["job_id", "resolved_at"][..]),
    ] {
        let listed = required(schema);
        for member in members {
            assert!(
                listed.iter().any(|name| name == member),
                "{schema}.{member}: {listed:?}"
            );
        }
    }
    // Sent only in the answer to a creation: optional.
    assert!(!required("AccountView")
        .iter()
        .any(|name| name == "warnings"));
    // A request body's optional members stay optional (null: unchanged).
    let update = schemas["UpdateAccount"]["required"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!update.iter().any(|name| name == "status"), "{update:?}");
    assert_eq!(doc["servers"][0]["url"], "/", "{}", doc["servers"]);
}
