//! Concurrency claims, tested with real parallel HTTP requests against real
//! PostgreSQL. A barrier releases every request at the same instant.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::helpers::{SharedApp, TestApp, ADMIN_KEY};

/// Fires `count` reservations of 1 token at once, each with its own
/// request_id; returns the statuses and the bodies.
async fn reserve_simultaneously(
    app: &SharedApp,
    account: Uuid,
    key: &str,
    count: usize,
) -> Vec<(StatusCode, Value)> {
    let barrier = Arc::new(Barrier::new(count));
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let (app, barrier, key) = (Arc::clone(app), Arc::clone(&barrier), key.to_owned());
            tokio::spawn(async move {
                barrier.wait().await;
                let response = app.reserve(account, &key, Uuid::new_v4(), 1).await;
                (
                    response.status(),
                    response.json::<Value>().await.expect("json"),
                )
            })
        })
        .collect();
    let mut results = Vec::with_capacity(count);
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    results
}

fn count(results: &[(StatusCode, Value)], status: StatusCode) -> usize {
    results.iter().filter(|(s, _)| *s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_token_twenty_kiosks_exactly_one_wins() {
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(1).await;
    let kiosk = app.kiosk_key(account).await;
    let results = reserve_simultaneously(&app, account, &kiosk, 20).await;
    assert_eq!(count(&results, StatusCode::CREATED), 1, "{results:?}");
    assert_eq!(
        count(&results, StatusCode::PAYMENT_REQUIRED),
        19,
        "{results:?}"
    );
    assert!(results
        .iter()
        .filter(|(status, _)| *status == StatusCode::PAYMENT_REQUIRED)
        .all(|(_, body)| body["code"] == "insufficient_tokens"));
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_tokens_two_hundred_requests_exactly_hundred_reserved() {
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let results = reserve_simultaneously(&app, account, &kiosk, 200).await;
    assert_eq!(count(&results, StatusCode::CREATED), 100, "{results:?}");
    assert_eq!(count(&results, StatusCode::PAYMENT_REQUIRED), 100);
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (0, 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn active_reservation_limit_holds_under_concurrency() {
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app.create_account(3).await;
    app.credit(account, 100).await;
    let results = reserve_simultaneously(&app, account, ADMIN_KEY, 20).await;
    assert_eq!(count(&results, StatusCode::CREATED), 3, "{results:?}");
    assert_eq!(count(&results, StatusCode::TOO_MANY_REQUESTS), 17);
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (97, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_racing_release_exactly_one_wins_each_time() {
    const ROUNDS: usize = 50;
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app
        .funded_account(i64::try_from(ROUNDS).expect("fits"))
        .await;
    let mut commits_won = 0_i64;
    for _ in 0..ROUNDS {
        let reservation: Value = app
            .reserve(account, ADMIN_KEY, Uuid::new_v4(), 1)
            .await
            .json()
            .await
            .expect("json");
        let base = format!(
            "/v1/accounts/{account}/reservations/{}",
            reservation["reservation_id"].as_str().expect("id")
        );
        let barrier = Arc::new(Barrier::new(2));
        let race = |action: &'static str| {
            let (app, barrier, path) = (
                Arc::clone(&app),
                Arc::clone(&barrier),
                format!("{base}/{action}"),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let response = app.post(&path, ADMIN_KEY, &json!({})).await;
                let replayed = response.headers().contains_key("idempotent-replayed");
                (
                    response.status(),
                    replayed,
                    response.json::<Value>().await.expect("json"),
                )
            })
        };
        let (commit, release) = (race("commit"), race("release"));
        let (commit, release) = (commit.await.expect("task"), release.await.expect("task"));
        let winners = [&commit, &release]
            .iter()
            .filter(|(status, replayed, _)| *status == StatusCode::OK && !replayed)
            .count();
        assert_eq!(winners, 1, "commit {commit:?} release {release:?}");
        let loser = if commit.0 == StatusCode::OK {
            &release
        } else {
            &commit
        };
        assert_eq!(loser.0, StatusCode::CONFLICT, "{loser:?}");
        assert_eq!(loser.2["code"], "reservation_not_held");
        if commit.0 == StatusCode::OK {
            commits_won += 1;
            assert_eq!(loser.2["state"], "committed");
        } else {
            assert_eq!(loser.2["state"], "released");
        }
    }
    let balances = app.assert_invariants(account);
    assert_eq!(balances.used, commits_won);
    assert_eq!(
        balances.available,
        i64::try_from(ROUNDS).expect("fits") - commits_won
    );
    assert_eq!(balances.reserved, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_request_id_concurrently_makes_one_reservation() {
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    for _ in 0..20 {
        let request_id = Uuid::new_v4();
        let barrier = Arc::new(Barrier::new(2));
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (app, barrier, kiosk) = (Arc::clone(&app), Arc::clone(&barrier), kiosk.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let response = app.reserve(account, &kiosk, request_id, 2).await;
                    (
                        response.status(),
                        response.json::<Value>().await.expect("json"),
                    )
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        let mut statuses: Vec<_> = answers.iter().map(|(status, _)| *status).collect();
        statuses.sort();
        assert_eq!(
            statuses,
            vec![StatusCode::OK, StatusCode::CREATED],
            "{answers:?}"
        );
        assert_eq!(
            answers[0].1["reservation_id"],
            answers[1].1["reservation_id"]
        );
        assert!(answers[0].1["reservation_id"].is_string());
    }
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved),
        (60, 40),
        "20 reservations of 2, no double hold"
    );
}
