//! What a new operator hit following the docs alone (issue 57), each as a
//! test: the nightly digest file is JSON Lines, `prune` prunes events no
//! endpoint waits for where no replica relays, a connection error names
//! the database asked for, `api-key revoke` says when, and a start logs no
//! scheduler-internal INFO line.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Uuid as SqlUuid};
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::retention::{run_pass_exclusive, RetentionSettings};

use crate::helpers::{TestApp, TestDatabase, ADMIN_KEY};

fn run(database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// docs/backup.md's crontab appends `ledger-digest`'s output to a
/// `.jsonl` file: off a terminal, each digest is one line.
#[test]
fn ledger_digest_writes_one_json_line_when_its_output_is_not_a_terminal() {
    let database = TestDatabase::create();
    let mut file = String::new();
    for until in ["2026-01-01", "2026-01-02T00:00:00Z"] {
        let output = run(&database.url, &["ledger-digest", "--until", until]);
        stdout_json(&output);
        file.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    let lines: Vec<&str> = file.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "two digests appended make two lines: {file}"
    );
    for line in lines {
        let digest: Value = serde_json::from_str(line).expect("each line is a JSON document");
        assert!(digest["digest"].is_string(), "{digest}");
    }
}

#[test]
fn api_key_revoke_says_when_the_key_was_revoked() {
    let database = TestDatabase::create();
    let created = stdout_json(&run(
        &database.url,
        &[
            "api-key", "create", "--scope", "finance", "--label", "books",
        ],
    ));
    let key_id = created["key_id"].as_str().expect("key_id").to_owned();
    let first = stdout_json(&run(&database.url, &["api-key", "revoke", &key_id]));
    let revoked_at = first["revoked_at"].as_str().expect("revoked_at").to_owned();
    chrono::DateTime::parse_from_rfc3339(&revoked_at).expect("an RFC 3339 instant");
    let again = stdout_json(&run(&database.url, &["api-key", "revoke", &key_id]));
    assert_eq!(
        again["revoked_at"], first["revoked_at"],
        "revoking again changes nothing and says when it was"
    );
    let listed = stdout_json(&run(&database.url, &["api-key", "list"]));
    assert_eq!(
        listed["keys"][0]["revoked_at"],
        json!(revoked_at),
        "{listed}"
    );
}

/// `migrate` reaches the server through its maintenance database; when
/// that fails, the message names the database the operator asked for.
#[test]
fn a_connection_error_names_the_database_asked_for() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = closed.local_addr().expect("address").port();
    drop(closed);
    let asked = format!("tb_asked_for_{}", Uuid::new_v4().simple());
    let output = run(
        &format!("postgres://postgres@127.0.0.1:{port}/{asked}"),
        &["migrate"],
    );
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(&asked),
        "the error does not name the database asked for, {asked}: {said}"
    );
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn events_of(app: &TestApp, account: Uuid, kind: &str) -> i64 {
    diesel::sql_query(
        "SELECT count(*)::bigint AS n FROM events WHERE account_id = $1 AND type = $2",
    )
    .bind::<SqlUuid, _>(account)
    .bind::<Text, _>(kind)
    .get_result::<Count>(&mut app.conn())
    .expect("count")
    .n
}

/// With `WEBHOOK_CONCURRENCY=0` on every replica the relay never runs:
/// `prune` still prunes the events no endpoint waits for, and keeps those
/// an endpoint will be sent once a replica relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_prunes_events_no_endpoint_waits_for_where_no_replica_relays() {
    let app = TestApp::spawn_with(|config| config.webhook_concurrency = 0).await;
    let unwatched = app.create_account(0).await;
    let watched = app.create_account(0).await;
    let endpoint = app
        .post(
            "/v1/webhook-endpoints",
            ADMIN_KEY,
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["credit.created"],
                    "account_id": watched}),
        )
        .await;
    assert!(
        endpoint.status().is_success(),
        "{:?}",
        endpoint.text().await
    );
    app.credit(unwatched, 5).await;
    app.credit(watched, 5).await;
    assert_eq!(events_of(&app, unwatched, "credit.created"), 1);
    assert_eq!(events_of(&app, watched, "credit.created"), 1);

    let settings = RetentionSettings {
        idempotency_keys: None,
        events: Some(Duration::from_millis(1)),
        webhook_attempts: None,
        audit_events: None,
        archive_dir: None,
        batch: 5_000,
        batches_max: 10,
        pause: Duration::ZERO,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        if let Some(report) = run_pass_exclusive(&mut app.conn(), &settings, None).expect("pass") {
            break report;
        }
        assert!(Instant::now() < deadline, "the retention lock stays taken");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        events_of(&app, unwatched, "credit.created"),
        0,
        "an event no endpoint waits for is pruned at its age ({report:?})"
    );
    assert_eq!(
        events_of(&app, watched, "credit.created"),
        1,
        "an event an endpoint waits for stays until a replica relays it"
    );
}

/// The service's start, as the README runs it (no `RUST_LOG`): no INFO
/// line of the scheduler crate's own state machine (`… Uninited`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_logs_no_scheduler_internal_info_line() {
    let database = TestDatabase::create();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a port")
        .local_addr()
        .expect("address")
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .env("DATABASE_URL", &database.url)
        .env("BIND_ADDR", format!("127.0.0.1:{port}"))
        .env("ADMIN_API_KEY", ADMIN_KEY)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success());
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the service never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(stopped.success());
    child.wait().expect("the service stops");
    let mut log = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut log)
        .expect("the log");
    assert!(log.contains("INFO"), "the start logs at INFO: {log}");
    let scheduler: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("tokio_cron_scheduler") || line.contains("Uninited"))
        .collect();
    assert!(
        scheduler.is_empty(),
        "the scheduler crate's internal lines: {scheduler:#?}"
    );
}
