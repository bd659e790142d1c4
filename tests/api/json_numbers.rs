//! JSON numbers as JSON Schema reads them: `5.0` is the integer 5 in an
//! integer field (the OpenAPI document allows it, so the API accepts it);
//! `5.5` is not an integer and is refused, changing nothing. A job's
//! `params` reach the provider exactly as sent.

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_integer_written_with_a_zero_fraction_is_that_integer() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let credit = app
        .post_raw(
            &format!("/v1/accounts/{account}/credits"),
            ADMIN_KEY,
            r#"{"amount": 5.0, "external_ref": "invoice-5"}"#,
        )
        .await;
    assert_eq!(credit.status(), StatusCode::CREATED);
    let credit: Value = credit.json().await.expect("json");
    assert_eq!(credit["amount"], 5);
    let balance: Value = app
        .get(&format!("/v1/accounts/{account}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(balance["available"], 5);

    let before = app.snapshot(account);
    for body in [
        r#"{"amount": 5.5, "external_ref": "invoice-6"}"#,
        r#"{"amount": 1e300, "external_ref": "invoice-7"}"#,
    ] {
        let (status, problem_body) = problem(
            app.post_raw(&format!("/v1/accounts/{account}/credits"), ADMIN_KEY, body)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem_body}");
    }
    assert_eq!(app.snapshot(account), before);

    let kiosk = app.kiosk_key(account).await;
    let reservation = app
        .post_raw(
            &format!("/v1/accounts/{account}/reservations"),
            &kiosk,
            json!({"request_id": Uuid::new_v4(), "amount": 2.0, "ttl_seconds": 60.0}).to_string(),
        )
        .await;
    assert_eq!(reservation.status(), StatusCode::CREATED);
    let reservation: Value = reservation.json().await.expect("json");
    assert_eq!(reservation["amount"], 2);
}

/// PostgreSQL cannot store U+0000: a body holding it anywhere (here deep in
/// a job's `params`) is a bad request, never a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_character_anywhere_in_a_body_is_a_bad_request() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let before = app.snapshot(account);
    for params in [
        json!({"prompt": "a\u{0}b"}),
        json!({"deep": [{"k\u{0}": 1}]}),
    ] {
        let body = json!({"request_id": Uuid::new_v4(), "kind": "standard", "params": params});
        let (status, problem_body) = problem(
            app.post(&format!("/v1/accounts/{account}/jobs"), &kiosk, &body)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem_body}");
        assert_eq!(problem_body["code"], "invalid_request");
    }
    assert_eq!(app.snapshot(account), before);
}
