use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reservation_bodies_are_400_and_change_nothing() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let kiosk = app.kiosk_key(account).await;
    let before = app.snapshot(account);
    let path = format!("/v1/accounts/{account}/reservations");
    let id = Uuid::new_v4();
    let bodies = [
        "{".to_owned(),
        "not json".to_owned(),
        "[]".to_owned(),
        format!(r#"{{"request_id": "{id}"}}"#),
        r#"{"request_id": "not-a-uuid", "amount": 1}"#.to_owned(),
        format!(r#"{{"request_id": "{id}", "amount": 0}}"#),
        format!(r#"{{"request_id": "{id}", "amount": -1}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 9223372036854775808}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1000001}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1.5}}"#),
        format!(r#"{{"request_id": "{id}", "amount": "1"}}"#),
        format!(r#"{{"request_id": "{id}", "amount": null}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1, "ttl_seconds": 0}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1, "ttl_seconds": 86401}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1, "ttl_seconds": -5}}"#),
        format!(r#"{{"request_id": "{id}", "amount": 1, "surprise": true}}"#),
        // serde would read a struct from an array by position: refused.
        format!(r#"["{id}", 1]"#),
    ];
    for body in bodies {
        let (status, problem_body) = problem(app.post_raw(&path, &kiosk, body.clone()).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem_body}");
        assert_eq!(problem_body["code"], "invalid_request", "{body}");
    }
    // Not JSON at all (wrong content type) is refused the same way.
    let response = app
        .client
        .post(app.url(&path))
        .bearer_auth(&kiosk)
        .header("content-type", "text/plain")
        .body(format!(r#"{{"request_id": "{id}", "amount": 1}}"#))
        .send()
        .await
        .expect("sent");
    let (status, _) = problem(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let oversize = format!(
        r#"{{"request_id": "{id}", "amount": 1, "pad": "{}"}}"#,
        "x".repeat(70_000)
    );
    let (status, body) = problem(app.post_raw(&path, &kiosk, oversize).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"))
    );

    assert_eq!(
        app.snapshot(account),
        before,
        "refused requests changed nothing"
    );
    assert_eq!(app.account(account).await["available"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_and_queries_are_400() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(2).await;
    for path in [
        "/v1/accounts/not-a-uuid".to_owned(),
        format!("/v1/accounts/{account}/reservations/123"),
        format!("/v1/accounts/{account}/ledger?limit=0"),
        format!("/v1/accounts/{account}/ledger?limit=1001"),
        format!("/v1/accounts/{account}/ledger?limit=ten"),
        format!("/v1/accounts/{account}/ledger?after=-1"),
    ] {
        let (status, body) = problem(app.get(&path, ADMIN_KEY).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{path}"
        );
    }
    let (status, _) = problem(app.get("/v1/no-such-route", ADMIN_KEY).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commit_credit_and_adjustment_bodies_change_nothing() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let reservation: serde_json::Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 3)
        .await
        .json()
        .await
        .expect("json");
    let reservation = reservation["reservation_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let before = app.snapshot(account);

    let commit = format!("/v1/accounts/{account}/reservations/{reservation}/commit");
    for body in [
        "{",
        r#"{"amount": 0}"#,
        r#"{"amount": "all"}"#,
        r#"{"amount": 4}"#,
        r#"{"amont": 1}"#,
        "[4]",
        "[null]",
    ] {
        let (status, problem_body) = problem(app.post_raw(&commit, ADMIN_KEY, body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem_body}");
    }
    let oversize = format!(r#"{{"amount": 1, "pad": "{}"}}"#, "x".repeat(70_000));
    let (status, _) = problem(app.post_raw(&commit, ADMIN_KEY, oversize).await).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    let credits = format!("/v1/accounts/{account}/credits");
    for body in [
        json!({"amount": 0, "external_ref": "a"}),
        json!({"amount": -3, "external_ref": "a"}),
        json!({"amount": 5}),
        json!({"amount": 5, "external_ref": ""}),
        json!({"amount": 5, "external_ref": "x".repeat(201)}),
    ] {
        let (status, _) = problem(app.post(&credits, ADMIN_KEY, &body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    let adjustments = format!("/v1/accounts/{account}/adjustments");
    for body in [
        json!({"amount": 0, "reason": "r", "external_ref": "b"}),
        json!({"amount": 2, "external_ref": "b"}),
        json!({"amount": -1_000_001, "reason": "r", "external_ref": "b"}),
    ] {
        let (status, _) = problem(app.post(&adjustments, ADMIN_KEY, &body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(
        app.snapshot(account),
        before,
        "refused requests changed nothing"
    );
    app.assert_invariants(account);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_is_503_unavailable() {
    // A server that is not there: every request needing the database must
    // answer 503 with nothing changed, never a panic or a hang.
    let app = TestApp::spawn_with(|config| {
        config.database_url = "postgres://postgres@127.0.0.1:1/token_billing".into();
    })
    .await;
    let response = app
        .get(&format!("/v1/accounts/{}", Uuid::new_v4()), ADMIN_KEY)
        .await;
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().ok()),
        Some(Some("1"))
    );
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    let (status, _) = problem(app.get("/readyz", ADMIN_KEY).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        app.get("/healthz", ADMIN_KEY).await.status(),
        StatusCode::OK
    );
}
