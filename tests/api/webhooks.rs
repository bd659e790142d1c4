//! Events and webhooks: the feed, threshold crossings under concurrent
//! spending, signed deliveries verified by an independent Standard
//! Webhooks implementation, retries with one `webhook-id`, rotation, 410,
//! the address guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};
use crate::receiver::{verified_with, Receiver};

async fn feed(app: &TestApp, key: &str, query: &str) -> Value {
    let response = app.get(&format!("/v1/events?{query}"), key).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("json")
}

/// The account's events from the feed, oldest first, following
/// `next_after` and long-polling until `count` have come. (An event is
/// listed once every transaction older than it has ended — normally
/// milliseconds after its commit — so a read right after a write may not
/// show it yet.)
async fn feed_until(app: &TestApp, key: &str, filter: &str, count: usize) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after: Option<String> = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while events.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} events: {events:#?}",
            events.len()
        );
        let mut query = format!("{filter}&limit=7&wait_seconds=5");
        if let Some(after) = &after {
            query.push_str(&format!("&after={after}"));
        }
        let page = feed(app, key, &query).await;
        after = page["next_after"].as_str().map(str::to_owned);
        events.extend(page["events"].as_array().expect("events").iter().cloned());
    }
    events
}

/// The account's events as the table holds them, in feed order: the
/// ground truth the feed must match exactly.
fn events_in_table(app: &TestApp, account: Uuid) -> Vec<String> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        r#type: String,
    }
    let rows: Vec<Row> =
        diesel::sql_query("SELECT type FROM events WHERE account_id = $1 ORDER BY txid, seq")
            .bind::<diesel::sql_types::Uuid, _>(account)
            .load(&mut app.conn())
            .expect("events");
    rows.into_iter().map(|row| row.r#type).collect()
}

/// The account's events from the feed, checked against the table.
async fn all_events(app: &TestApp, account: Uuid) -> Vec<Value> {
    let expected = events_in_table(app, account);
    let events = feed_until(
        app,
        ADMIN_KEY,
        &format!("account_id={account}"),
        expected.len(),
    )
    .await;
    assert_eq!(
        types_of(&events),
        expected,
        "the feed lists exactly the table's events"
    );
    events
}

fn types_of(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().expect("type"))
        .collect()
}

