//! The console at `/console` and the endpoints made for it: the system
//! summary, `GET /v1/me`, the reservation list and the ledger's `since`.

use diesel::{IntoSql, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::reaper::{run_pass_exclusive, ReaperSettings, REAPER_BATCH_MAX};

use crate::helpers::{problem, TestApp, ADMIN_KEY};

/// The files the page loads; each must be served with the policy.
const ASSETS: [(&str, &str); 11] = [
    ("console.css", "text/css"),
    ("app.js", "text/javascript"),
    ("api.js", "text/javascript"),
    ("dom.js", "text/javascript"),
    ("chart.js", "text/javascript"),
    ("accounts.js", "text/javascript"),
    ("account.js", "text/javascript"),
    ("period.js", "text/javascript"),
    ("reconciliation.js", "text/javascript"),
    ("revenue.js", "text/javascript"),
    ("system.js", "text/javascript"),
];

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A policy that allows scripts from this origin only: no inline script,
/// no eval, no framing.
fn assert_strict_policy(policy: &str, what: &str) {
    let directives: Vec<&str> = policy.split(';').map(str::trim).collect();
    for wanted in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(directives.contains(&wanted), "{what}: {policy}");
    }
    assert!(!policy.contains("unsafe-inline"), "{what}: {policy}");
    assert!(!policy.contains("unsafe-eval"), "{what}: {policy}");
    assert!(
        !policy.contains("http"),
        "{what} allows another origin: {policy}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_and_assets_are_served_with_a_strict_policy() {
    let app = TestApp::spawn().await;
    let get = |path: String| app.client.get(app.url(&path)).send();

    let page = get("/console".into()).await.expect("sent");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(header(&page, "content-type").starts_with("text/html"));
    assert_strict_policy(&header(&page, "content-security-policy"), "/console");
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
    let html = page.text().await.expect("text");
    // Every script is a file: the policy would block an inline one anyway,
    // and the page must not depend on one.
    assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script type=\"module\" src=").count(),
        "an inline script in {html}"
    );
    assert!(!html.contains(" onclick=") && !html.contains(" onsubmit="));
    assert!(!html.contains("https://"), "an outside resource in {html}");

    let mut imported = Vec::new();
    for (file, content_type) in ASSETS {
        let response = get(format!("/console/{file}")).await.expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{file}");
        assert!(
            header(&response, "content-type").starts_with(content_type),
            "{file}: {}",
            header(&response, "content-type")
        );
        assert_strict_policy(&header(&response, "content-security-policy"), file);
        let text = response.text().await.expect("text");
        assert!(text.len() > 200, "{file} is {} bytes", text.len());
        // Every module another imports is one of the served files.
        for line in text.lines().filter(|line| line.contains(" from \"./")) {
            let name = line.split("from \"./").nth(1).expect("a name");
            imported.push(name.trim_end_matches("\";").to_owned());
        }
        assert!(!text.contains("https://"), "{file} loads from outside");
    }
    assert!(imported.len() >= 8, "{imported:?}");
    for name in imported {
        assert!(
            ASSETS.iter().any(|(file, _)| *file == name),
            "{name} is imported but not served"
        );
    }

    for other in ["/console/index.html", "/console/missing.js"] {
        let (status, body) = problem(get(other.into()).await.expect("sent")).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{other}"
        );
    }
    // An escaped `/` never reaches the file lookup: the path is refused.
    let (status, body) = problem(get("/console/..%2FCargo.toml".into()).await.expect("sent")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn me_tells_the_scope_of_each_kind_of_key() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;
    let me = |key: String| {
        let app = &app;
        async move {
            let response = app.get("/v1/me", &key).await;
            assert_eq!(response.status(), StatusCode::OK);
            response.json::<Value>().await.expect("json")
        }
    };
    let admin = me(ADMIN_KEY.into()).await;
    assert_eq!(
        (&admin["scope"], &admin["key_id"], &admin["account_id"]),
        (&json!("admin"), &Value::Null, &Value::Null)
    );
    let kiosk_me = me(kiosk).await;
    assert_eq!(kiosk_me["scope"], "kiosk");
    assert_eq!(kiosk_me["account_id"], account.to_string());
    assert!(kiosk_me["key_id"].is_string());
    let finance_me = me(finance).await;
    assert_eq!(finance_me["scope"], "finance");
    assert_eq!(finance_me["account_id"], Value::Null);

    let (status, body) = problem(app.get("/v1/me", "tb_not-a-key").await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_summary_is_for_finance_and_admin_and_counts_what_is_in_flight() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(20).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;

    let (status, body) = problem(app.get("/v1/system/summary", &kiosk).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (status, _) = problem(app.get("/v1/system/summary", "tb_not-a-key").await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let summary = |key: String| {
        let app = &app;
        async move {
            let response = app.get("/v1/system/summary", &key).await;
            assert_eq!(response.status(), StatusCode::OK);
            response.json::<Value>().await.expect("json")
        }
    };
    let before = summary(finance.clone()).await;
    assert_eq!(before["ready"], true);
    assert_eq!(before["readiness"], "ready");
    assert_eq!(before["database"]["reservations_held"], 0);
    assert_eq!(before["database"]["reserved_tokens"], 0);
    assert_eq!(before["database"]["next_expiry_at"], Value::Null);
    assert_eq!(before["database"]["accounts"], 1);

    let mut reservations = Vec::new();
    for amount in [3, 4, 5] {
        let response = app.reserve(account, &kiosk, Uuid::new_v4(), amount).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        reservations.push(body["reservation_id"].as_str().expect("id").to_owned());
    }
    // A released reservation holds nothing: it is not in flight.
    let released = app
        .post(
            &format!(
                "/v1/accounts/{account}/reservations/{}/release",
                reservations[2]
            ),
            &kiosk,
            &json!({}),
        )
        .await;
    assert_eq!(released.status(), StatusCode::OK);
    app.patch(
        &format!("/v1/accounts/{account}"),
        ADMIN_KEY,
        &json!({"status": "suspended"}),
    )
    .await;
    // The reaper's pass records the invariant's state for every replica.
    let mut conn = app.conn();
    let settings = ReaperSettings {
        batch: REAPER_BATCH_MAX,
        job_max_attempts: 3,
        grant_expiring_notice_hours: 72,
    };
    tokio::task::spawn_blocking(move || {
        run_pass_exclusive(&mut conn, &settings, None).expect("pass")
    })
    .await
    .expect("joined")
    .expect("no other pass");

    let after = summary(ADMIN_KEY.into()).await;
    let database = &after["database"];
    assert_eq!(database["reservations_held"], 2);
    assert_eq!(database["reserved_tokens"], 7);
    assert_eq!(database["accounts_suspended"], 1);
    assert!(database["next_expiry_at"].is_string(), "{after}");
    assert!(
        database["oldest_reservation_age_seconds"]
            .as_f64()
            .expect("age")
            >= 0.0
    );
    assert!(database["reaper_last_success_at"].is_string(), "{after}");
    assert_eq!(database["invariant_violations"], 0);
    assert_eq!(after["invariant_status"], "ok");
    assert_eq!(after["replica"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(after["replica"]["provider_error_ratio"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_list_newest_first_by_state_with_a_cursor() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let response = app.reserve(account, &kiosk, Uuid::new_v4(), 2).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        ids.push(body["reservation_id"].as_str().expect("id").to_owned());
    }
    let committed = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{}/commit", ids[0]),
            &kiosk,
            &json!({}),
        )
        .await;
    assert_eq!(committed.status(), StatusCode::OK);

    let list = |query: String, key: String| {
        let app = &app;
        async move {
            let response = app
                .get(&format!("/v1/accounts/{account}/reservations{query}"), &key)
                .await;
            assert_eq!(response.status(), StatusCode::OK, "{query}");
            response.json::<Value>().await.expect("json")
        }
    };
    let ids_of = |page: &Value| -> Vec<String> {
        page["reservations"]
            .as_array()
            .expect("list")
            .iter()
            .map(|r| r["reservation_id"].as_str().expect("id").to_owned())
            .collect()
    };
    let held = list("?state=held".into(), kiosk.clone()).await;
    assert_eq!(ids_of(&held), vec![ids[2].clone(), ids[1].clone()]);
    assert_eq!(held["next_after"], Value::Null);
    assert!(held["reservations"][0]["expires_at"].is_string());

    let first = list("?limit=2".into(), ADMIN_KEY.into()).await;
    assert_eq!(ids_of(&first), vec![ids[2].clone(), ids[1].clone()]);
    let cursor = first["next_after"].as_str().expect("a cursor").to_owned();
    let rest = list(format!("?limit=2&after={cursor}"), app.finance_key().await).await;
    assert_eq!(ids_of(&rest), vec![ids[0].clone()]);
    assert_eq!(rest["reservations"][0]["state"], "committed");
    assert_eq!(rest["next_after"], Value::Null);

    for bad in ["?state=pending", "?limit=0", "?limit=501", "?after=x"] {
        let (status, body) = problem(
            app.get(
                &format!("/v1/accounts/{account}/reservations{bad}"),
                ADMIN_KEY,
            )
            .await,
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{bad}"
        );
    }
    // Another account's kiosk cannot even learn that the account exists.
    let other = app.create_account(0).await;
    let stranger = app.kiosk_key(other).await;
    let (status, _) = problem(
        app.get(&format!("/v1/accounts/{account}/reservations"), &stranger)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_since_leaves_out_older_entries() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let ledger = |query: String| {
        let app = &app;
        async move {
            let response = app
                .get(&format!("/v1/accounts/{account}/ledger{query}"), ADMIN_KEY)
                .await;
            assert_eq!(response.status(), StatusCode::OK, "{query}");
            response.json::<Value>().await.expect("json")
        }
    };
    let all = ledger(String::new()).await;
    let first_at = all["entries"][0]["created_at"]
        .as_str()
        .expect("time")
        .to_owned();
    // The database's clock: the second credit is written after this instant.
    let mut conn = app.conn();
    let boundary: chrono::DateTime<chrono::Utc> =
        diesel::select(diesel::dsl::now.into_sql::<diesel::sql_types::Timestamptz>())
            .get_result(&mut conn)
            .expect("now");
    app.credit(account, 5).await;

    let since = boundary.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let recent = ledger(format!("?since={}", since.replace('+', "%2B"))).await;
    let amounts: Vec<i64> = recent["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["amount"].as_i64().expect("amount"))
        .collect();
    assert_eq!(amounts, vec![5]);
    let everything = ledger(format!("?since={first_at}")).await;
    assert_eq!(everything["entries"].as_array().expect("entries").len(), 2);

    let (status, body) = problem(
        app.get(
            &format!("/v1/accounts/{account}/ledger?since=yesterday"),
            ADMIN_KEY,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["detail"].as_str().expect("detail").contains("since"),
        "{body}"
    );
}
