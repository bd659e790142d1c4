//! Grants that expire: the expiry a credit takes, the lapse on access and
//! by the reaper, returns to a lapsed grant, the notices, the report, and
//! 40 kiosks spending on one account while its grants lapse.
//!
//! To make a grant lapse now, a test moves its `expires_at` to now (`age`):
//! the engine decides by `expires_at` against the clock, so this is the
//! same as waiting, without the wait. The concurrency test lets real
//! time pass instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Uuid as SqlUuid};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::checks::{find_violations, grants_disagreeing_with_ledger};
use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{problem, TestApp, ADMIN_KEY};

const SETTINGS: ReaperSettings = ReaperSettings {
    batch: 500,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 72,
};

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

async fn post(app: &TestApp, path: &str, key: &str, body: &Value) -> (StatusCode, Value) {
    let response = app.post(path, key, body).await;
    let status = response.status();
    (status, response.json().await.expect("json"))
}

async fn credit(app: &TestApp, account: Uuid, body: Value) -> Value {
    let (status, credited) = post(
        app,
        &format!("/v1/accounts/{account}/credits"),
        ADMIN_KEY,
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{credited}");
    credited
}

/// A credit of `body`, and the grant it made.
async fn granted(app: &TestApp, account: Uuid, body: Value) -> Uuid {
    uuid(&credit(app, account, body).await["grant_id"])
}

fn uuid(value: &Value) -> Uuid {
    value.as_str().expect("a uuid").parse().expect("uuid")
}

/// The grant's expiry moves to this instant: it has lapsed now, after
/// every entry written so far (as if it had been made to lapse now).
fn age(app: &TestApp, grant: Uuid) {
    diesel::sql_query("UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = $1")
        .bind::<SqlUuid, _>(grant)
        .execute(&mut app.conn())
        .expect("aged");
}

/// Ledger entries: kind, amount, grant, whether it names a reservation.
type Entry = (String, i64, Option<Uuid>, bool);

fn entries(app: &TestApp, account: Uuid) -> Vec<Entry> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        kind: String,
        #[diesel(sql_type = BigInt)]
        amount: i64,
        #[diesel(sql_type = Nullable<SqlUuid>)]
        grant_id: Option<Uuid>,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        of_reservation: bool,
    }
    diesel::sql_query(
        "SELECT kind, amount, grant_id, reservation_id IS NOT NULL AS of_reservation \
         FROM ledger_entries WHERE account_id = $1 ORDER BY id",
    )
    .bind::<SqlUuid, _>(account)
    .load::<Row>(&mut app.conn())
    .expect("entries")
    .into_iter()
    .map(|row| (row.kind, row.amount, row.grant_id, row.of_reservation))
    .collect()
}

/// The account's events of `kind`, in order, as the table holds them.
fn events(app: &TestApp, account: Uuid, kind: &str) -> Vec<Value> {
    crate::helpers::events_of(&mut app.conn(), account, kind)
}

async fn grants(app: &TestApp, account: Uuid, query: &str) -> Vec<Value> {
    let response = app
        .get(&format!("/v1/accounts/{account}/grants{query}"), ADMIN_KEY)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let page: Value = response.json().await.expect("json");
    page["grants"].as_array().expect("grants").clone()
}

fn grant_of(list: &[Value], grant: Uuid) -> Value {
    list.iter()
        .find(|shown| uuid(&shown["grant_id"]) == grant)
        .cloned()
        .unwrap_or_else(|| panic!("grant {grant} in {list:#?}"))
}

fn assert_books_clean(app: &TestApp) {
    let mut conn = app.conn();
    let violations = find_violations(&mut conn).expect("checks");
    assert!(violations.is_empty(), "{violations:#?}");
    let grants = grants_disagreeing_with_ledger(&mut conn).expect("grant check");
    assert!(grants.is_empty(), "{grants:#?}");
}