async fn create_endpoint(app: &TestApp, body: &Value) -> Value {
    let response = app.post("/v1/webhook-endpoints", ADMIN_KEY, body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.expect("json")
}

/// Concurrent reservations take the account across its threshold once and
/// to zero once; concurrent releases bring it back once; spending again is
/// a second crossing. Exactly one event per crossing, in that order, each
/// with the balances after the movement that crossed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_balance_low_per_crossing_under_concurrent_spending() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app
        .create_account_from(&json!({"name": "wedding", "max_active_reservations": 0,
                                     "low_balance_threshold": 50}))
        .await;
    app.credit(account, 100).await;
    let kiosk = app.kiosk_key(account).await;

    // 25 kiosks at once, 5 tokens each: 20 succeed (100 → 0), 5 are refused.
    let spend = |count: usize| {
        let tasks: Vec<_> = (0..count)
            .map(|_| {
                let (app, kiosk) = (Arc::clone(&app), kiosk.clone());
                tokio::spawn(async move {
                    let response = app.reserve(account, &kiosk, Uuid::new_v4(), 5).await;
                    let status = response.status();
                    let body: Value = response.json().await.expect("json");
                    (status, body)
                })
            })
            .collect();
        async move {
            let mut held = Vec::new();
            for task in tasks {
                let (status, body) = task.await.expect("task");
                if status == StatusCode::CREATED {
                    held.push(body["reservation_id"].as_str().expect("id").to_owned());
                }
            }
            held
        }
    };
    let held = spend(25).await;
    assert_eq!(held.len(), 20);
    // Created below its threshold (0 < 50): low from the start; the credit
    // of 100 recovers it.
    let events = all_events(&app, account).await;
    assert_eq!(
        types_of(&events),
        [
            "account.balance_low",
            "credit.created",
            "account.balance_recovered",
            "account.balance_low",
            "account.balance_depleted"
        ]
    );
    assert_eq!(events[0]["data"]["balances"]["available"], 0);
    assert_eq!(events[2]["data"]["balances"]["available"], 100);
    let low = &events[3];
    assert_eq!(low["data"]["account_id"], json!(account));
    assert_eq!(low["data"]["low_balance_threshold"], 50);
    let available_at_low = low["data"]["balances"]["available"]
        .as_i64()
        .expect("available");
    assert!((45..50).contains(&available_at_low), "{low}");
    assert_eq!(low["data"]["entry"]["kind"], "reserve");
    assert_eq!(events[4]["data"]["balances"]["available"], 0);

    // Release 12 at once: 0 → 60, one recovery (at the crossing release).
    let releases: Vec<_> = held[..12]
        .iter()
        .map(|reservation| {
            let (app, kiosk, reservation) = (Arc::clone(&app), kiosk.clone(), reservation.clone());
            tokio::spawn(async move {
                app.post(
                    &format!("/v1/accounts/{account}/reservations/{reservation}/release"),
                    &kiosk,
                    &json!({}),
                )
                .await
                .status()
            })
        })
        .collect();
    for release in releases {
        assert_eq!(release.await.expect("task"), StatusCode::OK);
    }
    // And spend again: 60 → 0, the second crossing.
    assert_eq!(spend(14).await.len(), 12);
    let events = all_events(&app, account).await;
    assert_eq!(
        types_of(&events),
        [
            "account.balance_low",
            "credit.created",
            "account.balance_recovered",
            "account.balance_low",
            "account.balance_depleted",
            "account.balance_recovered",
            "account.balance_low",
            "account.balance_depleted",
        ]
    );
    let recovered = events[5]["data"]["balances"]["available"]
        .as_i64()
        .expect("available");
    assert!((50..55).contains(&recovered), "{}", events[5]);
    // Admin's type filter and a kiosk's own feed agree.
    let lows = feed_until(
        &app,
        ADMIN_KEY,
        &format!("account_id={account}&type=account.balance_low"),
        3,
    )
    .await;
    assert_eq!(
        types_of(&lows),
        [
            "account.balance_low",
            "account.balance_low",
            "account.balance_low"
        ]
    );
    let own = feed_until(&app, &kiosk, "type=account.balance_depleted", 2).await;
    assert_eq!(
        types_of(&own),
        ["account.balance_depleted", "account.balance_depleted"]
    );
    app.assert_invariants(account);
}

/// A threshold set above the balance reports balance_low at once; set to 0
/// it reports nothing.
#[tokio::test]
async fn raising_the_threshold_reports_balance_low() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(30).await;
    let patched = app
        .patch(
            &format!("/v1/accounts/{account}"),
            ADMIN_KEY,
            &json!({"low_balance_threshold": 40}),
        )
        .await;
    assert_eq!(patched.status(), StatusCode::OK);
    let view: Value = patched.json().await.expect("json");
    assert_eq!(view["low_balance_threshold"], 40);
    assert_eq!(view["balance_low"], true);
    let off = app
        .patch(
            &format!("/v1/accounts/{account}"),
            ADMIN_KEY,
            &json!({"low_balance_threshold": 0}),
        )
        .await;
    assert_eq!(off.status(), StatusCode::OK);
    let types: Vec<String> = all_events(&app, account)
        .await
        .iter()
        .map(|event| event["type"].as_str().expect("type").to_owned())
        .collect();
    assert_eq!(types, ["credit.created", "account.balance_low"]);
    let bad = app
        .patch(
            &format!("/v1/accounts/{account}"),
            ADMIN_KEY,
            &json!({"low_balance_threshold": -1}),
        )
        .await;
    let (status, body) = problem(bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["detail"]
        .as_str()
        .expect("detail")
        .contains("low_balance_threshold"));
}

