//! Keys that expire, the key list, `last_used_at`, and the audit log.

use diesel::prelude::*;
use diesel::sql_types::{Nullable, Timestamptz, Uuid as SqlUuid};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

/// The key id inside a presented key (`tbk_<id>_<secret>`).
fn key_id_of(key: &str) -> Uuid {
    let id = key
        .strip_prefix("tbk_")
        .and_then(|rest| rest.split('_').next())
        .expect("well-formed key");
    Uuid::parse_str(id).expect("uuid")
}

#[derive(QueryableByName)]
struct LastUsed {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_used_at: Option<chrono::DateTime<chrono::Utc>>,
}

fn last_used(app: &TestApp, key: Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    diesel::sql_query("SELECT last_used_at FROM api_keys WHERE id = $1")
        .bind::<SqlUuid, _>(key)
        .get_result::<LastUsed>(&mut app.conn())
        .expect("key row")
        .last_used_at
}

fn execute(app: &TestApp, sql: &str, key: Uuid) {
    diesel::sql_query(sql)
        .bind::<SqlUuid, _>(key)
        .execute(&mut app.conn())
        .expect("statement");
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(app: &TestApp, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(&mut app.conn())
        .expect("count")
        .n
}

/// Every audit event of `target`, oldest first, through the API.
async fn events_of(app: &TestApp, target: &str) -> Vec<Value> {
    let response = app
        .client
        .get(app.url("/v1/audit-events"))
        .query(&[("target", target), ("limit", "1000")])
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let page: Value = response.json().await.expect("json");
    assert!(page["next_after"].is_null());
    page["events"].as_array().expect("events").clone()
}

fn actions(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["action"].as_str().expect("action"))
        .collect()
}

