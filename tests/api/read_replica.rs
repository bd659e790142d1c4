//! `DATABASE_READ_URL`: finance's reconciliation and the admin/finance
//! ledger pages read the replica; a kiosk's reads stay on the primary; a
//! replica that cannot answer sends the reads back to the primary.
//!
//! The "replica" here is a second, empty database of the same server:
//! what the answers contain shows which database they were read from.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{TestApp, TestDatabase, ADMIN_KEY};

/// The value of `token_billing_read_replica_lag_seconds` once it is
/// `wanted` (polled: the gauge is refreshed in the background).
async fn await_lag_gauge(app: &TestApp, wanted: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = app.metrics_text().await;
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix("token_billing_read_replica_lag_seconds "))
            .and_then(|value| value.trim().parse::<f64>().ok());
        if value == Some(wanted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "read replica lag gauge is {value:?}, expected {wanted}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reconciliation_mentions(app: &TestApp, key: &str, account: Uuid) -> bool {
    let response = app.get("/v1/reconciliation", key).await;
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = response.json().await.expect("json");
    report["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .any(|line| line["account_id"] == account.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finance_reads_the_replica_and_kiosks_the_primary() {
    let replica = TestDatabase::create();
    let replica_url = replica.url.clone();
    let app = TestApp::spawn_with(move |config| config.database_read_url = Some(replica_url)).await;
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;

    // The replica does not have the account (it is another database): the
    // report was read there.
    assert!(!reconciliation_mentions(&app, &finance, account).await);
    let path = format!("/v1/accounts/{account}/ledger");
    assert_eq!(
        app.get(&path, ADMIN_KEY).await.status(),
        StatusCode::NOT_FOUND,
        "the admin's ledger page was not read from the replica"
    );
    // The kiosk's own ledger is read where it wrote: the primary.
    let response = app.get(&path, &kiosk).await;
    assert_eq!(response.status(), StatusCode::OK);
    let page: Value = response.json().await.expect("json");
    assert!(
        !page["entries"].as_array().expect("entries").is_empty(),
        "{page}"
    );
    // Not a standby: no lag.
    await_lag_gauge(&app, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fall_back_to_the_primary_when_the_replica_is_down() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let app = TestApp::spawn_with(move |config| {
        config.database_read_url = Some(format!(
            "postgres://postgres@127.0.0.1:{dead}/nowhere?connect_timeout=1"
        ));
    })
    .await;
    let account = app.funded_account(100).await;
    let finance = app.finance_key().await;
    // Twice: the first finds the replica down, the second skips it.
    for _ in 0..2 {
        assert!(reconciliation_mentions(&app, &finance, account).await);
    }
    let response = app
        .get(&format!("/v1/accounts/{account}/ledger"), ADMIN_KEY)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    await_lag_gauge(&app, -1.0).await;
}
