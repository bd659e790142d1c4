//! Group commit (`COALESCE_MAX_BATCH`): concurrent spending requests of one
//! account run together in one transaction, and each is answered exactly
//! as it would be alone — bad keys, other accounts, duplicates, refusals,
//! replays and races included — with the ledger and the invariants exact.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::helpers::{tampered, SharedApp, TestApp};

/// A request to fire with the others at the same instant.
#[derive(Clone)]
struct Call {
    path: String,
    key: String,
    body: Value,
}

async fn all_at_once(app: &SharedApp, calls: Vec<Call>) -> Vec<(StatusCode, Value)> {
    let barrier = Arc::new(Barrier::new(calls.len()));
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|call| {
            let (app, barrier) = (Arc::clone(app), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let response = app.post(&call.path, &call.key, &call.body).await;
                let status = response.status();
                (status, response.json::<Value>().await.expect("json"))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("task"));
    }
    answers
}

/// (batches, operations) the engine ran so far, from /metrics.
async fn batches(app: &TestApp) -> (f64, f64) {
    let text = app.metrics_text().await;
    let value = |name: &str| {
        text.lines()
            .find(|line| line.starts_with(&format!("{name} ")))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("token_billing_coalesced_batch_size_count"),
        value("token_billing_coalesced_batch_size_sum"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_spending_on_one_account_is_coalesced_and_answered_as_alone() {
    let app: SharedApp = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(60).await;
    let other = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let other_kiosk = app.kiosk_key(other).await;
    let reserve_path = format!("/v1/accounts/{account}/reservations");

    // 40 new request_ids of 2 tokens (only 30 fit), 10 of them sent twice,
    // 5 with a bad key, 5 with another account's key.
    let ids: Vec<Uuid> = (0..40).map(|_| Uuid::new_v4()).collect();
    let reserve = |key: &str, id: Uuid| Call {
        path: reserve_path.clone(),
        key: key.to_owned(),
        body: json!({"request_id": id, "amount": 2}),
    };
    let mut calls: Vec<Call> = ids.iter().map(|&id| reserve(&kiosk, id)).collect();
    calls.extend(ids.iter().step_by(4).map(|&id| reserve(&kiosk, id)));
    calls.extend((0..5).map(|_| reserve(&tampered(&kiosk), Uuid::new_v4())));
    calls.extend((0..5).map(|_| reserve(&other_kiosk, Uuid::new_v4())));
    let answers = all_at_once(&app, calls.clone()).await;

    let mut by_request: HashMap<Uuid, Vec<(StatusCode, Option<String>)>> = HashMap::new();
    let mut statuses: HashMap<StatusCode, usize> = HashMap::new();
    for (call, (status, body)) in calls.iter().zip(&answers) {
        *statuses.entry(*status).or_default() += 1;
        let request_id: Uuid = call.body["request_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("uuid");
        let reservation = body["reservation_id"].as_str().map(str::to_owned);
        by_request
            .entry(request_id)
            .or_default()
            .push((*status, reservation));
    }
    assert_eq!(
        statuses.get(&StatusCode::UNAUTHORIZED),
        Some(&5),
        "{statuses:?}"
    );
    assert_eq!(
        statuses.get(&StatusCode::NOT_FOUND),
        Some(&5),
        "{statuses:?}"
    );
    let mut reserved = HashSet::new();
    for id in &ids {
        let seen = &by_request[id];
        let refused = seen
            .iter()
            .all(|(status, _)| *status == StatusCode::PAYMENT_REQUIRED);
        let created: HashSet<_> = seen.iter().filter_map(|(_, r)| r.clone()).collect();
        let created_once = seen
            .iter()
            .filter(|(status, _)| *status == StatusCode::CREATED)
            .count()
            == 1;
        assert!(
            refused || (created.len() == 1 && created_once && seen.iter().all(|(_, r)| r.is_some())),
            "request {id}: every answer names one reservation, created once, or all are 402: {seen:?}"
        );
        reserved.extend(created);
    }
    assert_eq!(reserved.len(), 30, "exactly the 30 that fit");
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (0, 60));
    let (reserve_batches, reserve_requests) = batches(&app).await;
    assert!(
        reserve_requests > reserve_batches,
        "some reservations ran together: {reserve_requests} requests in {reserve_batches} batches"
    );

    // Resolve them all at once: 10 partial commits (1 of 2), 10 full
    // commits, 10 releases; 5 commits sent twice; 5 releases racing a
    // commit of the same reservation; 5 commits with a bad key.
    let reserved: Vec<String> = reserved.into_iter().collect();
    let action = |key: &str, id: &str, what: &str, body: Value| Call {
        path: format!("/v1/accounts/{account}/reservations/{id}/{what}"),
        key: key.to_owned(),
        body,
    };
    let mut calls = Vec::new();
    for (index, id) in reserved.iter().enumerate() {
        calls.push(match index / 10 {
            0 => action(&kiosk, id, "commit", json!({"amount": 1})),
            1 => action(&kiosk, id, "commit", json!({})),
            _ => action(&kiosk, id, "release", json!({})),
        });
    }
    calls.extend(
        reserved[10..15]
            .iter()
            .map(|id| action(&kiosk, id, "commit", json!({}))),
    );
    calls.extend(
        reserved[15..20]
            .iter()
            .map(|id| action(&kiosk, id, "release", json!({}))),
    );
    calls.extend(
        reserved[20..25]
            .iter()
            .map(|id| action(&tampered(&kiosk), id, "commit", json!({}))),
    );
    let answers = all_at_once(&app, calls.clone()).await;
    let mut final_state: HashMap<String, HashSet<String>> = HashMap::new();
    for (call, (status, body)) in calls.iter().zip(&answers) {
        let id = call.path.split('/').nth(5).expect("id").to_owned();
        match *status {
            StatusCode::OK => {
                final_state
                    .entry(id)
                    .or_default()
                    .insert(body["state"].as_str().expect("state").to_owned());
            }
            StatusCode::CONFLICT => {
                assert_eq!(body["code"], "reservation_not_held", "{body}");
            }
            StatusCode::UNAUTHORIZED => assert!(call.key != kiosk),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(final_state.len(), 30, "every reservation resolved");
    for (id, states) in &final_state {
        assert_eq!(
            states.len(),
            1,
            "{id} answered as one final state: {states:?}"
        );
    }
    let committed = final_state
        .values()
        .filter(|states| states.contains("committed"))
        .count();
    let balances = app.assert_invariants(account);
    // 10 partial commits spend 1 each, every other commit spends 2.
    assert_eq!(balances.used, 10 + 2 * (committed as i64 - 10));
    assert_eq!(balances.reserved, 0);
    assert_eq!(balances.available + balances.used, 60);
    let (all_batches, all_requests) = batches(&app).await;
    let (resolve_batches, resolve_requests) = (
        all_batches - reserve_batches,
        all_requests - reserve_requests,
    );
    assert!(
        resolve_requests > resolve_batches,
        "some resolutions ran together: {resolve_requests} requests in {resolve_batches} batches"
    );
    // The other account is untouched.
    assert_eq!(app.account(other).await["available"], 5);
}
