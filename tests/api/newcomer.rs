//! The small things a newcomer trips on: a JSON error names its field, HEAD
//! works where GET does, `/docs/` is Swagger UI, `migrate` says what it
//! did, and a bad setting from the environment names its variable.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{problem, server_url, TestApp, TestDatabase, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_error_names_the_field() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    for (path, body, field) in [
        (
            format!("/v1/accounts/{account}/credits"),
            json!({"amount": "50", "external_ref": "inv-1"}),
            "amount",
        ),
        (
            "/v1/accounts".to_owned(),
            json!({"name": "x", "max_active_reservations": "ten"}),
            "max_active_reservations",
        ),
        (
            format!("/v1/accounts/{account}/reservations"),
            json!({"request_id": "not-a-uuid", "amount": 1}),
            "request_id",
        ),
    ] {
        let (status, body) = problem(app.post(&path, ADMIN_KEY, &body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let detail = body["detail"].as_str().expect("detail");
        assert!(
            detail.contains(&format!("{field}: ")),
            "{path}: the detail names `{field}`: {detail}"
        );
    }
    // Nothing was credited.
    let balance: Value = app
        .get(&format!("/v1/accounts/{account}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(balance["available"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_answers_like_get_without_a_body_and_docs_has_a_slash_form() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(1).await;
    for (path, key) in [
        ("/healthz".to_owned(), None),
        ("/openapi.json".to_owned(), None),
        ("/docs".to_owned(), None),
        ("/docs/".to_owned(), None),
        ("/console".to_owned(), None),
        (format!("/v1/accounts/{account}"), Some(ADMIN_KEY)),
        (
            "/v1/reconciliation?from=2026-11-01".to_owned(),
            Some(ADMIN_KEY),
        ),
    ] {
        let get = |method: reqwest::Method| {
            let mut request = app.client.request(method, app.url(&path));
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            request.send()
        };
        let full = get(reqwest::Method::GET).await.expect("GET");
        assert_eq!(full.status(), StatusCode::OK, "GET {path}");
        let head = get(reqwest::Method::HEAD).await.expect("HEAD");
        assert_eq!(head.status(), StatusCode::OK, "HEAD {path}");
        assert_eq!(
            head.headers().get("content-type"),
            full.headers().get("content-type"),
            "HEAD {path}"
        );
        assert!(
            head.bytes().await.expect("body").is_empty(),
            "HEAD {path} sent a body"
        );
    }
    let docs = app
        .client
        .get(app.url("/docs/"))
        .send()
        .await
        .expect("sent");
    assert!(docs.text().await.expect("text").contains("SwaggerUIBundle"));
    // HEAD is GET's: a POST-only route still refuses it, and changes nothing.
    let head = app
        .client
        .head(app.url(&format!("/v1/accounts/{account}/credits")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert!(head.status().is_client_error(), "{}", head.status());
}

#[test]
fn migrate_says_what_it_did_also_when_nothing() {
    let database = TestDatabase::create();
    let name = format!("{}_fresh", database.name);
    let url = format!("{}/{name}", server_url());
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_token-billing"))
            .arg("migrate")
            .env("DATABASE_URL", &url)
            .env_remove("RUST_LOG")
            .env_remove("LOG_FORMAT")
            .output()
            .expect("runs")
    };
    let first = run();
    let second = run();
    let mut admin = {
        use diesel::Connection;
        diesel::PgConnection::establish(&format!("{}/postgres", server_url())).expect("connect")
    };
    diesel::connection::SimpleConnection::batch_execute(
        &mut admin,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .expect("drop");
    for output in [&first, &second] {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report = |output: &std::process::Output| -> Value {
        serde_json::from_slice(&output.stdout).expect("stdout is JSON")
    };
    let (first_report, second_report) = (report(&first), report(&second));
    assert_eq!(first_report["database"], name.as_str());
    assert_eq!(first_report["created"], true);
    assert!(!first_report["applied"]
        .as_array()
        .expect("applied")
        .is_empty());
    assert_eq!(second_report["created"], false);
    assert_eq!(second_report["applied"], json!([]));
    assert_eq!(second_report["up_to_date"], true);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("nothing to do"), "{said}");
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(
        said.contains("created the database") && said.contains("applied"),
        "{said}"
    );
}

/// libpq's other form of a connection string, `host=… dbname=…`, names
/// its database as well as a URL does: `migrate` creates it and the
/// management commands use it.
#[test]
fn a_key_value_database_url_names_its_database() {
    let database = TestDatabase::create();
    let name = format!("{}_kv", database.name);
    let server = server_url();
    let rest = server
        .strip_prefix("postgres://")
        .or_else(|| server.strip_prefix("postgresql://"))
        .expect("TEST_DATABASE_SERVER is a postgres:// URL");
    let (user_info, address) = rest.rsplit_once('@').expect("user@host");
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "5432"));
    let mut conninfo = format!("host={host} port={port} dbname={name}");
    match user_info.split_once(':') {
        Some((user, password)) => conninfo.push_str(&format!(" user={user} password='{password}'")),
        None => conninfo.push_str(&format!(" user={user_info}")),
    }
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_token-billing"))
            .args(args)
            .env("DATABASE_URL", &conninfo)
            .env_remove("RUST_LOG")
            .env_remove("LOG_FORMAT")
            .output()
            .expect("runs")
    };
    let migrated = run(&["migrate"]);
    let digest = run(&["ledger-digest", "--until", "2026-01-01"]);
    let mut admin = {
        use diesel::Connection;
        diesel::PgConnection::establish(&format!("{server}/postgres")).expect("connect")
    };
    diesel::connection::SimpleConnection::batch_execute(
        &mut admin,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .expect("drop");
    for output in [&migrated, &digest] {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&migrated.stdout).expect("stdout is JSON");
    assert_eq!(report["database"], name.as_str());
    assert_eq!(report["created"], true);
    let digest: Value = serde_json::from_slice(&digest.stdout).expect("stdout is JSON");
    assert_eq!(digest["entries"], 0);
}

#[test]
fn a_bad_setting_from_the_environment_names_its_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .env("DB_POOL_SIZE", "sixteen")
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("environment variable DB_POOL_SIZE"), "{said}");
    // Given as a flag, the flag is the culprit: no mention of the variable.
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .args(["serve", "--db-pool-size", "sixteen"])
        .env_remove("DB_POOL_SIZE")
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("--db-pool-size"), "{said}");
    assert!(!said.contains("environment variable"), "{said}");
    // Implied serve (no subcommand) too.
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .env("RESERVATION_TTL_SECONDS", "five minutes")
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("environment variable RESERVATION_TTL_SECONDS"),
        "{said}"
    );
}
