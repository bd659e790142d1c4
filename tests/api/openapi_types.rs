//! The document types what the service sends exactly (issue 59): events as
//! a `oneOf` by `type`, one schema for every type the service can write;
//! problems by status and `code`, with the members each code carries.

use std::collections::BTreeSet;
use std::path::Path;

use diesel::prelude::*;
use regex::Regex;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

pub async fn document(app: &TestApp) -> Value {
    let response = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("the document is JSON")
}

fn component<'a>(doc: &'a Value, reference: &str) -> &'a Value {
    let name = reference
        .strip_prefix("#/components/schemas/")
        .unwrap_or_else(|| panic!("{reference} is a component"));
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no component {name}");
    schema
}

/// Where `value` breaks `schema` (a small subset of JSON Schema: `$ref`,
/// `oneOf` with exactly one match, `type`, `enum`, `required`,
/// `properties`, `items`): the paths and what is wrong, empty when it
/// conforms. Enough for the document's answer schemas, which use no more.
pub fn violations(doc: &Value, schema: &Value, value: &Value, at: &str) -> Vec<String> {
    if let Some(reference) = schema["$ref"].as_str() {
        return violations(doc, component(doc, reference), value, at);
    }
    let mut found = Vec::new();
    if let Some(choices) = schema["oneOf"].as_array() {
        let matching = choices
            .iter()
            .filter(|choice| violations(doc, choice, value, at).is_empty())
            .count();
        if matching != 1 {
            let closest: Vec<String> = choices
                .iter()
                .map(|choice| violations(doc, choice, value, at))
                .min_by_key(Vec::len)
                .unwrap_or_default();
            found.push(format!(
                "{at}: matches {matching} of the oneOf's {} choices (closest: {closest:?})",
                choices.len()
            ));
        }
    }
    let kinds: Vec<&str> = match &schema["type"] {
        Value::String(kind) => vec![kind.as_str()],
        Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let kind_of = |value: &Value| match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if number.is_i64() || number.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let actual = kind_of(value);
    // An integer is a number too.
    let allowed = kinds.contains(&actual) || (actual == "integer" && kinds.contains(&"number"));
    if !kinds.is_empty() && !allowed {
        found.push(format!("{at}: a {actual}, the schema says {kinds:?}"));
        return found;
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            found.push(format!("{at}: {value} is not one of {values:?}"));
        }
    }
    if let Value::Object(members) = value {
        for name in schema["required"].as_array().into_iter().flatten() {
            let name = name.as_str().expect("a member name");
            if !members.contains_key(name) {
                found.push(format!("{at}: no {name}"));
            }
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            if let Some(member) = members.get(name) {
                found.extend(violations(doc, property, member, &format!("{at}.{name}")));
            }
        }
    }
    if let (Value::Array(items), Some(schema)) = (value, schema.get("items")) {
        for (index, item) in items.iter().enumerate() {
            found.extend(violations(doc, schema, item, &format!("{at}[{index}]")));
        }
    }
    found
}

/// Asserts that events as the feed lists them are what the document's
/// schema of their type says.
pub async fn assert_events_conform(app: &TestApp, events: &[Value]) {
    let doc = document(app).await;
    let union = json!({"$ref": "#/components/schemas/EventView"});
    for event in events {
        let kind = event["type"].as_str().unwrap_or("an event");
        let broken = violations(&doc, &union, event, kind);
        assert!(broken.is_empty(), "{kind} breaks its schema: {broken:#?}");
    }
}

/// The same for an event's `data` as the events table holds it.
pub async fn assert_data_conforms(app: &TestApp, event_type: &str, data: &Value) {
    let doc = document(app).await;
    let reference = doc["components"]["schemas"]["EventView"]["discriminator"]["mapping"]
        [event_type]
        .as_str()
        .unwrap_or_else(|| panic!("no schema for {event_type}"))
        .to_owned();
    let schema = component(&doc, &reference)["properties"]["data"].clone();
    let broken = violations(&doc, &schema, data, event_type);
    assert!(
        broken.is_empty(),
        "{event_type} breaks its schema: {broken:#?}"
    );
}

