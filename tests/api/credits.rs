use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{problem, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_is_idempotent_on_external_ref() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(0).await;
    let path = format!("/v1/accounts/{account}/credits");
    let body = json!({"amount": 50, "external_ref": "invoice-2026-0042", "note": "50-pack"});
    let first = app.post(&path, ADMIN_KEY, &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("json");
    assert_eq!(
        (first["available"].as_i64(), first["amount"].as_i64()),
        (Some(50), Some(50))
    );

    // Spend a bit, then replay: same answer (balances as of the credit).
    app.reserve(account, ADMIN_KEY, uuid::Uuid::new_v4(), 5)
        .await;
    let replay = app.post(&path, ADMIN_KEY, &body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay: Value = replay.json().await.expect("json");
    assert_eq!(
        replay, first,
        "a replay answers exactly like the first time"
    );

    let before = app.snapshot(account);
    let different = json!({"amount": 51, "external_ref": "invoice-2026-0042", "note": "50-pack"});
    let (status, body) = problem(app.post(&path, ADMIN_KEY, &different).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    assert_eq!(app.snapshot(account), before);
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (45, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_credits_count_once() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(0).await;
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let body = json!({"amount": 10, "external_ref": "same-ref"});
                app.post(&format!("/v1/accounts/{account}/credits"), ADMIN_KEY, &body)
                    .await
                    .status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        11,
        "{statuses:?}"
    );
    let balances = app.assert_invariants(account);
    assert_eq!(balances.available, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustments_are_signed_idempotent_and_never_overdraw() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    app.reserve(account, ADMIN_KEY, uuid::Uuid::new_v4(), 4)
        .await;
    let path = format!("/v1/accounts/{account}/adjustments");

    let before = app.snapshot(account);
    let overdraw = json!({"amount": -7, "reason": "refund", "external_ref": "adj-1"});
    let (status, body) = problem(app.post(&path, ADMIN_KEY, &overdraw).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::PAYMENT_REQUIRED, Some("insufficient_tokens"))
    );
    assert_eq!(
        (body["available"].as_i64(), body["reserved"].as_i64()),
        (Some(6), Some(4))
    );
    assert_eq!(
        app.snapshot(account),
        before,
        "a refused adjustment records nothing"
    );

    let debit = json!({"amount": -6, "reason": "chargeback", "external_ref": "adj-1"});
    let response = app.post(&path, ADMIN_KEY, &debit).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("json");
    assert_eq!(
        (created["available"].as_i64(), created["amount"].as_i64()),
        (Some(0), Some(-6))
    );
    let replay = app.post(&path, ADMIN_KEY, &debit).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let (status, _) = problem(
        app.post(
            &path,
            ADMIN_KEY,
            &json!({"amount": -6, "reason": "other", "external_ref": "adj-1"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let credit = json!({"amount": 3, "reason": "goodwill", "external_ref": "adj-2"});
    assert_eq!(
        app.post(&path, ADMIN_KEY, &credit).await.status(),
        StatusCode::CREATED
    );
    let account_view = app.account(account).await;
    assert_eq!(
        (
            account_view["adjusted"].as_i64(),
            account_view["credited"].as_i64()
        ),
        (Some(-3), Some(10))
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (3, 4, 0)
    );
}
