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

/// Credits and adjustments share one namespace of external references
/// (issue 35): a reference booked as one kind is refused as the other, in
/// either order, with 422 naming the booking that holds it, and nothing
/// moves. (Before, a credit and an adjustment of the same invoice both
/// landed: 200 tokens for one invoice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_external_ref_is_booked_once_across_credits_and_adjustments() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(0).await;
    let credits = format!("/v1/accounts/{account}/credits");
    let adjustments = format!("/v1/accounts/{account}/adjustments");

    // Credit first, then the same reference as an adjustment.
    let credit = app
        .post(
            &credits,
            ADMIN_KEY,
            &json!({"amount": 100, "external_ref": "INV-2026-118bc22"}),
        )
        .await;
    assert_eq!(credit.status(), StatusCode::CREATED);
    let credit: Value = credit.json().await.expect("json");
    let before = app.snapshot(account);
    let (status, body) = problem(
        app.post(
            &adjustments,
            ADMIN_KEY,
            &json!({"amount": 100, "external_ref": "INV-2026-118bc22", "reason": "retry"}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        ),
        "{body}"
    );
    assert_eq!(body["existing"]["kind"], "credit", "{body}");
    assert_eq!(body["existing"]["id"], credit["credit_id"], "{body}");
    assert_eq!(body["existing"]["account_id"], json!(account), "{body}");
    assert_eq!(
        body["existing"]["entry_id"], credit["ledger_entry_id"],
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains(credit["credit_id"].as_str().expect("id"))),
        "{body}"
    );
    assert_eq!(app.snapshot(account), before, "nothing moved");

    // Adjustment first, then the same reference as a credit — also on
    // another account.
    let adjustment = app
        .post(
            &adjustments,
            ADMIN_KEY,
            &json!({"amount": 7, "external_ref": "TICKET-9", "reason": "goodwill"}),
        )
        .await;
    assert_eq!(adjustment.status(), StatusCode::CREATED);
    let adjustment: Value = adjustment.json().await.expect("json");
    let other = app.funded_account(0).await;
    for target in [account, other] {
        let before = app.snapshot(target);
        let (status, body) = problem(
            app.post(
                &format!("/v1/accounts/{target}/credits"),
                ADMIN_KEY,
                &json!({"amount": 7, "external_ref": "TICKET-9"}),
            )
            .await,
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["existing"]["kind"], "adjustment", "{body}");
        assert_eq!(
            body["existing"]["id"], adjustment["adjustment_id"],
            "{body}"
        );
        assert_eq!(app.snapshot(target), before, "nothing moved");
    }

    // The same kind and body is still a replay.
    let replay = app
        .post(
            &adjustments,
            ADMIN_KEY,
            &json!({"amount": 7, "external_ref": "TICKET-9", "reason": "goodwill"}),
        )
        .await;
    assert_eq!(replay.status(), StatusCode::OK);
    let balances = app.assert_invariants(account);
    assert_eq!(balances.available, 107);
}

/// The collision, concurrently: a credit and an adjustment of the same
/// reference sent at once (on one account, and on two accounts, which
/// hold different row locks): exactly one is booked, the other is refused
/// 422 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_credit_and_adjustment_of_one_reference_book_once() {
    let app = Arc::new(TestApp::spawn().await);
    let first = app.funded_account(0).await;
    let second = app.funded_account(0).await;
    for round in 0..8 {
        let reference = format!("race-{round}");
        let adjusted = if round % 2 == 0 { first } else { second };
        let tasks: Vec<_> = [
            (
                first,
                "credits",
                json!({"amount": 10, "external_ref": reference}),
            ),
            (
                adjusted,
                "adjustments",
                json!({"amount": 10, "external_ref": reference, "reason": "retry"}),
            ),
        ]
        .into_iter()
        .map(|(account, kind, body)| {
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let response = app
                    .post(&format!("/v1/accounts/{account}/{kind}"), ADMIN_KEY, &body)
                    .await;
                let status = response.status();
                let body: Value = response.json().await.expect("json");
                (status, body)
            })
        })
        .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        let booked: Vec<&Value> = answers
            .iter()
            .filter(|(status, _)| *status == StatusCode::CREATED)
            .map(|(_, body)| body)
            .collect();
        let refused: Vec<&Value> = answers
            .iter()
            .filter(|(status, _)| *status == StatusCode::UNPROCESSABLE_ENTITY)
            .map(|(_, body)| body)
            .collect();
        assert_eq!((booked.len(), refused.len()), (1, 1), "{answers:?}");
        let id = booked[0]
            .get("credit_id")
            .or_else(|| booked[0].get("adjustment_id"))
            .expect("an id");
        assert_eq!(refused[0]["existing"]["id"], *id, "{answers:?}");
    }
    let total = app.assert_invariants(first).available + app.assert_invariants(second).available;
    assert_eq!(total, 80, "eight references, ten tokens each, booked once");
}
