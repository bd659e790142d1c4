//! Listing and finding accounts, and creating accounts and keys safely
//! under retries (`Idempotency-Key`).

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

async fn create_named(app: &TestApp, name: &str) -> Uuid {
    app.create_account_from(&json!({"name": name})).await
}

async fn list(app: &TestApp, key: &str, query: &str) -> Value {
    let response = app.get(&format!("/v1/accounts{query}"), key).await;
    assert_eq!(response.status(), StatusCode::OK, "{query}");
    response.json().await.expect("json")
}

fn names(page: &Value) -> Vec<String> {
    page["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .map(|account| account["name"].as_str().expect("name").to_owned())
        .collect()
}

fn count(app: &TestApp, table: &str) -> i64 {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT count(*) AS n FROM {table}"))
        .get_result::<Count>(&mut app.database.connect())
        .expect("count")
        .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_are_listed_in_pages_and_found_by_name() {
    let app = TestApp::spawn().await;
    let mut created = Vec::new();
    for name in [
        "Wedding Müller",
        "wedding Schmidt",
        "Gala 100%",
        "Gala 1000",
        "Booth_7",
    ] {
        created.push(create_named(&app, name).await);
    }
    let finance = app.finance_key().await;

    // Oldest first, in pages that chain through next_after.
    let first = list(&app, &finance, "?limit=2").await;
    assert_eq!(names(&first), ["Wedding Müller", "wedding Schmidt"]);
    let cursor = first["next_after"].as_str().expect("a next page");
    assert_eq!(cursor, created[1].to_string());
    let second = list(&app, &finance, &format!("?limit=2&after={cursor}")).await;
    assert_eq!(names(&second), ["Gala 100%", "Gala 1000"]);
    let third = list(
        &app,
        &finance,
        &format!(
            "?limit=2&after={}",
            second["next_after"].as_str().expect("cursor")
        ),
    )
    .await;
    assert_eq!(names(&third), ["Booth_7"]);
    assert_eq!(third["next_after"], Value::Null);

    // q: case-insensitive, and its wildcards match themselves.
    assert_eq!(
        names(&list(&app, ADMIN_KEY, "?q=WEDDING").await),
        ["Wedding Müller", "wedding Schmidt"]
    );
    assert_eq!(
        names(&list(&app, ADMIN_KEY, "?q=100%25").await),
        ["Gala 100%"]
    );
    assert_eq!(
        names(&list(&app, ADMIN_KEY, "?q=Boot__7").await),
        Vec::<String>::new()
    );
    assert_eq!(names(&list(&app, ADMIN_KEY, "?q=h_7").await), ["Booth_7"]);
    assert_eq!(
        names(&list(&app, ADMIN_KEY, "?q=müller").await),
        ["Wedding Müller"]
    );

    // status
    let suspend = app
        .patch(
            &format!("/v1/accounts/{}", created[2]),
            ADMIN_KEY,
            &json!({"status": "suspended"}),
        )
        .await;
    assert_eq!(suspend.status(), StatusCode::OK);
    assert_eq!(
        names(&list(&app, ADMIN_KEY, "?status=suspended").await),
        ["Gala 100%"]
    );
    assert_eq!(
        list(&app, ADMIN_KEY, "?status=active").await["accounts"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_list_parameters_are_400_and_kiosks_may_not_list() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    for query in [
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        "?after=not-a-uuid",
        "?status=gone",
        "?q=",
        "?unknown=1",
    ] {
        let (status, body) =
            problem(app.get(&format!("/v1/accounts{query}"), ADMIN_KEY).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["code"], "invalid_request", "{query}");
    }
    let long = "x".repeat(201);
    let (status, _) = problem(app.get(&format!("/v1/accounts?q={long}"), ADMIN_KEY).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let kiosk = app.kiosk_key(account).await;
    let (status, body) = problem(app.get("/v1/accounts", &kiosk).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

async fn post_with_key(app: &TestApp, path: &str, key: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .bearer_auth(ADMIN_KEY)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_account_creation_creates_one_account() {
    let app = TestApp::spawn().await;
    let body = json!({"name": "Wedding Müller"});
    let first = post_with_key(&app, "/v1/accounts", "retry-7", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");

    let again = post_with_key(&app, "/v1/accounts", "retry-7", &body).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let again: Value = again.json().await.expect("json");
    assert_eq!(again["account_id"], first["account_id"]);
    assert_eq!(count(&app, "accounts"), 1);

    // Same key, other body: 422 and nothing created.
    let (status, problem_body) = problem(
        post_with_key(
            &app,
            "/v1/accounts",
            "retry-7",
            &json!({"name": "Someone else"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem_body["code"], "idempotency_key_reused");
    assert_eq!(count(&app, "accounts"), 1);

    // Another key creates another account; a bad key is 400 and creates none.
    let other = post_with_key(&app, "/v1/accounts", "retry-8", &body).await;
    assert_eq!(other.status(), StatusCode::CREATED);
    let (status, _) =
        problem(post_with_key(&app, "/v1/accounts", &"k".repeat(201), &body).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(count(&app, "accounts"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_create_one_account_and_one_key() {
    let app = TestApp::spawn().await;
    let body = json!({"name": "Gala"});
    let responses =
        join_all((0..16).map(|_| post_with_key(&app, "/v1/accounts", "same-click", &body))).await;
    let mut ids = Vec::new();
    let mut statuses = Vec::new();
    for response in responses {
        statuses.push(response.status());
        let value: Value = response.json().await.expect("json");
        ids.push(value["account_id"].as_str().expect("id").to_owned());
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::CREATED || *s == StatusCode::OK));
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(count(&app, "accounts"), 1);

    let account = ids[0].clone();
    let path = format!("/v1/accounts/{account}/api-keys");
    let key_body = json!({"scope": "kiosk", "label": "booth 1"});
    let responses =
        join_all((0..16).map(|_| post_with_key(&app, &path, "booth-1", &key_body))).await;
    let mut secrets = 0;
    let mut key_ids = Vec::new();
    for response in responses {
        let status = response.status();
        let value: Value = response.json().await.expect("json");
        if status == StatusCode::CREATED {
            assert!(value["key"].is_string());
            secrets += 1;
        } else {
            assert_eq!(status, StatusCode::OK);
            assert_eq!(value["key"], Value::Null, "a replay shows the secret again");
        }
        key_ids.push(value["key_id"].as_str().expect("key id").to_owned());
    }
    assert_eq!(secrets, 1);
    key_ids.dedup();
    assert_eq!(key_ids.len(), 1);
    assert_eq!(count(&app, "api_keys"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_key_creation_never_shows_the_secret_again() {
    let app = TestApp::spawn().await;
    let body = json!({"scope": "finance", "label": "books"});
    let first = post_with_key(&app, "/v1/api-keys", "books-1", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");
    let secret = first["key"].as_str().expect("secret").to_owned();

    let replay = post_with_key(&app, "/v1/api-keys", "books-1", &body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let text = replay.text().await.expect("body");
    assert!(!text.contains(&secret), "the replay shows the secret");
    let replay: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(replay["key_id"], first["key_id"]);
    assert_eq!(replay["key"], Value::Null);
    assert_eq!(replay["scope"], "finance");

    let (status, body) = problem(
        post_with_key(
            &app,
            "/v1/api-keys",
            "books-1",
            &json!({"scope": "admin", "label": "books"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // The same Idempotency-Key on another endpoint is another key.
    let account = app.create_account(0).await;
    let kiosk = post_with_key(
        &app,
        &format!("/v1/accounts/{account}/api-keys"),
        "books-1",
        &json!({"scope": "kiosk", "label": "books"}),
    )
    .await;
    assert_eq!(kiosk.status(), StatusCode::CREATED);
    // The admin key (finance) plus the kiosk key.
    assert_eq!(count(&app, "api_keys"), 2);
}