/// The feed: kiosks see only their account, bad input is 400, and a long
/// poll answers as soon as an event commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_pages_filters_and_long_polls() {
    let app = Arc::new(TestApp::spawn().await);
    let ours = app.funded_account(10).await;
    let theirs = app.funded_account(20).await;
    let kiosk = app.kiosk_key(ours).await;
    let all = feed_until(&app, ADMIN_KEY, "", 2).await;
    assert_eq!(all.len(), 2);
    let own_events = feed_until(&app, &kiosk, "", 1).await;
    assert_eq!(own_events.len(), 1);
    assert_eq!(own_events[0]["data"]["account_id"], json!(ours));
    let other = app
        .get(&format!("/v1/events?account_id={theirs}"), &kiosk)
        .await;
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    for query in [
        "type=account.nope",
        "limit=0",
        "wait_seconds=31",
        "after=00000000-0000-0000-0000-000000000000",
        "after=nope",
    ] {
        let response = app.get(&format!("/v1/events?{query}"), ADMIN_KEY).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
    }
    // Long poll: nothing new, so it is still waiting 300 ms later; a credit
    // then ends the wait at once.
    let cursor = all[1]["id"].as_str().expect("cursor").to_owned();
    let waiter = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let started = Instant::now();
            let page = feed(&app, ADMIN_KEY, &format!("after={cursor}&wait_seconds=20")).await;
            (started.elapsed(), page)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the long poll answered with nothing new"
    );
    app.credit(theirs, 5).await;
    let (elapsed, page) = waiter.await.expect("task");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let events = page["events"].as_array().expect("events");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "credit.created");
    assert_eq!(events[0]["data"]["credit"]["amount"], 5);
    // Nothing new: the same cursor comes back.
    let again = feed(
        &app,
        ADMIN_KEY,
        &format!("after={}", page["next_after"].as_str().expect("cursor")),
    )
    .await;
    assert!(again["events"].as_array().expect("events").is_empty());
    assert_eq!(again["next_after"], page["next_after"]);
}