/// The event types the service can write, read from where they are
/// written: the engine's SQL (a literal type, or `'job.' || j.status` for
/// the terminal statuses) and the Rust code's `events::emit(conn, "…")`.
fn written_event_types() -> BTreeSet<String> {
    use token_billing::db::states::JobStatus;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = BTreeSet::new();
    let literal = Regex::new(r"'([a-z]+\.[a-z_]*)'(\s*\|\|\s*[a-z_]+\.([a-z_]+))?").expect("re");
    let mut sql_files = 0;
    for file in std::fs::read_dir(root.join("src/engine/sql")).expect("the engine's SQL") {
        let path = file.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("SQL");
        sql_files += 1;
        for line in text
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
        {
            for captures in literal.captures_iter(line) {
                let name = &captures[1];
                if !name.ends_with('.') {
                    found.insert(name.to_owned());
                    continue;
                }
                // A type made of a prefix and a column: only the job events'
                // `'job.' || j.status` is known; another must be added here.
                assert_eq!(
                    (name, captures.get(3).map(|m| m.as_str())),
                    ("job.", Some("status")),
                    "{}: an event type made at run time: {line}",
                    path.display()
                );
                for status in JobStatus::TERMINAL {
                    found.insert(format!("job.{}", status.as_str()));
                }
            }
        }
    }
    assert!(sql_files >= 10, "{sql_files} SQL files");
    let emit = Regex::new(r#"emit\(\s*conn,\s*"([a-z]+\.[a-z_]+)""#).expect("re");
    let mut pending = vec![root.join("src")];
    while let Some(directory) = pending.pop() {
        for file in std::fs::read_dir(&directory).expect("src") {
            let path = file.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("Rust");
                for captures in emit.captures_iter(&text) {
                    found.insert(captures[1].to_owned());
                }
            }
        }
    }
    found
}

/// The types the events table takes: its `events_rules` CHECK, as the
/// migrated database has it.
fn stored_event_types(app: &TestApp) -> BTreeSet<String> {
    #[derive(QueryableByName)]
    struct Definition {
        #[diesel(sql_type = diesel::sql_types::Text)]
        definition: String,
    }
    let definition: Definition = diesel::sql_query(
        "SELECT pg_get_functiondef('public.events_rules(text)'::regprocedure) AS definition",
    )
    .get_result(&mut app.conn())
    .expect("the events table's rules");
    Regex::new(r"'([a-z]+\.[a-z_]+)'")
        .expect("re")
        .captures_iter(&definition.definition)
        .map(|captures| captures[1].to_owned())
        .collect()
}

/// Every event type that the engine's SQL or the service's code writes,
/// and every type the events table accepts, has its own schema in the
/// `oneOf` of `EventView`, its `type` that one value: a type added without
/// its schema fails here.
#[tokio::test]
async fn every_event_type_the_service_writes_has_its_schema() {
    use token_billing::db::states::EventType;
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    let union = &schemas["EventView"];
    let mut documented = BTreeSet::new();
    for variant in union["oneOf"].as_array().expect("EventView is a oneOf") {
        let reference = variant["$ref"].as_str().expect("each choice a component");
        let schema = component(&doc, reference);
        let types = schema["properties"]["type"]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{reference}: type is an enum"));
        assert_eq!(types.len(), 1, "{reference}: one type");
        let event_type = types[0].as_str().expect("a string").to_owned();
        assert_eq!(
            union["discriminator"]["mapping"][&event_type], reference,
            "the discriminator maps {event_type}"
        );
        let data = &schema["properties"]["data"];
        assert!(
            data["properties"]
                .as_object()
                .is_some_and(|p| !p.is_empty()),
            "{reference}: data is typed"
        );
        assert!(documented.insert(event_type.clone()), "{event_type} twice");
    }
    assert_eq!(union["discriminator"]["propertyName"], "type");
    let written = written_event_types();
    let stored = stored_event_types(&app);
    let listed: BTreeSet<String> = EventType::ALL
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    assert!(written.len() >= 16, "{written:?}");
    let undocumented: Vec<&String> = written.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "written without a schema: {undocumented:?}"
    );
    assert_eq!(documented, stored, "the events table's types");
    assert_eq!(documented, listed, "EventType::ALL");

    // data.balances is typed where the account's balances are sent.
    let low = component(&doc, "#/components/schemas/AccountBalanceLowEvent");
    let data = &low["properties"]["data"];
    assert_eq!(
        data["properties"]["balances"]["$ref"],
        "#/components/schemas/EventBalances"
    );
    for member in ["account_id", "balances", "low_balance_threshold", "entry"] {
        assert!(
            data["required"]
                .as_array()
                .expect("required")
                .contains(&json!(member)),
            "balance_low data.{member}"
        );
    }
    // The feed's items and a webhook's body are events of this union.
    assert_eq!(
        schemas["EventPage"]["properties"]["events"]["items"]["$ref"],
        "#/components/schemas/EventView"
    );
    assert_eq!(
        doc["webhooks"]["event"]["post"]["requestBody"]["content"]["application/json"]["schema"]
            ["$ref"],
        "#/components/schemas/EventView"
    );
}

