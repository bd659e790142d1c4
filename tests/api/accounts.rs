use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_has_balances_etag_and_304() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/v1/accounts",
            ADMIN_KEY,
            &json!({"name": "Hochzeit Müller"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let created: Value = response.json().await.expect("json");
    assert_eq!(
        location,
        format!(
            "/v1/accounts/{}",
            created["account_id"].as_str().expect("id")
        )
    );
    for (field, expected) in [
        ("available", json!(0)),
        ("reserved", json!(0)),
        ("used", json!(0)),
        ("credited", json!(0)),
        ("adjusted", json!(0)),
        ("active_reservations", json!(0)),
        ("max_active_reservations", json!(50)),
        ("status", json!("active")),
        ("name", json!("Hochzeit Müller")),
    ] {
        assert_eq!(created[field], expected, "{field}");
    }
    let account: Uuid = created["account_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    app.credit(account, 7).await;

    let response = app.get(&format!("/v1/accounts/{account}"), ADMIN_KEY).await;
    let etag = response.headers()["etag"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let body: Value = response.json().await.expect("json");
    assert_eq!(etag, format!("\"{}\"", body["version"]));
    assert_eq!(
        (body["available"].as_i64(), body["credited"].as_i64()),
        (Some(7), Some(7))
    );

    let cached = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .bearer_auth(ADMIN_KEY)
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("sent");
    assert_eq!(cached.status(), StatusCode::NOT_MODIFIED);
    app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    let changed = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .bearer_auth(ADMIN_KEY)
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        changed.status(),
        StatusCode::OK,
        "a balance change bumps the version"
    );

    let (status, _) = problem(
        app.get(&format!("/v1/accounts/{}", Uuid::new_v4()), ADMIN_KEY)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_account_refuses_new_reservations_but_settles_held_ones() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let held: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 2)
        .await
        .json()
        .await
        .expect("json");
    let path = format!("/v1/accounts/{account}");
    let suspend = app
        .patch(&path, ADMIN_KEY, &json!({"status": "suspended"}))
        .await;
    assert_eq!(suspend.status(), StatusCode::OK);
    // An array is not an object, even if serde could read one by position.
    let positional = app.patch(&path, ADMIN_KEY, &json!([null, null])).await;
    assert_eq!(problem(positional).await.0, StatusCode::BAD_REQUEST);
    let before = app.snapshot(account);
    let (status, body) = problem(app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("account_suspended"))
    );
    assert_eq!(app.snapshot(account), before);

    let commit = format!(
        "/v1/accounts/{account}/reservations/{}/commit",
        held["reservation_id"].as_str().expect("id")
    );
    assert_eq!(
        app.post(&commit, ADMIN_KEY, &json!({})).await.status(),
        StatusCode::OK
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (3, 0, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_pages_oldest_first_with_a_cursor() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(0).await;
    for _ in 0..5 {
        app.credit(account, 1).await;
    }
    let mut seen = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let path = match after {
            Some(cursor) => format!("/v1/accounts/{account}/ledger?limit=2&after={cursor}"),
            None => format!("/v1/accounts/{account}/ledger?limit=2"),
        };
        let page: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
        let entries = page["entries"].as_array().expect("entries");
        assert!(entries.len() <= 2);
        seen.extend(
            entries
                .iter()
                .map(|entry| entry["available_after"].as_i64().expect("number")),
        );
        match page["next_after"].as_i64() {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5], "every entry once, oldest first");
}