/// The `grant_expired` series of token_billing_tokens_total.
async fn grant_expired_metric(app: &TestApp) -> i64 {
    let text = app.metrics_text().await;
    text.lines()
        .find(|line| line.starts_with("token_billing_tokens_total{movement=\"grant_expired\"}"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no grant_expired series in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_is_checked_and_compared_on_replay() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let path = format!("/v1/accounts/{account}/credits");
    let before = app.snapshot(account);
    let now = Utc::now();
    for expires_at in [
        json!(rfc3339(now - chrono::Duration::seconds(5))),
        json!(rfc3339(now + chrono::Duration::days(3660))),
        json!("next tuesday"),
        json!("2030-01-1"),
        json!(1_900_000_000),
    ] {
        let body = json!({"amount": 1, "external_ref": "bad-expiry", "expires_at": expires_at});
        let (status, problem) = problem(app.post(&path, ADMIN_KEY, &body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem["code"], "invalid_request", "{problem}");
    }
    assert_eq!(
        app.snapshot(account),
        before,
        "a refused credit changed nothing"
    );
    // A retry of a credit that landed is its replay, even once its expiry
    // has passed: the engine checks the expiry after the replay.
    let soon = Utc::now() + chrono::Duration::milliseconds(1500);
    let landed = json!({"amount": 3, "external_ref": "landed", "expires_at": rfc3339(soon)});
    let first = credit(&app, account, landed.clone()).await;
    while Utc::now() <= soon {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, again) = post(&app, &path, ADMIN_KEY, &landed).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    let before = app.snapshot(account);
    let late = json!({"amount": 3, "external_ref": "late", "expires_at": rfc3339(soon)});
    let (status, refused) = problem(app.post(&path, ADMIN_KEY, &late).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .expect("detail")
            .contains("in the future"),
        "{refused}"
    );
    assert_eq!(
        app.snapshot(account),
        before,
        "a lapsed expiry credits nothing"
    );
    // Nanoseconds are cut to what PostgreSQL stores: the answer and a
    // replay compare the stored instant.
    let expires_at = now + chrono::Duration::days(30);
    let sent = expires_at.to_rfc3339_opts(SecondsFormat::Nanos, true);
    let body = json!({"amount": 4, "external_ref": "event-7", "expires_at": sent, "priority": 20});
    let credited = credit(&app, account, body.clone()).await;
    assert_eq!(credited["expires_at"], json!(rfc3339(expires_at)));
    assert_eq!(credited["priority"], 20);
    let (status, replayed) = post(&app, &path, ADMIN_KEY, &body).await;
    assert_eq!(status, StatusCode::OK, "the same credit again is a replay");
    assert_eq!(replayed, credited);
    let other = json!({"amount": 4, "external_ref": "event-7", "priority": 20,
                       "expires_at": rfc3339(expires_at + chrono::Duration::seconds(1))});
    let (status, refused) = post(&app, &path, ADMIN_KEY, &other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let never = json!({"amount": 4, "external_ref": "event-7", "priority": 20});
    let (status, _) = post(&app, &path, ADMIN_KEY, &never).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "no expiry is another body"
    );
    // A removal makes no grant: it takes no expiry.
    let (status, problem) = problem(
        app.post(
            &format!("/v1/accounts/{account}/adjustments"),
            ADMIN_KEY,
            &json!({"amount": -1, "reason": "fix", "external_ref": "r1",
                    "expires_at": rfc3339(expires_at)}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    // A positive adjustment's grant may expire.
    let (status, adjusted) = post(
        &app,
        &format!("/v1/accounts/{account}/adjustments"),
        ADMIN_KEY,
        &json!({"amount": 2, "reason": "goodwill", "external_ref": "a1",
                "expires_at": rfc3339(expires_at)}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{adjusted}");
    assert_eq!(adjusted["expires_at"], json!(rfc3339(expires_at)));
    assert_eq!(app.account(account).await["available"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_grant_is_never_drawn_and_returns_to_it_expire_at_once() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let soon = rfc3339(Utc::now() + chrono::Duration::days(2));
    let later = rfc3339(Utc::now() + chrono::Duration::days(20));
    // Same priority: the one that expires soonest is drawn first, and a
    // grant that never expires last.
    let never = granted(&app, account, json!({"amount": 5, "external_ref": "never"})).await;
    let event = granted(
        &app,
        account,
        json!({"amount": 10, "external_ref": "event", "expires_at": soon}),
    )
    .await;
    let promo = granted(
        &app,
        account,
        json!({"amount": 4, "external_ref": "promo", "expires_at": later}),
    )
    .await;
    let response = app.reserve(account, &kiosk, Uuid::new_v4(), 12).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let held: Value = response.json().await.expect("json");
    assert_eq!(
        held["draws"],
        json!([{"grant_id": event, "amount": 10}, {"grant_id": promo, "amount": 2}]),
        "the soonest expiry first"
    );
    // The event grant lapses while the reservation holds all of its tokens.
    age(&app, event);
    // A spend on the account writes the lapse first: nothing is left in
    // the event grant to leave, and the reservation draws from the others.
    let response = app.reserve(account, &kiosk, Uuid::new_v4(), 3).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let second: Value = response.json().await.expect("json");
    assert_eq!(
        second["draws"],
        json!([{"grant_id": promo, "amount": 2}, {"grant_id": never, "amount": 1}])
    );
    // Its lapse moved nothing (all of it is reserved): the status says
    // expired, and the reaper writes expired_at.
    let shown = grant_of(&grants(&app, account, "").await, event);
    assert_eq!(shown["status"], "expired");
    assert!(shown["expired_at"].is_null(), "{shown}");
    assert_eq!(
        (shown["remaining"].clone(), shown["reserved"].clone()),
        (json!(0), json!(10))
    );
    // The first reservation commits 4: the commit consumes its draws in
    // draw order (4 of the event grant); the rest going back to the lapsed
    // event grant (6) expires at once, the rest of the promo's (2) goes back.
    let held_id = held["reservation_id"].as_str().expect("id");
    let (status, committed) = post(
        &app,
        &format!("/v1/accounts/{account}/reservations/{held_id}/commit"),
        &kiosk,
        &json!({"amount": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{committed}");
    let tail: Vec<Entry> = entries(&app, account)
        .into_iter()
        .rev()
        .take(3)
        .rev()
        .collect();
    assert_eq!(
        tail,
        vec![
            ("commit".into(), 4, Some(event), true),
            ("grant_expire".into(), 6, Some(event), true),
            ("release".into(), 2, Some(promo), true),
        ]
    );
    let account_now = app.account(account).await;
    assert_eq!(
        (
            account_now["available"].clone(),
            account_now["reserved"].clone(),
            account_now["used"].clone(),
            account_now["grant_expired"].clone()
        ),
        (json!(6), json!(3), json!(4), json!(6)),
        "19 credited = 6 available + 3 reserved + 4 used + 6 expired"
    );
    // Now the promo lapses holding tokens: a removal lapses it first, then
    // takes what it asks of what is left.
    age(&app, promo);
    let (status, removed) = post(
        &app,
        &format!("/v1/accounts/{account}/adjustments"),
        ADMIN_KEY,
        &json!({"amount": -1, "reason": "correction", "external_ref": "fix-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{removed}");
    let tail: Vec<Entry> = entries(&app, account)
        .into_iter()
        .rev()
        .take(2)
        .rev()
        .collect();
    assert_eq!(
        tail,
        vec![
            ("grant_expire".into(), 2, Some(promo), false),
            ("adjustment".into(), -1, Some(never), false),
        ]
    );
    let expired = events(&app, account, "grant.expired");
    let amounts: Vec<(Value, Value)> = expired
        .iter()
        .map(|data| (data["grant_id"].clone(), data["amount"].clone()))
        .collect();
    assert_eq!(
        amounts,
        vec![(json!(event), json!(6)), (json!(promo), json!(2))]
    );
    assert_eq!(
        grant_expired_metric(&app).await,
        8,
        "counted by the replica that expired them"
    );
    // The second reservation still holds 2 of the lapsed promo grant: a
    // release sends them back, and they expire at once.
    let second_id = second["reservation_id"].as_str().expect("id");
    let (status, _) = post(
        &app,
        &format!("/v1/accounts/{account}/reservations/{second_id}/release"),
        &kiosk,
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let account_now = app.account(account).await;
    assert_eq!(
        (
            account_now["available"].clone(),
            account_now["grant_expired"].clone()
        ),
        (json!(4), json!(10))
    );
    let listed = grants(&app, account, "?status=expired").await;
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_eq!(grants(&app, account, "?status=active").await.len(), 1);
    assert_books_clean(&app);
    app.assert_invariants(account);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_lapses_grants_notices_them_once_and_the_report_balances() {
    let app = TestApp::spawn().await;
    let from = Utc::now();
    let account = app.create_account(0).await;
    let soon = granted(&app, account, json!({"amount": 6, "external_ref": "soon",
                                       "expires_at": rfc3339(Utc::now() + chrono::Duration::hours(1))})).await;
    let far = granted(&app, account, json!({"amount": 4, "external_ref": "far",
                                       "expires_at": rfc3339(Utc::now() + chrono::Duration::days(30))})).await;
    let report = run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
    assert_eq!((report.grants_noticed, report.grants_expired), (1, 0));
    let report = run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
    assert_eq!(report.grants_noticed, 0, "once per grant");
    let noticed = events(&app, account, "grant.expiring");
    assert_eq!(noticed.len(), 1);
    assert_eq!(noticed[0]["grant_id"], json!(soon));
    assert_eq!(noticed[0]["amount"], 6);
    age(&app, soon);
    let report = run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
    assert_eq!((report.grants_expired, report.grant_tokens_expired), (1, 6));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    let report = run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
    assert_eq!(report.grants_expired, 0, "a lapse is written once");
    assert_eq!(
        entries(&app, account).last().cloned(),
        Some(("grant_expire".into(), 6, Some(soon), false))
    );
    let expired = events(&app, account, "grant.expired");
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (
            expired[0]["amount"].clone(),
            expired[0]["grant"]["status"].clone()
        ),
        (json!(6), json!("expired"))
    );
    assert_eq!(app.account(account).await["available"], 4);
    assert_eq!(
        grant_of(&grants(&app, account, "").await, far)["status"],
        "active"
    );
    // The report: 10 credited, 6 expired, 4 left.
    let to = Utc::now() + chrono::Duration::seconds(1);
    let response = app
        .get(
            &format!(
                "/v1/reconciliation?from={}&to={}&account_id={account}",
                rfc3339(from),
                rfc3339(to)
            ),
            ADMIN_KEY,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = response.json().await.expect("json");
    assert_eq!(report["status"], "ok", "{report:#}");
    let line = &report["accounts"][0];
    assert_eq!(
        (
            line["opening"].clone(),
            line["credited"].clone(),
            line["committed"].clone(),
            line["grant_expired"].clone(),
            line["closing"].clone()
        ),
        (json!(0), json!(10), json!(0), json!(6), json!(4))
    );
    assert_eq!(report["totals"]["grant_expired"], 6);
    let csv = reqwest::Client::new()
        .get(app.url(&format!(
            "/v1/reconciliation?from={}&to={}&account_id={account}",
            rfc3339(from),
            rfc3339(to)
        )))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("row").split(',').collect();
    let column = header
        .iter()
        .position(|name| *name == "grant_expired")
        .expect("column");
    assert_eq!(row[column], "6", "{csv}");
    assert_books_clean(&app);
}

/// The notice step by itself (`engine_notice_expiring_grants`): a grant
/// that has lapsed but whose lapse is not written yet gets no
/// grant.expiring, only the grant that will lapse does. (In a reaper pass
/// the lapses are written first, so the pass alone cannot tell.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_grant_whose_lapse_is_not_written_gets_no_expiring_notice() {
    #[derive(QueryableByName)]
    struct Noticed {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        noticed: i32,
    }
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let in_an_hour = rfc3339(Utc::now() + chrono::Duration::hours(1));
    let soon = granted(
        &app,
        account,
        json!({"amount": 6, "external_ref": "soon",
                                            "expires_at": in_an_hour}),
    )
    .await;
    let gone = granted(
        &app,
        account,
        json!({"amount": 4, "external_ref": "gone",
                                            "expires_at": in_an_hour}),
    )
    .await;
    age(&app, gone);
    let noticed = diesel::sql_query("SELECT engine_notice_expiring_grants(72, 100) AS noticed")
        .get_result::<Noticed>(&mut app.conn())
        .expect("notice step")
        .noticed;
    assert_eq!(noticed, 1, "only the grant still to lapse");
    let notices = events(&app, account, "grant.expiring");
    let named: Vec<Value> = notices.iter().map(|n| n["grant_id"].clone()).collect();
    assert_eq!(named, [json!(soon)], "{notices:#?}");
}

/// 40 kiosks reserve and settle on one account while two of its three
/// grants lapse under them (real time, not `age`), with the reaper running
/// beside them. No token is drawn from a lapsed grant, every grant's books
/// follow from the ledger, and every token is accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_kiosks_spend_while_grants_lapse_and_nothing_is_drawn_from_a_lapsed_one() {
    const KIOSKS: usize = 40;
    let app = Arc::new(TestApp::spawn().await);
    let account = app.create_account(0).await;
    let started = Utc::now();
    let first = granted(
        &app,
        account,
        json!({"amount": 5000, "external_ref": "first",
            "expires_at": rfc3339(started + chrono::Duration::milliseconds(1500))}),
    )
    .await;
    let second = granted(
        &app,
        account,
        json!({"amount": 5000, "external_ref": "second",
            "expires_at": rfc3339(started + chrono::Duration::milliseconds(3000))}),
    )
    .await;
    let kept = granted(
        &app,
        account,
        json!({"amount": 100_000, "external_ref": "kept"}),
    )
    .await;
    let keys: Vec<String> = {
        let mut keys = Vec::new();
        for _ in 0..KIOSKS {
            keys.push(app.kiosk_key(account).await);
        }
        keys
    };
    let deadline = Instant::now() + Duration::from_millis(4500);
    let mut tasks = Vec::new();
    for (kiosk, key) in keys.into_iter().enumerate() {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            let mut created = 0_u32;
            let mut round = 0_u64;
            while Instant::now() < deadline {
                round += 1;
                let response = app.reserve(account, &key, Uuid::new_v4(), 3).await;
                if response.status() != StatusCode::CREATED {
                    continue;
                }
                created += 1;
                let held: Value = response.json().await.expect("json");
                let id = held["reservation_id"].as_str().expect("id").to_owned();
                // Commit some, release others, commit part of some.
                let (path, body) = match (kiosk as u64 + round) % 3 {
                    0 => ("commit", json!({})),
                    1 => ("commit", json!({"amount": 1})),
                    _ => ("release", json!({})),
                };
                let response = app
                    .post(
                        &format!("/v1/accounts/{account}/reservations/{id}/{path}"),
                        &key,
                        &body,
                    )
                    .await;
                assert_eq!(response.status(), StatusCode::OK, "{path}");
            }
            created
        }));
    }
    let reaper = {
        let app = Arc::clone(&app);
        tokio::task::spawn_blocking(move || {
            let mut passes = 0;
            while Instant::now() < deadline {
                run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
                passes += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            passes
        })
    };
    let mut created = 0;
    for task in tasks {
        created += task.await.expect("kiosk");
    }
    assert!(reaper.await.expect("reaper") > 0);
    assert!(created > 0);
    // Both lapses were written (by a spend or by the reaper), and after
    // them no reserve drew either grant.
    run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");
    let listed = grants(&app, account, "").await;
    for grant in [first, second] {
        let shown = grant_of(&listed, grant);
        assert_eq!(shown["status"], "expired", "{shown}");
        assert!(shown["expired_at"].is_string(), "{shown}");
        assert_eq!(shown["remaining"], 0, "{shown}");
        assert_eq!(shown["reserved"], 0, "every reservation settled: {shown}");
    }
    assert_eq!(grant_of(&listed, kept)["status"], "active");
    let late: i64 = {
        #[derive(QueryableByName)]
        struct Late {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        diesel::sql_query(
            "SELECT count(*) AS n FROM ledger_entries e JOIN credit_grants g ON g.id = e.grant_id \
             WHERE e.kind = 'reserve' AND e.created_at >= g.expires_at",
        )
        .get_result::<Late>(&mut app.conn())
        .expect("late")
        .n
    };
    assert_eq!(late, 0, "a reserve drew a lapsed grant");
    let lapses: Vec<Entry> = entries(&app, account)
        .into_iter()
        .filter(|entry| entry.0 == "grant_expire")
        .collect();
    assert!(
        lapses.iter().any(|entry| entry.2 == Some(first))
            && lapses.iter().any(|entry| entry.2 == Some(second)),
        "both grants lapsed holding tokens: {lapses:?}"
    );
    let account_now = app.account(account).await;
    let expired: i64 = lapses.iter().map(|entry| entry.1).sum();
    assert_eq!(account_now["grant_expired"], expired);
    assert_eq!(account_now["reserved"], 0);
    assert_books_clean(&app);
    app.assert_invariants(account);
}

/// The reservation's expiry as the API shows it.
async fn reservation_expiry(app: &TestApp, account: Uuid, reservation: &str) -> DateTime<Utc> {
    let response = app
        .get(
            &format!("/v1/accounts/{account}/reservations/{reservation}"),
            ADMIN_KEY,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let shown: Value = response.json().await.expect("json");
    instant(&shown["expires_at"])
}

fn instant(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .expect("an instant")
        .parse()
        .expect("RFC 3339")
}

/// Waits (polling the clock) until `at` has passed.
async fn until_passed(at: DateTime<Utc>) {
    while Utc::now() <= at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Grant expiry dominates extension (issue 35), the sequence in
/// real time: 10 tokens expiring in a moment at priority 0, all reserved
/// for 2 s; after the grant lapsed, three extensions by 2 s each are
/// capped (200, `Extension-Capped: grant-expiry`, the expiry unchanged),
/// so the reservation expires when it would have, the commit 3 s later is
/// refused, and the 10 tokens expired with their grant. (Before, each
/// extension moved the expiry on and the commit spent the lapsed grant's
/// tokens.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_never_keeps_a_lapsed_grants_tokens_alive() {
    let app = TestApp::spawn_with(|config| config.reaper_schedule = "0 0 0 1 1 *".into()).await;
    let account = app.funded_account(0).await;
    let expires_at = Utc::now() + chrono::Duration::milliseconds(1500);
    credit(
        &app,
        account,
        json!({"amount": 10, "external_ref": "promo-tonight", "priority": 0,
               "expires_at": rfc3339(expires_at)}),
    )
    .await;
    let base = format!("/v1/accounts/{account}/reservations");
    let (status, reserved) = post(
        &app,
        &base,
        ADMIN_KEY,
        &json!({"request_id": Uuid::new_v4(), "amount": 10, "ttl_seconds": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reserved}");
    let id = reserved["reservation_id"].as_str().expect("id").to_owned();
    let held_until = instant(&reserved["expires_at"]);
    assert!(held_until > expires_at, "the hold outlives the grant");

    until_passed(expires_at).await;
    for _ in 0..3 {
        let response = app
            .post(
                &format!("{base}/{id}/extend"),
                ADMIN_KEY,
                &json!({"ttl_seconds": 2}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response
                .headers()
                .get("extension-capped")
                .map(|v| v.to_str().expect("ascii")),
            Some("grant-expiry")
        );
        let extended: Value = response.json().await.expect("json");
        assert_eq!(instant(&extended["expires_at"]), held_until, "{extended}");
        assert_eq!(reservation_expiry(&app, account, &id).await, held_until);
    }

    until_passed(held_until).await;
    let (status, refused) = problem(
        app.post(
            &format!("{base}/{id}/commit"),
            ADMIN_KEY,
            &json!({"amount": 10}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::CONFLICT, Some("reservation_not_held")),
        "{refused}"
    );
    let shown = app.account(account).await;
    assert_eq!(
        (
            shown["used"].as_i64(),
            shown["grant_expired"].as_i64(),
            shown["available"].as_i64(),
            shown["reserved"].as_i64()
        ),
        (Some(0), Some(10), Some(0), Some(0)),
        "{shown}"
    );
    assert_books_clean(&app);
}

/// The same through a job's heartbeat: the heartbeat of a job whose
/// reservation drew from a grant that has lapsed keeps the job's lease
/// (`Done`) but does not move the reservation's expiry; the generation in
/// progress still finishes within it and is charged (docs/grants.md).
/// A grant that has not lapsed lets the heartbeat extend as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_heartbeat_never_carries_a_lapsed_grants_tokens_past_it() {
    use token_billing::domain::job_leases::{claim_jobs, finish_success, heartbeat, Fenced};

    let app = TestApp::spawn_with(|config| {
        config.worker_concurrency = 0;
        config.reaper_schedule = "0 0 0 1 1 *".into();
    })
    .await;
    let account = app.funded_account(0).await;
    let grant = granted(
        &app,
        account,
        json!({"amount": 20, "external_ref": "fair-credit",
               "expires_at": rfc3339(Utc::now() + chrono::Duration::days(1))}),
    )
    .await;
    let mut jobs = Vec::new();
    for _ in 0..2 {
        let request_id = Uuid::new_v4();
        let response = app
            .create_job(account, ADMIN_KEY, request_id, &json!({}))
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let job: Value = response.json().await.expect("json");
        jobs.push((
            uuid(&job["job_id"]),
            job["reservation"]["reservation_id"]
                .as_str()
                .expect("reservation")
                .to_owned(),
        ));
    }
    let mut conn = app.conn();
    let claimed = claim_jobs(&mut conn, "test", 30, 3, 10).expect("claim");
    assert_eq!(claimed.len(), 2);
    // Both reservations are due for a heartbeat's extension: they expire
    // in a minute.
    diesel::sql_query(
        "UPDATE reservations SET expires_at = clock_timestamp() + interval '60 seconds' \
         WHERE account_id = $1 AND state = 'held'",
    )
    .bind::<SqlUuid, _>(account)
    .execute(&mut conn)
    .expect("due");
    let before = reservation_expiry(&app, account, &jobs[0].1).await;

    // The grant has not lapsed: the heartbeat extends the first job's
    // reservation (300 s).
    let first = claimed
        .iter()
        .find(|c| c.job.id == jobs[0].0)
        .expect("claimed");
    let answer =
        heartbeat(&mut conn, first.job.id, first.job.lease_token, 30, 300).expect("heartbeat");
    assert_eq!(answer, Fenced::Done);
    assert!(
        reservation_expiry(&app, account, &jobs[0].1).await
            > before + chrono::Duration::seconds(200)
    );

    // Now it lapses: the second job's heartbeat keeps its lease, but its
    // reservation keeps the expiry it had.
    age(&app, grant);
    let second = claimed
        .iter()
        .find(|c| c.job.id == jobs[1].0)
        .expect("claimed");
    let held_until = reservation_expiry(&app, account, &jobs[1].1).await;
    for _ in 0..3 {
        let answer = heartbeat(&mut conn, second.job.id, second.job.lease_token, 30, 300)
            .expect("heartbeat");
        assert_eq!(answer, Fenced::Done);
        assert_eq!(
            reservation_expiry(&app, account, &jobs[1].1).await,
            held_until
        );
    }
    // The generation in progress finishes within its hold and is charged.
    let finish = finish_success(
        &mut conn,
        &second.job,
        second.job.lease_token,
        &json!({"ok": 1}),
    )
    .expect("finish");
    assert_eq!(finish.fenced, Fenced::Done);
    let shown = app.account(account).await;
    assert_eq!(
        shown["used"].as_i64(),
        Some(jobs_cost(&app, account, jobs[1].0)),
        "{shown}"
    );
    assert_books_clean(&app);
}

fn jobs_cost(app: &TestApp, _account: Uuid, job: Uuid) -> i64 {
    #[derive(QueryableByName)]
    struct Cost {
        #[diesel(sql_type = BigInt)]
        cost: i64,
    }
    diesel::sql_query("SELECT cost FROM generation_jobs WHERE id = $1")
        .bind::<SqlUuid, _>(job)
        .get_result::<Cost>(&mut app.conn())
        .expect("cost")
        .cost
}