async fn kiosk_key_expiring(app: &TestApp, account: Uuid, expires_at: &str) -> Value {
    let response = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "expiring", "expires_at": expires_at}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_refused_like_a_revoked_one() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let created = kiosk_key_expiring(&app, account, &tomorrow).await;
    assert!(created["expires_at"].is_string(), "{created}");
    let key = created["key"].as_str().expect("key").to_owned();
    let read = format!("/v1/accounts/{account}");

    // Before its expiry the key reads and spends.
    assert_eq!(app.get(&read, &key).await.status(), StatusCode::OK);
    assert_eq!(
        app.reserve(account, &key, Uuid::new_v4(), 1).await.status(),
        StatusCode::CREATED
    );

    // Past its expiry: 401 on a read (checked by the service) and on a
    // spend (checked by the money engine), and nothing was reserved.
    execute(
        &app,
        "UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = $1",
        key_id_of(&key),
    );
    let (status, body) = problem(app.get(&read, &key).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    let before = app.snapshot(account);
    let (status, body) = problem(app.reserve(account, &key, Uuid::new_v4(), 1).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    assert_eq!(app.snapshot(account), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_expiry_is_400_and_creates_nothing() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let keys = "SELECT count(*) AS n FROM api_keys";
    let events = "SELECT count(*) AS n FROM audit_events";
    let (keys_before, events_before) = (count(&app, keys), count(&app, events));
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    for expires_at in [
        json!(yesterday),
        json!("tomorrow"),
        json!("2030-13-01T00:00:00Z"),
        json!(12),
    ] {
        for (path, scope) in [
            (format!("/v1/accounts/{account}/api-keys"), "kiosk"),
            ("/v1/api-keys".to_owned(), "finance"),
        ] {
            let body = json!({"scope": scope, "label": "x", "expires_at": expires_at});
            let (status, problem_body) = problem(app.post(&path, ADMIN_KEY, &body).await).await;
            assert_eq!(
                (status, problem_body["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("invalid_request")),
                "{body}"
            );
        }
    }
    assert_eq!(
        (count(&app, keys), count(&app, events)),
        (keys_before, events_before)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_list_has_no_secret_and_filters_by_account() {
    let app = TestApp::spawn().await;
    let (one, two) = (app.create_account(0).await, app.create_account(0).await);
    let key_one = app.kiosk_key(one).await;
    let key_two = app.kiosk_key(two).await;
    let finance = app.finance_key().await;

    let response = app
        .get(&format!("/v1/api-keys?account_id={one}"), ADMIN_KEY)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.expect("body");
    assert!(!text.contains(&key_one[key_one.len() - 64..]), "no secret");
    let page: Value = serde_json::from_str(&text).expect("json");
    let keys = page["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{page}");
    let shown = keys[0].as_object().expect("object");
    let mut fields: Vec<&str> = shown.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "account_id",
            "budget",
            "created_at",
            "expires_at",
            "key_id",
            "label",
            "last_used_at",
            "revoked_at",
            "scope"
        ]
    );
    assert_eq!(shown["key_id"], json!(key_id_of(&key_one)));
    assert_eq!(shown["scope"], "kiosk");

    // All keys, one per page, in key id order, with a cursor.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(after) => format!("/v1/api-keys?limit=1&after={after}"),
            None => "/v1/api-keys?limit=1".to_owned(),
        };
        let page: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
        for key in page["keys"].as_array().expect("keys") {
            seen.push(key["key_id"].as_str().expect("id").to_owned());
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let mut wanted: Vec<String> = [&key_one, &key_two, &finance]
        .iter()
        .map(|key| key_id_of(key).to_string())
        .collect();
    wanted.sort();
    assert_eq!(seen, wanted);

    // Admin only; bad parameters are 400.
    for key in [&finance, &key_one] {
        let (status, _) = problem(app.get("/v1/api-keys", key).await).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    for query in [
        "limit=0",
        "limit=1001",
        "after=nope",
        "account_id=7",
        "colour=red",
    ] {
        let (status, _) = problem(app.get(&format!("/v1/api-keys?{query}"), ADMIN_KEY).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_used_at_is_written_at_most_once_a_minute() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;

    // A key the service verifies (a read).
    let reader = app.kiosk_key(account).await;
    let reader_id = key_id_of(&reader);
    assert_eq!(last_used(&app, reader_id), None);
    let read = format!("/v1/accounts/{account}");
    assert_eq!(app.get(&read, &reader).await.status(), StatusCode::OK);
    let first = last_used(&app, reader_id).expect("set by the first use");
    assert_eq!(app.get(&read, &reader).await.status(), StatusCode::OK);
    assert_eq!(last_used(&app, reader_id), Some(first), "not rewritten");
    // Older than a minute: the next use brings it up to date.
    execute(
        &app,
        "UPDATE api_keys SET last_used_at = now() - interval '2 minutes' WHERE id = $1",
        reader_id,
    );
    let stale = last_used(&app, reader_id).expect("set");
    assert_eq!(app.get(&read, &reader).await.status(), StatusCode::OK);
    assert!(last_used(&app, reader_id).expect("set") > stale);

    // A key that only spends (verified by the money engine).
    let spender = app.kiosk_key(account).await;
    let spender_id = key_id_of(&spender);
    assert_eq!(
        app.reserve(account, &spender, Uuid::new_v4(), 1)
            .await
            .status(),
        StatusCode::CREATED
    );
    let first = last_used(&app, spender_id).expect("set by the engine");
    assert_eq!(
        app.reserve(account, &spender, Uuid::new_v4(), 1)
            .await
            .status(),
        StatusCode::CREATED
    );
    assert_eq!(last_used(&app, spender_id), Some(first), "not rewritten");

    // The list shows it.
    let page: Value = app
        .get(&format!("/v1/api-keys?account_id={account}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(page["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .all(|key| key["last_used_at"].is_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_administrative_change_has_exactly_one_audit_event() {
    let app = TestApp::spawn().await;
    let send = |method: reqwest::Method, path: &str, body: Value, request_id: &str| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(ADMIN_KEY)
            .header("x-request-id", request_id)
            .json(&body)
            .send()
    };

    // Account create.
    let response = send(
        reqwest::Method::POST,
        "/v1/accounts",
        json!({"name": "audited", "max_active_reservations": 3}),
        "req-create",
    )
    .await
    .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let account: Value = response.json().await.expect("json");
    let account = account["account_id"].as_str().expect("id").to_owned();
    let target = format!("account:{account}");

    // Credit, its replay, a refused adjustment, an adjustment.
    let credit = json!({"amount": 40, "external_ref": format!("pay-{account}")});
    let credits = format!("/v1/accounts/{account}/credits");
    let response = send(
        reqwest::Method::POST,
        &credits,
        credit.clone(),
        "req-credit",
    )
    .await
    .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = send(reqwest::Method::POST, &credits, credit, "req-replay")
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK, "a replay");
    let adjustments = format!("/v1/accounts/{account}/adjustments");
    let too_much =
        json!({"amount": -1000, "reason": "chargeback", "external_ref": format!("cb-{account}")});
    let response = send(reqwest::Method::POST, &adjustments, too_much, "req-refused")
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let adjust =
        json!({"amount": -15, "reason": "chargeback", "external_ref": format!("adj-{account}")});
    let response = send(reqwest::Method::POST, &adjustments, adjust, "req-adjust")
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);

    // Patch status, patch limit, a refused patch.
    let patch = format!("/v1/accounts/{account}");
    for (body, request_id, wanted) in [
        (
            json!({"status": "suspended"}),
            "req-suspend",
            StatusCode::OK,
        ),
        (
            json!({"max_active_reservations": 7}),
            "req-limit",
            StatusCode::OK,
        ),
        (
            json!({"status": "closed"}),
            "req-bad",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let response = send(reqwest::Method::PATCH, &patch, body, request_id)
            .await
            .expect("sent");
        assert_eq!(response.status(), wanted, "{request_id}");
    }

    let events = events_of(&app, &target).await;
    assert_eq!(
        actions(&events),
        [
            "account.created",
            "credit.created",
            "adjustment.created",
            "account.updated",
            "account.updated"
        ]
    );
    for event in &events {
        assert_eq!(event["actor"], "bootstrap-admin");
        assert_eq!(event["target"], target.as_str());
        assert!(event["event_id"].is_string() && event["created_at"].is_string());
    }
    let request_ids: Vec<&str> = events
        .iter()
        .map(|event| event["request_id"].as_str().expect("request id"))
        .collect();
    assert_eq!(
        request_ids,
        [
            "req-create",
            "req-credit",
            "req-adjust",
            "req-suspend",
            "req-limit"
        ]
    );
    assert!(events[0]["before"].is_null());
    assert_eq!(events[0]["after"]["name"], "audited");
    assert_eq!(events[0]["after"]["max_active_reservations"], 3);
    assert_eq!(events[1]["after"]["amount"], 40);
    assert_eq!(events[1]["after"]["available"], 40);
    assert_eq!(
        events[1]["after"]["external_ref"],
        format!("pay-{account}").as_str()
    );
    assert_eq!(events[2]["after"]["amount"], -15);
    assert_eq!(events[2]["after"]["available"], 25);
    assert_eq!(events[2]["after"]["reason"], "chargeback");
    assert_eq!(events[3]["before"], json!({"status": "active"}));
    assert_eq!(events[3]["after"], json!({"status": "suspended"}));
    assert_eq!(events[4]["before"], json!({"max_active_reservations": 3}));
    assert_eq!(events[4]["after"], json!({"max_active_reservations": 7}));

    // Key create and revoke (twice: the second is a no-op, no event).
    let response = send(
        reqwest::Method::PATCH,
        &patch,
        json!({"status": "active"}),
        "req-reactivate",
    )
    .await
    .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let response = send(
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/api-keys"),
        json!({"scope": "kiosk", "label": "front desk"}),
        "req-key",
    )
    .await
    .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("json");
    let key_id = created["key_id"].as_str().expect("key id").to_owned();
    for request_id in ["req-revoke", "req-revoke-again"] {
        let response = send(
            reqwest::Method::DELETE,
            &format!("/v1/api-keys/{key_id}"),
            json!({}),
            request_id,
        )
        .await
        .expect("sent");
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    let key_events = events_of(&app, &format!("api_key:{key_id}")).await;
    assert_eq!(actions(&key_events), ["api_key.created", "api_key.revoked"]);
    assert_eq!(key_events[0]["request_id"], "req-key");
    assert_eq!(key_events[0]["after"]["scope"], "kiosk");
    assert_eq!(key_events[0]["after"]["account_id"], account.as_str());
    assert_eq!(key_events[0]["after"]["label"], "front desk");
    assert!(key_events[0]["after"].get("key").is_none());
    assert_eq!(key_events[1]["request_id"], "req-revoke");
    assert_eq!(key_events[1]["before"], json!({"revoked_at": null}));
    assert!(key_events[1]["after"]["revoked_at"].is_string());
    assert_eq!(events_of(&app, &target).await.len(), 6);

    // A key of another admin is its actor.
    let admin: Value = app
        .post(
            "/v1/api-keys",
            ADMIN_KEY,
            &json!({"scope": "admin", "label": "ops"}),
        )
        .await
        .json()
        .await
        .expect("json");
    let admin_key = admin["key"].as_str().expect("key");
    let response = app
        .post(
            &format!("/v1/accounts/{account}/credits"),
            admin_key,
            &json!({"amount": 1, "external_ref": format!("ops-{account}")}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let events = events_of(&app, &target).await;
    let last = events.last().expect("event");
    assert_eq!(last["action"], "credit.created");
    assert_eq!(last["actor"], admin["key_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_is_append_only() {
    let app = TestApp::spawn().await;
    app.create_account(0).await;
    let mut conn = app.conn();
    for sql in [
        "UPDATE audit_events SET actor = 'someone else'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
    ] {
        let error = diesel::sql_query(sql)
            .execute(&mut conn)
            .expect_err("refused");
        assert!(error.to_string().contains("append-only"), "{sql}: {error}");
    }
    assert_eq!(count(&app, "SELECT count(*) AS n FROM audit_events"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finance_reads_the_audit_log_and_a_kiosk_cannot() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;

    // account, credit, kiosk key, finance key: four events, two per page.
    let mut seen = 0;
    let mut after: Option<i64> = None;
    loop {
        let path = match after {
            Some(after) => format!("/v1/audit-events?limit=2&after={after}"),
            None => "/v1/audit-events?limit=2".to_owned(),
        };
        let response = app.get(&path, &finance).await;
        assert_eq!(response.status(), StatusCode::OK);
        let page: Value = response.json().await.expect("json");
        seen += page["events"].as_array().expect("events").len();
        match page["next_after"].as_i64() {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, 4);

    let (status, body) = problem(app.get("/v1/audit-events", &kiosk).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    for query in [
        "limit=0",
        "limit=1001",
        "after=-1",
        "after=x",
        "target=",
        "who=me",
    ] {
        let (status, _) = problem(
            app.get(&format!("/v1/audit-events?{query}"), &finance)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
    }
}
