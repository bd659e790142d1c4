//! Every file finance reads balances on its own: `balances --csv` has every
//! column of the JSON lines, and each line satisfies the identity
//! docs/finance.md states (credited plus adjusted minus grant_expired
//! equals available plus reserved plus used), on a history with a lapsed
//! grant, adjustments both ways, a committed and a held reservation. (The
//! reconciliation CSV's totals row: tests/api/reconciliation.rs.)

use std::collections::HashMap;
use std::process::Command;

use chrono::{SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{TestApp, ADMIN_KEY};

const BINARY: &str = env!("CARGO_BIN_EXE_token-billing");

fn balances(app: &TestApp, as_of: &str, csv: bool) -> String {
    let mut command = Command::new(BINARY);
    command.args([
        "--database-url",
        &app.database.url,
        "balances",
        "--as-of",
        as_of,
    ]);
    if csv {
        command.arg("--csv");
    }
    let output = command.env("RUST_LOG", "error").output().expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balances_csv_has_every_column_and_each_line_balances() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let base = format!("/v1/accounts/{account}");
    let post = |path: String, body: Value| {
        let app = &app;
        async move {
            let response = app.post(&path, ADMIN_KEY, &body).await;
            let status = response.status();
            let body: Value = response.json().await.expect("json");
            assert!(status.is_success(), "{path}: {body}");
            body
        }
    };
    let lapsing = post(
        format!("{base}/credits"),
        json!({"amount": 7, "external_ref": "lapsing",
               "expires_at": (Utc::now() + chrono::Duration::days(1)).to_rfc3339()}),
    )
    .await;
    post(
        format!("{base}/credits"),
        json!({"amount": 83, "external_ref": "lasting"}),
    )
    .await;
    post(
        format!("{base}/adjustments"),
        json!({"amount": 5, "reason": "goodwill", "external_ref": "up"}),
    )
    .await;
    // The first grant lapses; the next removal writes its lapse first.
    diesel::sql_query("UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = $1")
        .bind::<SqlUuid, _>(
            lapsing["grant_id"]
                .as_str()
                .expect("grant")
                .parse::<Uuid>()
                .expect("uuid"),
        )
        .execute(&mut app.conn())
        .expect("lapsed");
    post(
        format!("{base}/adjustments"),
        json!({"amount": -2, "reason": "correction", "external_ref": "down"}),
    )
    .await;
    let response = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 12).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let spent: Value = response.json().await.expect("json");
    post(
        format!(
            "{base}/reservations/{}/commit",
            spent["reservation_id"].as_str().expect("id")
        ),
        json!({"amount": 9}),
    )
    .await;
    let response = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 3).await;
    assert_eq!(response.status(), StatusCode::CREATED, "a held reservation");

    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let as_of = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    let json_line: Value =
        serde_json::from_str(balances(&app, &as_of, false).trim()).expect("one JSON line");
    let csv = balances(&app, &as_of, true);
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("a line").split(',').collect();
    assert_eq!(lines.next(), None, "{csv}");
    let members = json_line.as_object().expect("object");
    let mut columns: Vec<&str> = header.clone();
    let mut names: Vec<&str> = members.keys().map(String::as_str).collect();
    columns.sort_unstable();
    names.sort_unstable();
    assert_eq!(
        columns, names,
        "every column the JSON line has, and no other"
    );
    let cell: HashMap<&str, &str> = header.iter().copied().zip(row.iter().copied()).collect();
    for (name, value) in members {
        let shown = match value {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        assert_eq!(cell[name.as_str()], shown, "{name}");
    }
    let number = |name: &str| cell[name].parse::<i64>().expect(name);
    assert_eq!(
        (
            number("credited"),
            number("adjusted"),
            number("grant_expired"),
            number("available"),
            number("reserved"),
            number("used")
        ),
        (90, 3, 7, 74, 3, 9),
        "{csv}"
    );
    assert_eq!(
        number("credited") + number("adjusted") - number("grant_expired"),
        number("available") + number("reserved") + number("used"),
        "the identity of docs/finance.md: {csv}"
    );
}