/// `start=now` begins at the end of the feed without its history, and
/// `start=<instant>` after the last event created before it; with a long
/// poll, a `start=now` watcher gets the next event and nothing older.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_starts_now_or_at_an_instant() {
    let app = Arc::new(TestApp::spawn().await);
    let ours = app.funded_account(10).await;
    let kiosk = app.kiosk_key(ours).await;
    app.credit(ours, 1).await;
    app.credit(ours, 2).await;
    let history = feed_until(&app, &kiosk, "", 3).await;
    assert_eq!(history.len(), 3, "{history:#?}");
    let last = history[2]["id"].as_str().expect("id").to_owned();

    // Now: no event, the cursor is the last one listed.
    let now = feed(&app, &kiosk, "start=now").await;
    assert_eq!(now["events"], json!([]), "{now:#?}");
    assert_eq!(now["next_after"], json!(last));

    // An instant: the events created at or after it (the last two credits'
    // instant: the last one only; before every event: all of them).
    let instant = history[2]["created_at"].as_str().expect("created_at");
    let from_instant = feed(
        &app,
        &kiosk,
        &format!("start={}", instant.replace('+', "%2B")),
    )
    .await;
    let ids: Vec<&str> = from_instant["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| event["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, vec![last.as_str()], "{from_instant:#?}");
    let everything = feed(&app, &kiosk, "start=2000-01-01T00:00:00Z").await;
    assert_eq!(everything["events"].as_array().expect("events").len(), 3);

    // A watcher from now: waits, then gets the next event only.
    let waiter = {
        let app = Arc::clone(&app);
        let kiosk = kiosk.clone();
        tokio::spawn(async move { feed(&app, &kiosk, "start=now&wait_seconds=20").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "start=now answered with history");
    app.credit(ours, 5).await;
    let page = waiter.await.expect("task");
    let events = page["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{page:#?}");
    assert_eq!(events[0]["type"], "credit.created");
    assert_eq!(events[0]["data"]["credit"]["amount"], 5);

    // Another account's history is not this kiosk's "now".
    let theirs = app.funded_account(3).await;
    let again = feed(&app, &kiosk, "start=now").await;
    assert_eq!(again["next_after"], page["next_after"], "{theirs}");

    for query in [
        "start=yesterday",
        "start=2026-13-01T00:00:00Z",
        &format!("start=now&after={last}"),
    ] {
        let response = app.get(&format!("/v1/events?{query}"), &kiosk).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
    }
}

/// A receiver that fails twice and then succeeds gets the same
/// `webhook-id` three times, each signature verified by the independent
/// library; the delivery log shows the three attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_keep_the_webhook_id_and_every_signature_verifies() {
    let app = TestApp::spawn_with(|config| {
        config.webhook_retry_schedule = "0,0.2,0.2,0.2".into();
    })
    .await;
    let receiver = Receiver::start();
    let account = app.create_account(0).await;
    let endpoint = create_endpoint(
        &app,
        &json!({"url": receiver.hook("flaky", "fail=2"), "events": ["credit.created"],
                "description": "finance top-ups"}),
    )
    .await;
    let secret = endpoint["secret"].as_str().expect("secret");
    assert!(secret.starts_with("whsec_"));
    receiver.verify_with(&[secret]).await;
    let endpoint_id = endpoint["endpoint_id"].as_str().expect("id");
    // The secret is never shown again.
    let read: Value = app
        .get(&format!("/v1/webhook-endpoints/{endpoint_id}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(read.get("secret").is_none());
    assert!(!read.to_string().contains(secret));

    app.credit(account, 7).await;
    let event = feed_until(&app, ADMIN_KEY, "type=credit.created", 1).await[0].clone();
    let received = receiver
        .wait_for("three attempts", Duration::from_secs(20), |received| {
            received.len() >= 3
        })
        .await;
    assert_eq!(received.len(), 3, "{received:#?}");
    let statuses: Vec<i64> = received
        .iter()
        .map(|r| r["status"].as_i64().expect("status"))
        .collect();
    assert_eq!(statuses, [500, 500, 200]);
    for delivery in &received {
        assert_eq!(delivery["webhook_id"], event["id"]);
        assert!(verified_with(delivery, secret), "{delivery:#}");
        assert_eq!(delivery["body"], event, "the body is the feed's event");
        assert_eq!(
            delivery["signatures"].as_array().expect("signatures").len(),
            1
        );
    }
    // The receiver has the third answer before the service has recorded
    // it (the attempt is written once the response is in): read the log
    // until the third attempt is there.
    let deadline = Instant::now() + Duration::from_secs(20);
    let log: Value = loop {
        let log: Value = app
            .get(
                &format!("/v1/webhook-endpoints/{endpoint_id}/deliveries"),
                ADMIN_KEY,
            )
            .await
            .json()
            .await
            .expect("json");
        if log["attempts"].as_array().is_some_and(|a| a.len() >= 3) || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let attempts = log["attempts"].as_array().expect("attempts");
    let summary: Vec<(i64, i64, &str)> = attempts
        .iter()
        .map(|attempt| {
            (
                attempt["attempt"].as_i64().expect("attempt"),
                attempt["status_code"].as_i64().expect("status"),
                attempt["outcome"].as_str().expect("outcome"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, 500, "retrying"),
            (2, 500, "retrying"),
            (3, 200, "delivered")
        ]
    );
    assert!(attempts
        .iter()
        .all(|attempt| attempt["event_id"] == event["id"]));
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("token_billing_webhook_deliveries_total{outcome=\"delivered\"} 1"));
    assert!(metrics.contains("token_billing_webhook_deliveries_total{outcome=\"retrying\"} 2"));
}

/// After a rotation both secrets sign (two signatures), each verifying with
/// the independent library; an event outside the endpoint's types or
/// account is not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_signs_with_both_secrets_and_filters_hold() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start();
    let account = app.create_account(0).await;
    let other = app.create_account(0).await;
    let endpoint = create_endpoint(
        &app,
        &json!({"url": receiver.hook("rotating", ""), "events": ["adjustment.created"],
                "account_id": account}),
    )
    .await;
    let endpoint_id = endpoint["endpoint_id"].as_str().expect("id");
    let old_secret = endpoint["secret"].as_str().expect("secret").to_owned();
    let rotated = app
        .post(
            &format!("/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
            ADMIN_KEY,
            &json!({}),
        )
        .await;
    assert_eq!(rotated.status(), StatusCode::OK);
    let rotated: Value = rotated.json().await.expect("json");
    let new_secret = rotated["secret"].as_str().expect("secret").to_owned();
    assert_ne!(new_secret, old_secret);
    assert!(rotated["previous_secret_expires_at"].is_string());
    receiver.verify_with(&[&old_secret, &new_secret]).await;

    app.credit(account, 10).await; // not subscribed: credit.created
    app.credit(other, 10).await;
    for target in [other, account] {
        let response = app
            .post(
                &format!("/v1/accounts/{target}/adjustments"),
                ADMIN_KEY,
                &json!({"amount": -3, "reason": "test", "external_ref": Uuid::new_v4().to_string()}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    // Once the relay has fanned out every event, exactly one delivery exists.
    let deliveries = crate::helpers::eventually(
        "the relay past every event",
        Duration::from_secs(10),
        || {
            use diesel::prelude::*;
            #[derive(QueryableByName)]
            struct Counts {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                behind: i64,
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                deliveries: i64,
            }
            let counts: Counts = diesel::sql_query(
                "SELECT (SELECT count(*) FROM events e, webhook_relay r \
                     WHERE (e.txid, e.seq) > (r.after_txid, r.after_seq)) AS behind, \
                    (SELECT count(*) FROM webhook_deliveries) AS deliveries",
            )
            .get_result(&mut app.conn())
            .ok()?;
            (counts.behind == 0).then_some(counts.deliveries)
        },
    )
    .await;
    assert_eq!(deliveries, 1);
    let received = receiver
        .wait_for("one delivery", Duration::from_secs(10), |received| {
            !received.is_empty()
        })
        .await;
    assert_eq!(received.len(), 1, "{received:#?}");
    let delivery = &received[0];
    assert_eq!(delivery["body"]["type"], "adjustment.created");
    assert_eq!(delivery["body"]["data"]["account_id"], json!(account));
    assert_eq!(
        delivery["signatures"].as_array().expect("signatures").len(),
        2
    );
    assert!(verified_with(delivery, &old_secret), "{delivery:#}");
    assert!(verified_with(delivery, &new_secret), "{delivery:#}");
}

/// 410 disables the endpoint at once and records endpoint.disabled; the
/// pending delivery resumes when an admin enables the endpoint again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_disables_the_endpoint_and_enabling_resumes() {
    let app = TestApp::spawn_with(|config| {
        config.webhook_retry_schedule = "0,0.2,0.2".into();
    })
    .await;
    let receiver = Receiver::start();
    let account = app.create_account(0).await;
    let endpoint = create_endpoint(
        &app,
        &json!({"url": receiver.hook("gone", "fail=1&status=410"), "events": ["credit.created"]}),
    )
    .await;
    let endpoint_id = endpoint["endpoint_id"].as_str().expect("id").to_owned();
    receiver
        .verify_with(&[endpoint["secret"].as_str().expect("secret")])
        .await;
    app.credit(account, 3).await;
    receiver
        .wait_for("the 410", Duration::from_secs(10), |received| {
            !received.is_empty()
        })
        .await;
    let disabled =
        crate::helpers::eventually("the endpoint disabled", Duration::from_secs(10), || {
            let mut conn = app.conn();
            use diesel::prelude::*;
            diesel::sql_query(
                "SELECT 1 FROM webhook_endpoints WHERE NOT enabled AND disabled_reason = 'gone'",
            )
            .execute(&mut conn)
            .ok()
            .filter(|rows| *rows == 1)
        })
        .await;
    assert_eq!(disabled, 1);
    let view: Value = app
        .get(&format!("/v1/webhook-endpoints/{endpoint_id}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(view["enabled"], false);
    assert_eq!(view["disabled_reason"], "gone");
    let events = feed_until(&app, ADMIN_KEY, "type=endpoint.disabled", 1).await;
    assert_eq!(events[0]["data"]["endpoint_id"], json!(endpoint_id));
    assert_eq!(events[0]["data"]["reason"], "gone");

    let enabled = app
        .patch(
            &format!("/v1/webhook-endpoints/{endpoint_id}"),
            ADMIN_KEY,
            &json!({"enabled": true}),
        )
        .await;
    assert_eq!(enabled.status(), StatusCode::OK);
    let received = receiver
        .wait_for("the redelivery", Duration::from_secs(10), |received| {
            received.len() >= 2
        })
        .await;
    assert_eq!(received[1]["status"], 200);
    assert_eq!(received[0]["webhook_id"], received[1]["webhook_id"]);
    // A manual redelivery sends it once more.
    let event_id = received[0]["webhook_id"].as_str().expect("id");
    let redelivered = app
        .post(
            &format!("/v1/webhook-endpoints/{endpoint_id}/events/{event_id}/redeliver"),
            ADMIN_KEY,
            &json!({}),
        )
        .await;
    assert_eq!(redelivered.status(), StatusCode::ACCEPTED);
    receiver
        .wait_for(
            "the manual redelivery",
            Duration::from_secs(10),
            |received| received.len() >= 3,
        )
        .await;
    let deleted = app
        .client
        .delete(app.url(&format!("/v1/webhook-endpoints/{endpoint_id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = app
        .get(&format!("/v1/webhook-endpoints/{endpoint_id}"), ADMIN_KEY)
        .await;
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
}

/// By default an endpoint on a loopback, private or metadata address is
/// refused with a clear 400 and nothing is created; kiosk and finance keys
/// may not manage endpoints.
#[tokio::test]
async fn private_addresses_and_non_admins_are_refused() {
    let app = TestApp::spawn_with(|config| config.webhook_allow_private_urls = false).await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://10.0.0.1/hook",
        "http://localhost/hook",
    ] {
        let response = app
            .post(
                "/v1/webhook-endpoints",
                ADMIN_KEY,
                &json!({"url": url, "events": ["credit.created"]}),
            )
            .await;
        let (status, body) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}");
        assert!(
            body["detail"]
                .as_str()
                .expect("detail")
                .contains("non-public"),
            "{body}"
        );
    }
    for body in [
        json!({"url": "https://example.com/x", "events": []}),
        json!({"url": "https://example.com/x", "events": ["credit.nope"]}),
        json!({"url": "ftp://example.com/x", "events": ["credit.created"]}),
        json!({"url": "https://example.com/x", "events": ["credit.created"], "extra": 1}),
    ] {
        let response = app.post("/v1/webhook-endpoints", ADMIN_KEY, &body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    let list: Value = app
        .get("/v1/webhook-endpoints", ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(list["endpoints"].as_array().expect("endpoints").is_empty());
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;
    for key in [&kiosk, &finance] {
        let response = app.get("/v1/webhook-endpoints", key).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
    }
}

/// One attempt written straight into the log; its `attempt_id`.
fn logged_attempt(
    conn: &mut diesel::PgConnection,
    endpoint: Uuid,
    delivery: Uuid,
    event: Uuid,
) -> i64 {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let id: Id = diesel::sql_query(
        "INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, attempted_at, \
           status_code, latency_ms, outcome) \
         VALUES ($1, $2, $3, 1, now(), 200, 3.0, 'delivered') RETURNING id",
    )
    .bind::<diesel::sql_types::Uuid, _>(delivery)
    .bind::<diesel::sql_types::Uuid, _>(endpoint)
    .bind::<diesel::sql_types::Uuid, _>(event)
    .get_result(conn)
    .expect("attempt");
    id.id
}

/// A finished delivery of a new event to the endpoint, created `days_ago`.
fn finished_delivery(
    conn: &mut diesel::PgConnection,
    endpoint: Uuid,
    days_ago: i64,
) -> (Uuid, Uuid) {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Ids {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        delivery: Uuid,
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        event: Uuid,
    }
    let ids: Ids = diesel::sql_query(
        "WITH event AS (INSERT INTO events (type, data) VALUES ('credit.created', '{}') RETURNING id) \
         INSERT INTO webhook_deliveries (endpoint_id, event_id, status, attempts, created_at, delivered_at) \
         SELECT $1, id, 'delivered', 1, now() - make_interval(days => $2), now() FROM event \
         RETURNING id AS delivery, event_id AS event",
    )
    .bind::<diesel::sql_types::Uuid, _>(endpoint)
    .bind::<diesel::sql_types::Integer, _>(i32::try_from(days_ago).expect("days"))
    .get_result(conn)
    .expect("delivery");
    (ids.delivery, ids.event)
}

/// A retention pass of the webhook deliveries alone (30 days), as the
/// service runs it; waits out a pass the replica's schedule may be running.
fn prune_deliveries(conn: &mut diesel::PgConnection, archive: &std::path::Path) -> Value {
    use token_billing::domain::retention::{run_pass_exclusive, RetentionSettings};
    let settings = RetentionSettings {
        idempotency_keys: None,
        events: None,
        webhook_attempts: Some(Duration::from_secs(30 * 86_400)),
        audit_events: None,
        archive_dir: Some(archive.to_path_buf()),
        batch: 5_000,
        batches_max: usize::MAX,
        pause: Duration::ZERO,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(report) = run_pass_exclusive(conn, &settings, None).expect("pass") {
            return serde_json::to_value(report).expect("json");
        }
        assert!(Instant::now() < deadline, "the retention lock stays taken");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `attempt_id`s of one page of the endpoint's log (200 expected).
async fn log_page(app: &TestApp, endpoint: Uuid, query: &str) -> (Vec<i64>, Value) {
    let response = app
        .get(
            &format!("/v1/webhook-endpoints/{endpoint}/deliveries?{query}"),
            ADMIN_KEY,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{query}");
    let page: Value = response.json().await.expect("json");
    let ids = page["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|attempt| attempt["attempt_id"].as_i64().expect("id"))
        .collect();
    (ids, page["next_after"].clone())
}

/// Retention deletes an old delivery with all of its attempts, also those
/// with ids above a reader's cursor (a redelivered old delivery): that
/// cursor is refused with a problem that says what happened, never
/// answered with a page that skips them. Tracked per endpoint: endpoint
/// B's reader, whose cursor is below A's deleted ids, reads on.
#[tokio::test]
async fn a_delivery_log_cursor_overtaken_by_retention_is_refused_for_its_endpoint_only() {
    // No sender and no relay here: the log holds only what the test writes.
    let app = TestApp::spawn_with(|config| config.webhook_concurrency = 0).await;
    let archive = std::env::temp_dir().join(format!("tb-attempts-{}", Uuid::new_v4()));
    let mut endpoints = Vec::new();
    for url in ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"] {
        let created =
            create_endpoint(&app, &json!({"url": url, "events": ["credit.created"]})).await;
        endpoints
            .push(Uuid::parse_str(created["endpoint_id"].as_str().expect("id")).expect("uuid"));
    }
    let (a, b) = (endpoints[0], endpoints[1]);
    let mut conn = app.conn();
    let (a_old, a_old_event) = finished_delivery(&mut conn, a, 40);
    let (a_new, a_new_event) = finished_delivery(&mut conn, a, 0);
    let (b_new, b_new_event) = finished_delivery(&mut conn, b, 0);
    // Interleaved ids: the old delivery of A was redelivered lately.
    let b1 = logged_attempt(&mut conn, b, b_new, b_new_event);
    let a1 = logged_attempt(&mut conn, a, a_new, a_new_event);
    let a2 = logged_attempt(&mut conn, a, a_old, a_old_event);
    let a3 = logged_attempt(&mut conn, a, a_new, a_new_event);
    let a4 = logged_attempt(&mut conn, a, a_old, a_old_event);
    let b2 = logged_attempt(&mut conn, b, b_new, b_new_event);

    // A reader of A is at a1; before retention it reads on from there.
    let (page, next) = log_page(&app, a, "limit=1").await;
    assert_eq!((page, next), (vec![a1], json!(a1)));
    assert_eq!(
        log_page(&app, a, &format!("after={a1}")).await.0,
        [a2, a3, a4]
    );

    let report = prune_deliveries(&mut conn, &archive);
    assert_eq!(report["pruned"]["webhook_deliveries"], 1, "{report}");
    assert_eq!(report["pruned"]["webhook_attempts"], 2, "{report}");

    // a2 and a4 are gone: continuing from a1 (or a3) would skip them.
    for after in [a1, a3] {
        let (status, body) = problem(
            app.get(
                &format!("/v1/webhook-endpoints/{a}/deliveries?after={after}"),
                ADMIN_KEY,
            )
            .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "after={after}: {body}");
        assert_eq!(body["code"], "invalid_request", "{body}");
        let detail = body["detail"].as_str().expect("detail");
        for needed in [
            "retention",
            "RETENTION_WEBHOOK_ATTEMPTS",
            "ARCHIVE_DIR",
            "without after",
            &format!("up to attempt_id {a4}"),
        ] {
            assert!(detail.contains(needed), "{needed:?} in {detail}");
        }
    }
    // Past the newest deleted attempt nothing was skipped; without after
    // the log starts at the oldest attempt kept.
    assert_eq!(
        log_page(&app, a, &format!("after={a4}")).await.0,
        Vec::<i64>::new()
    );
    assert_eq!(log_page(&app, a, "").await.0, [a1, a3]);
    // 0 is no attempt's id: it starts at the oldest attempt kept too.
    assert_eq!(log_page(&app, a, "after=0").await.0, [a1, a3]);
    // B lost nothing: its cursor below A's deleted ids is still good.
    assert_eq!(log_page(&app, b, &format!("after={b1}")).await.0, [b2]);
    assert_eq!(log_page(&app, b, "").await.0, [b1, b2]);
    // The deleted attempts are in the archive, as the error says.
    let mut archived = Vec::new();
    for file in std::fs::read_dir(archive.join("webhook_attempts")).expect("archive") {
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(
                std::fs::File::open(file.expect("file").path()).expect("open"),
            ),
            &mut text,
        )
        .expect("gzip");
        for line in text.lines() {
            let row: Value = serde_json::from_str(line).expect("json");
            archived.push(row["id"].as_i64().expect("id"));
        }
    }
    archived.sort_unstable();
    assert_eq!(archived, [a2, a4]);

    // A later pass deleting older ids never lowers the mark.
    use diesel::connection::SimpleConnection;
    conn.batch_execute(&format!(
        "UPDATE webhook_deliveries SET created_at = now() - interval '40 days' WHERE id = '{a_new}'"
    ))
    .expect("age");
    let report = prune_deliveries(&mut conn, &archive);
    assert_eq!(report["pruned"]["webhook_attempts"], 2, "{report}");
    assert_eq!(log_page(&app, a, "").await.0, Vec::<i64>::new());
    assert_eq!(
        log_page(&app, a, &format!("after={a4}")).await.0,
        Vec::<i64>::new()
    );
    let (status, _) = problem(
        app.get(
            &format!("/v1/webhook-endpoints/{a}/deliveries?after={a3}"),
            ADMIN_KEY,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(log_page(&app, b, &format!("after={b1}")).await.0, [b2]);
    let _ = std::fs::remove_dir_all(&archive);
}