/// Each error answer names its status's problems: one schema per `code`,
/// with the members that code always carries required, and a `oneOf` by
/// `code` where a status has several; real refusals conform.
#[tokio::test]
async fn problems_are_typed_by_status_and_code() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    let all_codes: BTreeSet<&str> = schemas["ProblemCode"]["enum"]
        .as_array()
        .expect("codes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let codes_of = |schema: &Value| -> BTreeSet<String> {
        let choices: Vec<Value> = match schema["oneOf"].as_array() {
            Some(choices) => choices.clone(),
            None => vec![schema.clone()],
        };
        choices
            .iter()
            .map(|choice| {
                let choice = match choice["$ref"].as_str() {
                    Some(reference) => component(&doc, reference),
                    None => choice,
                };
                let codes = choice["properties"]["code"]["enum"]
                    .as_array()
                    .expect("code is an enum");
                assert_eq!(codes.len(), 1, "{choice}");
                codes[0].as_str().expect("a code").to_owned()
            })
            .collect()
    };
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("an item") {
            for (status, response) in operation["responses"].as_object().into_iter().flatten() {
                let Ok(code) = status.parse::<u16>() else {
                    continue;
                };
                if code < 400 {
                    continue;
                }
                let reference = response["content"]["application/problem+json"]["schema"]["$ref"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{method} {path} {status}: a problem"));
                assert_eq!(
                    reference,
                    format!("#/components/schemas/Problem{status}"),
                    "{method} {path}"
                );
                let codes = codes_of(component(&doc, reference));
                let shapes: BTreeSet<String> = token_billing::error::ApiError::problem_shapes()
                    .into_iter()
                    .filter(|(answered, _, _)| *answered == code)
                    .map(|(_, code, _)| code.to_owned())
                    .collect();
                assert_eq!(codes, shapes, "{method} {path} {status}");
                for code in &codes {
                    assert!(all_codes.contains(code.as_str()), "{code}");
                    seen.insert(code.clone());
                }
            }
        }
    }
    assert!(seen.len() >= 14, "{seen:?}");
    let required = |name: &str| -> Vec<String> {
        schemas[name]["required"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}"))
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let reserve = "/v1/accounts/{account_id}/reservations";
    assert_eq!(
        doc["paths"][reserve]["post"]["responses"]["402"]["content"]["application/problem+json"]
            ["schema"]["$ref"],
        "#/components/schemas/Problem402"
    );
    let choices: BTreeSet<&str> = schemas["Problem402"]["oneOf"]
        .as_array()
        .expect("402 answers two codes: a oneOf")
        .iter()
        .filter_map(|choice| choice["$ref"].as_str())
        .collect();
    assert_eq!(
        choices,
        BTreeSet::from([
            "#/components/schemas/InsufficientTokensProblem",
            "#/components/schemas/KeyBudgetExhaustedProblem"
        ])
    );
    for member in ["available", "reserved", "code", "detail"] {
        assert!(required("InsufficientTokensProblem").contains(&member.to_owned()));
    }
    for member in ["remaining", "resets_at"] {
        assert!(required("KeyBudgetExhaustedProblem").contains(&member.to_owned()));
    }
    assert!(required("TooManyActiveReservationsProblem")
        .contains(&"max_active_reservations".to_owned()));
    assert_eq!(
        schemas["Problem429"]["discriminator"]["propertyName"],
        "code"
    );
    assert!(required("ThresholdRuleExistsProblem").contains(&"rule_id".to_owned()));
    // `existing` comes with a credit's reused external_ref only.
    assert!(schemas["IdempotencyKeyReusedProblem"]["properties"]["existing"].is_object());
    assert!(!required("IdempotencyKeyReusedProblem").contains(&"existing".to_owned()));
    let retry = &doc["paths"][reserve]["post"]["responses"]["503"]["headers"]["Retry-After"];
    assert_eq!(retry["schema"]["type"], "string");

    // Real refusals conform to their status's schema.
    let account = app.create_account(1).await;
    app.credit(account, 2).await;
    let answer = |status: &str| {
        doc["paths"][reserve]["post"]["responses"][status]["content"]["application/problem+json"]
            ["schema"]
            .clone()
    };
    let (status, body) = problem(app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 5).await).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    let broken = violations(&doc, &answer("402"), &body, "402");
    assert!(broken.is_empty(), "{broken:?}");
    let held = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    assert_eq!(held.status(), StatusCode::CREATED);
    let (status, body) = problem(app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["code"], "too_many_active_reservations");
    let broken = violations(&doc, &answer("429"), &body, "429");
    assert!(broken.is_empty(), "{broken:?}");
    // And the checker can fail: without its limit, the body breaks it.
    let mut stripped = body.clone();
    stripped
        .as_object_mut()
        .expect("object")
        .remove("max_active_reservations");
    assert!(!violations(&doc, &answer("429"), &stripped, "429").is_empty());
}
