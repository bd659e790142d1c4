//! Automatic top-ups (docs/topups.md): a threshold rule fires exactly once
//! per crossing with twenty kiosks on three replicas, re-arms, tops up to a
//! target, stops at its caps; a schedule fires once per period across
//! replicas, restarts and a clock moved past two periods; a request is
//! answered by the customer's credit, replays change nothing, and an
//! unanswered one expires. A property test compares the engine with a
//! small model of the threshold rule (crossing, re-arm, caps).
//!
//! The schedule's clock is injected: the reaper's step
//! (`topups::run_schedules`) takes the instant it fires for, which is the
//! service's clock in production.

use std::sync::Arc;

use chrono::{Duration, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Uuid as SqlUuid};
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::topups::run_schedules;

use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{events_of, json_rows, problem, TestApp, ADMIN_KEY};

/// The reaper as the tests run it by hand.
const REAPER: ReaperSettings = ReaperSettings {
    batch: 100,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 0,
};

pub(crate) async fn call(
    app: &TestApp,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = match method {
        "POST" => app.client.post(app.url(path)),
        "PATCH" => app.client.patch(app.url(path)),
        "DELETE" => app.client.delete(app.url(path)),
        _ => app.client.get(app.url(path)),
    }
    .bearer_auth(ADMIN_KEY);
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    let response = request.send().await.expect("sent");
    let status = response.status();
    let text = response.text().await.expect("text");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub(crate) async fn rule(app: &TestApp, account: Uuid, body: Value) -> Value {
    let (status, made) = call(
        app,
        "POST",
        &format!("/v1/accounts/{account}/topup-rules"),
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made
}

/// The path of the rule `made` (as the API answered its creation) of
/// `account`.
pub(crate) fn rule_path_of(account: Uuid, made: &Value) -> String {
    format!(
        "/v1/accounts/{account}/topup-rules/{}",
        made["rule_id"].as_str().expect("as the API answers")
    )
}

pub(crate) fn count(conn: &mut PgConnection, sql: &str, account: Uuid) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query(sql)
        .bind::<SqlUuid, _>(account)
        .get_result::<Count>(conn)
        .expect("count")
        .n
}

fn topup_credits(conn: &mut PgConnection, account: Uuid) -> i64 {
    count(
        conn,
        "SELECT count(*) AS n FROM ledger_entries e JOIN credit_grants g ON g.id = e.grant_id \
         WHERE e.account_id = $1 AND e.kind = 'credit' AND g.topup_rule_id IS NOT NULL",
        account,
    )
}

fn available(app: &TestApp, account: Uuid) -> i64 {
    app.assert_invariants(account).available
}

/// Reserves `amount` through the API; the reservation's id.
async fn reserve(app: &TestApp, account: Uuid, key: &str, amount: i64) -> Uuid {
    let response = app.reserve(account, key, Uuid::new_v4(), amount).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    body["reservation_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid")
}

/// Reserves `amount` and commits it: tokens used.
async fn spend(app: &TestApp, account: Uuid, key: &str, amount: i64) {
    let id = reserve(app, account, key, amount).await;
    let response = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/commit"),
            key,
            &json!({}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// Twenty kiosks spread over three replicas spend at once through the
/// threshold: one top-up, one event; then, once the kiosks used what it
/// added, once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_kiosks_on_three_replicas_crossing_together_make_one_top_up() {
    let first = TestApp::spawn().await;
    let second = first.spawn_replica(|_| {}).await;
    let third = first.spawn_replica(|_| {}).await;
    let account = first.funded_account(60).await;
    let key = first.kiosk_key(account).await;
    let made = rule(
        &first,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed",
               "tokens": 100}),
    )
    .await;
    assert_eq!(made["armed"], json!(true), "{made}");
    let replicas = Arc::new([first, second, third]);

    for (round, amount) in [(1_i64, 1_i64), (2, 5)] {
        let mut kiosks = Vec::new();
        for kiosk in 0..20 {
            let replicas = Arc::clone(&replicas);
            let key = key.clone();
            kiosks.push(tokio::spawn(async move {
                let app = &replicas[kiosk % 3];
                let response = app.reserve(account, &key, Uuid::new_v4(), amount).await;
                assert_eq!(response.status(), StatusCode::CREATED);
                let body: Value = response.json().await.expect("json");
                let id = body["reservation_id"].as_str().expect("as the API answers");
                app.post(
                    &format!("/v1/accounts/{account}/reservations/{id}/commit"),
                    &key,
                    &json!({}),
                )
                .await
                .status()
            }));
        }
        for kiosk in kiosks {
            assert_eq!(kiosk.await.expect("kiosk"), StatusCode::OK);
        }
        let app = &replicas[0];
        let mut conn = app.conn();
        // Round 1: 60 - 20 crosses 50 once (+100 → 140). Round 2: 140 - 100
        // crosses it again, and the 100 it added are used: once (+100).
        assert_eq!(topup_credits(&mut conn, account), round, "round {round}");
        assert_eq!(
            events_of(&mut conn, account, "topup.granted").len(),
            usize::try_from(round).expect("as the API answers"),
            "round {round}"
        );
        assert_eq!(available(app, account), 140, "round {round}");
    }
    // The credited metric counts the engine's top-ups where they were made
    // (60 by hand on the first replica, 2 × 100 by the rule on any).
    let mut credited = 0.0;
    for app in replicas.iter() {
        let text = app.metrics_text().await;
        credited += text
            .lines()
            .find(|line| line.starts_with("token_billing_tokens_total{movement=\"credited\"}"))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!((credited - 260.0).abs() < 0.5, "credited metric {credited}");
    let app = &replicas[0];
    let (status, shown) = call(
        app,
        "GET",
        &format!("/v1/accounts/{account}/topup-rules"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let shown = &shown["rules"][0];
    assert_eq!(shown["armed"], json!(true), "{shown}");
    assert_eq!(shown["last_firing"]["outcome"], json!("granted"), "{shown}");
    assert_eq!(shown["last_firing"]["tokens"], json!(100), "{shown}");
    // The ledger's credit entries and the grants name the rule.
    let (status, ledger) = call(app, "GET", &format!("/v1/accounts/{account}/ledger"), None).await;
    assert_eq!(status, StatusCode::OK);
    let named = ledger["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|entry| entry["topup_rule_id"] == made["rule_id"])
        .count();
    assert_eq!(named, 2, "{ledger}");
}

/// `target` brings `available` up to the target, not counting held
/// reservations; a runaway rule stops at its daily cap with one
/// `topup.cap_reached`.
#[tokio::test]
async fn target_tops_up_available_and_caps_stop_a_runaway_rule() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(40).await;
    let key = app.kiosk_key(account).await;
    reserve(&app, account, &key, 10).await; // held: 10, available 30
    rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 25, "method": "target",
               "target_tokens": 100}),
    )
    .await;
    reserve(&app, account, &key, 6).await; // 24 < 25: tops up to 100
    assert_eq!(available(&app, account), 100);
    let balances = app.assert_invariants(account);
    assert_eq!(balances.reserved, 16);

    // A rule that fires on every crossing, 10 tokens, at most 30 a day, or
    // 25 a month (its third firing, 20 + 10, is past that).
    for (per, max, fires) in [("day", 30, 3), ("month", 25, 2)] {
        let runaway = app.funded_account(105).await;
        let key = app.kiosk_key(runaway).await;
        let mut body = json!({"trigger": "threshold", "threshold_tokens": 100,
                              "method": "fixed", "tokens": 10});
        body[format!("max_tokens_per_{per}")] = json!(max);
        rule(&app, runaway, body).await;
        for _ in 0..fires {
            spend(&app, runaway, &key, 10).await; // 95 → +10 → 105
            assert_eq!(available(&app, runaway), 105);
        }
        spend(&app, runaway, &key, 10).await; // 95: over the cap
        assert_eq!(available(&app, runaway), 95, "a firing past the {per} cap");
        // Back above (re-arms), below again: still capped, no second notice.
        app.credit(runaway, 10).await;
        spend(&app, runaway, &key, 10).await;
        assert_eq!(available(&app, runaway), 95);
        let mut conn = app.conn();
        assert_eq!(topup_credits(&mut conn, runaway), fires);
        let capped = events_of(&mut conn, runaway, "topup.cap_reached");
        assert_eq!(capped.len(), 1, "{capped:?}");
        assert_eq!(capped[0]["cap"]["per"], json!(per));
        assert_eq!(capped[0]["cap"]["max_tokens"], json!(max));
        assert_eq!(capped[0]["cap"]["used_tokens"], json!(10 * fires));
        crate::openapi_types::assert_data_conforms(&app, "topup.cap_reached", &capped[0]).await;
    }
}

/// A schedule fires once per period: two replicas, a restart, and a clock
/// moved past two periods (the missed one never fires; the current one
/// once). `expires_at_period_end` gives the grant the period's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_fires_once_per_period_across_replicas_restarts_and_downtime() {
    let first = TestApp::spawn().await;
    let second = first.spawn_replica(|_| {}).await;
    let account = first.funded_account(0).await;
    let made = rule(
        &first,
        account,
        json!({"trigger": "schedule", "period": "daily", "time_zone": "Europe/Berlin",
               "method": "fixed", "tokens": 7, "expires_at_period_end": true}),
    )
    .await;
    let rule_id: Uuid = made["rule_id"]
        .as_str()
        .expect("as the API answers")
        .parse()
        .expect("as the API answers");
    let now = Utc::now();
    let later = now + Duration::days(2);
    for at in [now, later] {
        // Both replicas at once, twice each.
        let mut passes = Vec::new();
        for app in [&first, &second, &first, &second] {
            let database = Arc::clone(&app.database);
            passes.push(std::thread::spawn(move || {
                let mut conn = database.connect();
                run_schedules(&mut conn, at, 100).expect("pass")
            }));
        }
        for pass in passes {
            pass.join().expect("pass");
        }
    }
    let mut conn = first.conn();
    assert_eq!(topup_credits(&mut conn, account), 2);
    // A restart: a new replica on the same database, the same clock.
    drop(second);
    let restarted = first.spawn_replica(|_| {}).await;
    run_schedules(&mut restarted.conn(), later, 100).expect("pass");
    assert_eq!(topup_credits(&mut conn, account), 2);
    // The next day fires once more.
    run_schedules(&mut restarted.conn(), later + Duration::days(1), 100).expect("pass");
    assert_eq!(topup_credits(&mut conn, account), 3);
    assert_eq!(available(&first, account), 21);

    #[derive(QueryableByName)]
    struct Fired {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        period_start: chrono::DateTime<Utc>,
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        expires_at: chrono::DateTime<Utc>,
    }
    let fired: Vec<Fired> = diesel::sql_query(
        "SELECT f.period_start, g.expires_at FROM topup_firings f \
         JOIN credit_grants g ON g.id = f.credit_id WHERE f.rule_id = $1 ORDER BY f.period_start",
    )
    .bind::<SqlUuid, _>(rule_id)
    .load(&mut conn)
    .expect("firings");
    assert_eq!(fired.len(), 3);
    let berlin_midnight = |at: chrono::DateTime<Utc>| {
        // Local midnight in Berlin (UTC+1 in December, UTC+2 in summer).
        #[derive(QueryableByName)]
        struct Start {
            #[diesel(sql_type = diesel::sql_types::Timestamptz)]
            start: chrono::DateTime<Utc>,
        }
        diesel::sql_query(
            "SELECT date_trunc('day', $1 AT TIME ZONE 'Europe/Berlin') AT TIME ZONE 'Europe/Berlin' \
             AS start",
        )
        .bind::<diesel::sql_types::Timestamptz, _>(at)
        .get_result::<Start>(&mut first.conn())
        .expect("midnight")
        .start
    };
    for (fired, at) in fired.iter().zip([now, later, later + Duration::days(1)]) {
        assert_eq!(fired.period_start, berlin_midnight(at));
        assert_eq!(fired.expires_at, berlin_midnight(at + Duration::days(1)));
    }
    // The missed day (now + 1 day) never fired.
    assert!(fired
        .iter()
        .all(|fired| fired.period_start != berlin_midnight(now + Duration::days(1))));

    // Today's allowance lapses at the period's end through the reaper's
    // grant expiry. Its end is hours away: as in tests/api/grant_expiry.rs,
    // the grant's expires_at is moved to now (the engine decides by it
    // against the clock, so this is the same as waiting).
    diesel::sql_query(
        "UPDATE credit_grants SET expires_at = clock_timestamp() \
         WHERE id = (SELECT credit_id FROM topup_firings WHERE rule_id = $1 \
                     ORDER BY period_start LIMIT 1)",
    )
    .bind::<SqlUuid, _>(rule_id)
    .execute(&mut conn)
    .expect("aged");
    let settings = token_billing::domain::reaper::ReaperSettings {
        batch: 500,
        job_max_attempts: 3,
        grant_expiring_notice_hours: 0,
    };
    let report = token_billing::domain::reaper::run_pass(&mut conn, &settings, None).expect("pass");
    assert_eq!(report.grants_expired, 1);
    assert_eq!(report.grant_tokens_expired, 7);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM ledger_entries e JOIN credit_grants g ON g.id = e.grant_id \
             WHERE e.account_id = $1 AND e.kind = 'grant_expire' AND g.topup_rule_id IS NOT NULL",
            account
        ),
        1
    );
    assert_eq!(available(&first, account), 14);
}

/// The line is inclusive: `available` equal to the threshold neither
/// fires nor stays disarmed — it fires below it and re-arms at it.
#[tokio::test]
async fn the_rule_fires_below_its_threshold_and_re_arms_at_it() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "fixed",
               "tokens": 10, "max_tokens_per_day": 10}),
    )
    .await;
    let rule_path = rule_path_of(account, &made);
    let armed = |shown: &Value| shown["armed"].as_bool().expect("armed");
    assert!(armed(&made), "at the threshold a new rule is armed: {made}");
    spend(&app, account, &key, 1).await; // 9: fires, 19
    assert_eq!(available(&app, account), 19);
    spend(&app, account, &key, 9).await; // 10: at the line, nothing
    assert_eq!(available(&app, account), 10);
    assert!(armed(&call(&app, "GET", &rule_path, None).await.1));
    spend(&app, account, &key, 1).await; // 9: capped, disarmed
    assert_eq!(available(&app, account), 9);
    assert!(!armed(&call(&app, "GET", &rule_path, None).await.1));
    app.credit(account, 1).await; // 10: back at the line, re-armed
    assert!(armed(&call(&app, "GET", &rule_path, None).await.1));
}

/// Only a live rule fires: disabled, a threshold rule adds nothing however
/// far the balance falls; enabled again below its line, it fires at once;
/// deleted, never again.
#[tokio::test]
async fn a_disabled_or_deleted_threshold_rule_never_fires() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(20).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "fixed",
               "tokens": 10}),
    )
    .await;
    let rule_path = rule_path_of(account, &made);
    let mut conn = app.conn();
    let (status, shown) = call(&app, "PATCH", &rule_path, Some(json!({"enabled": false}))).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    spend(&app, account, &key, 15).await; // 5, below the line: disabled
    assert_eq!(available(&app, account), 5);
    assert_eq!(
        topup_credits(&mut conn, account),
        0,
        "a disabled rule fired"
    );
    let (status, shown) = call(&app, "PATCH", &rule_path, Some(json!({"enabled": true}))).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(
        available(&app, account),
        15,
        "enabled below its line: fires"
    );
    assert_eq!(topup_credits(&mut conn, account), 1);
    let (status, _) = call(&app, "DELETE", &rule_path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    spend(&app, account, &key, 15).await; // 0, used what the rule added
    assert_eq!(available(&app, account), 0);
    assert_eq!(topup_credits(&mut conn, account), 1, "a deleted rule fired");
}

/// A request that asks for too little: a crossing while it is open is not
/// lost — the rule stays armed, and the first movement after the answer,
/// still below the threshold, asks again.
#[tokio::test]
async fn a_crossing_while_a_request_is_open_asks_again_after_the_answer() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(95).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 100, "method": "fixed",
               "tokens": 30, "mode": "request"}),
    )
    .await;
    assert_eq!(made["priority"], Value::Null, "{made}");
    let mut conn = app.conn();
    let requested = events_of(&mut conn, account, "topup.requested");
    assert_eq!(requested.len(), 1, "below at creation: {requested:?}");
    spend(&app, account, &key, 30).await; // 65 + 30 requested < 100, 30 used
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 1);
    let rule_path = rule_path_of(account, &made);
    assert_eq!(
        call(&app, "GET", &rule_path, None).await.1["armed"],
        json!(true)
    );
    let (status, _) = call(
        &app,
        "POST",
        &format!("/v1/accounts/{account}/credits"),
        Some(json!({"amount": 30, "external_ref": requested[0]["request"]["firing_id"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // 95 < 100 after the answer: a second request at once.
    let requested = events_of(&mut conn, account, "topup.requested");
    assert_eq!(requested.len(), 2, "{requested:?}");
    assert_eq!(requested[1]["request"]["tokens"], json!(30));
    // PATCH keeps a request rule valid (no priority is laid over it).
    let (status, changed) = call(&app, "PATCH", &rule_path, Some(json!({"tokens": 40}))).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
}

/// `request` mode: the customer's credit with the request's id answers it
/// (its grant names the rule), a replayed credit changes nothing, no
/// second request while one is open, the next once the tokens asked for
/// were used; an unanswered request expires, and the next movement below
/// the line asks again.
#[tokio::test]
async fn a_request_is_answered_by_the_customers_credit_or_expires() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(12).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "fixed",
               "tokens": 50, "mode": "request", "request_ttl": "PT1M",
               "max_tokens_per_day": 100}),
    )
    .await;
    spend(&app, account, &key, 5).await; // 7: a request
    spend(&app, account, &key, 3).await; // 4: no second one
    let mut conn = app.conn();
    let requested = events_of(&mut conn, account, "topup.requested");
    assert_eq!(requested.len(), 1, "{requested:?}");
    let request_id = requested[0]["request"]["firing_id"]
        .as_str()
        .expect("as the API answers")
        .to_owned();
    assert_eq!(requested[0]["request"]["state"], json!("open"));
    assert_eq!(available(&app, account), 4);

    // The customer's billing charges a card and credits with the id.
    let credit = json!({"amount": 50, "external_ref": request_id});
    let path = format!("/v1/accounts/{account}/credits");
    let (status, credited) = call(&app, "POST", &path, Some(credit.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{credited}");
    assert_eq!(credited["topup_rule_id"], made["rule_id"], "{credited}");
    let before = app.snapshot(account);
    let (status, _) = call(&app, "POST", &path, Some(credit)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(app.snapshot(account), before);
    let (_, shown) = call(&app, "GET", &rule_path_of(account, &made), None).await;
    assert_eq!(shown["last_firing"]["state"], json!("fulfilled"), "{shown}");
    assert_eq!(shown["armed"], json!(true), "{shown}");

    // 54 → 9, and 53 used (the 50 asked for): a second request;
    // unanswered, it expires.
    spend(&app, account, &key, 45).await;
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 2);
    run_schedules(&mut conn, Utc::now() + Duration::minutes(2), 100).expect("pass");
    let expired = events_of(&mut conn, account, "topup.request_expired");
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(expired[0]["next"], json!("ask_again"));
    // Still below: the next movement asks again (the expired request
    // does not count toward the daily cap: 50 answered + 50 asked = 100).
    reserve(&app, account, &key, 1).await;
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 3);
    assert_eq!(events_of(&mut conn, account, "topup.cap_reached").len(), 0);
    let states = count(
        &mut conn,
        "SELECT count(DISTINCT state) AS n FROM topup_firings WHERE account_id = $1",
        account,
    );
    assert_eq!(states, 3, "fulfilled, expired, open");
}

/// One threshold rule per account; bad rules are refused with a clear
/// problem and change nothing; PATCH and DELETE are audited and judged at
/// once; kiosks read but never write.
#[tokio::test]
async fn rules_are_validated_one_threshold_per_account_and_audited() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let path = format!("/v1/accounts/{account}/topup-rules");
    for bad in [
        json!({"trigger": "threshold", "method": "fixed", "tokens": 5}),
        json!({"trigger": "schedule", "period": "weekly", "method": "fixed", "tokens": 5}),
        json!({"trigger": "schedule", "period": "daily", "time_zone": "Mars/Olympus",
               "method": "fixed", "tokens": 5}),
        json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed", "tokens": 5,
               "expires_after": "P1M"}),
        json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed", "tokens": 5,
               "colour": "red"}),
    ] {
        let before = app.snapshot(account);
        let (status, body) = call(&app, "POST", &path, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} → {body}");
        assert_eq!(body["code"], json!("invalid_request"));
        assert_eq!(app.snapshot(account), before);
    }
    let response = app
        .post(
            &path,
            &kiosk,
            &json!({"trigger": "threshold", "threshold_tokens": 5,
                                     "method": "fixed", "tokens": 5}),
        )
        .await;
    assert_eq!(problem(response).await.0, StatusCode::FORBIDDEN);

    // Created while below its threshold: it fires at once.
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "fixed",
               "tokens": 20}),
    )
    .await;
    assert_eq!(available(&app, account), 25);
    let (status, body) = call(
        &app,
        "POST",
        &path,
        Some(
            json!({"trigger": "threshold", "threshold_tokens": 3, "method": "fixed",
                    "tokens": 5}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], json!("threshold_rule_exists"));
    assert_eq!(body["rule_id"], made["rule_id"]);

    // A new threshold above the balance: armed, judged at once.
    let rule_path = format!(
        "{path}/{}",
        made["rule_id"].as_str().expect("as the API answers")
    );
    let (status, changed) = call(
        &app,
        "PATCH",
        &rule_path,
        Some(json!({"threshold_tokens": 30, "max_tokens_per_day": 100})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["threshold_tokens"], json!(30));
    assert_eq!(available(&app, account), 45);
    let (status, _) = call(&app, "PATCH", &rule_path, Some(json!({"tokens": null}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, shown) = call(&app, "GET", &rule_path, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["max_tokens_per_day"], json!(100));
    let response = app.get(&rule_path, &kiosk).await;
    assert_eq!(response.status(), StatusCode::OK);

    let (status, _) = call(&app, "DELETE", &rule_path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(&app, "GET", &rule_path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let mut conn = app.conn();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM accounts WHERE id = $1 AND topup_threshold = 0 \
             AND NOT topup_armed",
            account
        ),
        1
    );
    #[derive(QueryableByName)]
    struct Action {
        #[diesel(sql_type = Text)]
        action: String,
    }
    let actions: Vec<String> = diesel::sql_query(
        "SELECT action FROM audit_events WHERE target = 'topup_rule:' || $1 ORDER BY id",
    )
    .bind::<Text, _>(made["rule_id"].as_str().expect("as the API answers"))
    .load::<Action>(&mut conn)
    .expect("audit")
    .into_iter()
    .map(|action| action.action)
    .collect();
    assert_eq!(
        actions,
        [
            "topup_rule.created",
            "topup_rule.updated",
            "topup_rule.deleted"
        ]
    );
}

/// The threshold rule as a model: a sequence of spends, returns, commits,
/// lapses, credits and (in request mode) answered and expired requests on
/// one account, the engine and the model in step after every operation
/// (the balance, the top-ups made, the caps, whether the rule is armed and
/// what it added that is not used yet).
#[derive(Clone, Debug)]
enum Step {
    Reserve(i64),
    ReleaseLast,
    CommitLast,
    /// The last held reservation passes its expiry; the reaper expires it.
    ExpireLast,
    /// Another credit than the rule's own.
    Credit(i64),
    /// Every grant of the account lapses (only while nothing is held).
    Lapse,
    /// Request mode: the customer's billing answers the open request.
    Answer,
    /// Request mode: the open request expires unanswered.
    ExpireRequest,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (1_i64..=12).prop_map(Step::Reserve),
        2 => Just(Step::ReleaseLast),
        2 => Just(Step::CommitLast),
        1 => Just(Step::ExpireLast),
        1 => (1_i64..=15).prop_map(Step::Credit),
        1 => Just(Step::Lapse),
        1 => Just(Step::Answer),
        1 => Just(Step::ExpireRequest),
    ]
}

/// The rule: threshold 20, fixed 15, at most 45 a day.
const THRESHOLD: i64 = 20;
const FIRING: i64 = 15;
const DAY_CAP: i64 = 45;

struct Model {
    request_mode: bool,
    available: i64,
    armed: bool,
    /// Tokens the rule added (granted, or requested and not expired) that
    /// nothing has used since: the rule fires only at 0.
    unconsumed: i64,
    /// The open request's tokens (request mode).
    open: Option<i64>,
    added_today: i64,
    topups: i64,
    capped: i64,
}

impl Model {
    /// The rule after a movement: it re-arms at or above its line; below
    /// it, armed and with nothing unused, it fires.
    fn judge(&mut self) {
        let line = THRESHOLD - self.open.unwrap_or(0);
        if self.available >= line {
            self.armed = true;
            return;
        }
        if !self.armed || self.unconsumed > 0 {
            return;
        }
        if self.open.is_some() {
            // (no second request while one is open: stays armed)
            return;
        }
        self.armed = false;
        if self.added_today + FIRING > DAY_CAP {
            self.capped = 1;
            return;
        }
        self.added_today += FIRING;
        self.unconsumed += FIRING;
        if self.request_mode {
            self.open = Some(FIRING);
            if self.available >= THRESHOLD - FIRING {
                self.armed = true;
            }
        } else {
            self.topups += 1;
            self.available += FIRING;
            self.judge();
        }
    }
}

/// Tokens the rule added so far (granted, or requested and not expired),
/// and tokens used or credited otherwise so far.
fn added_and_used(conn: &mut PgConnection, account: Uuid) -> (i64, i64) {
    let added = count(
        conn,
        "SELECT COALESCE(sum(tokens), 0)::bigint AS n FROM topup_firings \
         WHERE account_id = $1 AND outcome IN ('granted', 'requested') \
           AND state IS DISTINCT FROM 'expired'",
        account,
    );
    let used = count(
        conn,
        "SELECT (a.used + a.credited \
           - COALESCE((SELECT sum(g.amount) FROM credit_grants g \
                       WHERE g.account_id = a.id AND g.topup_rule_id IS NOT NULL), 0))::bigint \
           AS n FROM accounts a WHERE a.id = $1",
        account,
    );
    (added, used)
}

#[test]
fn the_threshold_rule_follows_its_model_and_adds_no_more_than_was_used() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let app = runtime.block_on(TestApp::spawn());
    let config = crate::helpers::property_config(40);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    runner
        .run(
            &(any::<bool>(), proptest::collection::vec(step(), 1..25)),
            |(request_mode, steps)| {
                runtime.block_on(async {
                    let account = app.funded_account(30).await;
                    let key = app.kiosk_key(account).await;
                    let mut body = json!({"trigger": "threshold", "threshold_tokens": THRESHOLD,
                                          "method": "fixed", "tokens": FIRING,
                                          "max_tokens_per_day": DAY_CAP});
                    if request_mode {
                        body["mode"] = json!("request");
                        body["request_ttl"] = json!("PT1M");
                    }
                    rule(&app, account, body).await;
                    let mut model = Model {
                        request_mode,
                        available: 30,
                        armed: true,
                        unconsumed: 0,
                        open: None,
                        added_today: 0,
                        topups: 0,
                        capped: 0,
                    };
                    let mut conn = app.conn();
                    let mut timeline = vec![added_and_used(&mut conn, account)];
                    let mut held: Vec<(Uuid, i64)> = Vec::new();
                    for step in &steps {
                        match *step {
                            Step::Reserve(amount) => {
                                let response =
                                    app.reserve(account, &key, Uuid::new_v4(), amount).await;
                                if amount <= model.available {
                                    prop_assert_eq!(response.status(), StatusCode::CREATED);
                                    let body: Value = response.json().await.expect("json");
                                    let id = body["reservation_id"]
                                        .as_str()
                                        .expect("as the API answers")
                                        .parse()
                                        .expect("as the API answers");
                                    held.push((id, amount));
                                    model.available -= amount;
                                    model.judge();
                                } else {
                                    prop_assert_eq!(
                                        response.status(),
                                        StatusCode::PAYMENT_REQUIRED
                                    );
                                }
                            }
                            Step::ReleaseLast | Step::CommitLast => {
                                if let Some((id, amount)) = held.pop() {
                                    let verb = match step {
                                        Step::ReleaseLast => "release",
                                        _ => "commit",
                                    };
                                    let response = app
                                        .post(
                                            &format!(
                                                "/v1/accounts/{account}/reservations/{id}/{verb}"
                                            ),
                                            &key,
                                            &json!({}),
                                        )
                                        .await;
                                    prop_assert_eq!(response.status(), StatusCode::OK);
                                    if verb == "release" {
                                        model.available += amount;
                                    } else {
                                        model.unconsumed = (model.unconsumed - amount).max(0);
                                    }
                                    model.judge();
                                }
                            }
                            Step::ExpireLast => {
                                if let Some((id, amount)) = held.pop() {
                                    diesel::sql_query(
                                        "UPDATE reservations \
                                         SET expires_at = clock_timestamp() - interval '1 second' \
                                         WHERE id = $1",
                                    )
                                    .bind::<SqlUuid, _>(id)
                                    .execute(&mut conn)
                                    .expect("an expiry in the past");
                                    let pass = run_pass(&mut conn, &REAPER, None).expect("pass");
                                    prop_assert_eq!(pass.reservations_expired, 1);
                                    model.available += amount;
                                    model.judge();
                                }
                            }
                            Step::Credit(amount) => {
                                app.credit(account, amount).await;
                                model.unconsumed = (model.unconsumed - amount).max(0);
                                model.available += amount;
                                model.judge();
                            }
                            Step::Lapse => {
                                if held.is_empty() {
                                    diesel::sql_query(
                                        "UPDATE credit_grants SET expires_at = clock_timestamp() \
                                         WHERE account_id = $1 AND remaining > 0",
                                    )
                                    .bind::<SqlUuid, _>(account)
                                    .execute(&mut conn)
                                    .expect("grants due to lapse");
                                    run_pass(&mut conn, &REAPER, None).expect("pass");
                                    if model.available > 0 {
                                        model.available = 0;
                                        model.judge();
                                    }
                                }
                            }
                            Step::Answer => {
                                if model.open.is_some() {
                                    let open = json_rows(
                                        &mut conn,
                                        "SELECT jsonb_build_object('id', id) AS row \
                                         FROM topup_firings WHERE account_id = $1 \
                                           AND state = 'open'",
                                        account,
                                    );
                                    prop_assert_eq!(open.len(), 1);
                                    let (status, _) = call(
                                        &app,
                                        "POST",
                                        &format!("/v1/accounts/{account}/credits"),
                                        Some(json!({"amount": FIRING,
                                                    "external_ref": open[0]["id"]})),
                                    )
                                    .await;
                                    prop_assert_eq!(status, StatusCode::CREATED);
                                    model.open = None;
                                    model.topups += 1;
                                    model.available += FIRING;
                                    model.judge();
                                }
                            }
                            Step::ExpireRequest => {
                                if let Some(tokens) = model.open.take() {
                                    run_schedules(
                                        &mut conn,
                                        Utc::now() + Duration::minutes(2),
                                        100,
                                    )
                                    .expect("pass");
                                    model.unconsumed = (model.unconsumed - tokens).max(0);
                                    model.added_today -= tokens;
                                    // Asks again at the next movement below the line.
                                    model.armed = true;
                                }
                            }
                        }
                        prop_assert_eq!(available(&app, account), model.available, "{:?}", steps);
                        let topups = if request_mode {
                            count(
                                &mut conn,
                                "SELECT count(*) AS n FROM topup_firings \
                                 WHERE account_id = $1 AND state = 'fulfilled'",
                                account,
                            )
                        } else {
                            topup_credits(&mut conn, account)
                        };
                        prop_assert_eq!(topups, model.topups, "{:?}", steps);
                        prop_assert_eq!(
                            i64::try_from(events_of(&mut conn, account, "topup.cap_reached").len())
                                .expect("as the API answers"),
                            model.capped
                        );
                        let armed = count(
                            &mut conn,
                            "SELECT count(*) AS n FROM accounts WHERE id = $1 AND topup_armed",
                            account,
                        );
                        prop_assert_eq!(armed == 1, model.armed, "{:?}", steps);
                        let unconsumed = count(
                            &mut conn,
                            "SELECT topup_unconsumed AS n FROM accounts WHERE id = $1",
                            account,
                        );
                        prop_assert_eq!(unconsumed, model.unconsumed, "{:?}", steps);
                        // Whatever the sequence: the tokens the rule added
                        // between any two instants are at most the tokens
                        // used (or credited otherwise) between them, plus
                        // one firing.
                        let now = added_and_used(&mut conn, account);
                        for (i, then) in timeline.iter().enumerate() {
                            prop_assert!(
                                now.0 - then.0 <= now.1 - then.1 + FIRING,
                                "after step {i}: added {}, used {} ({:?})",
                                now.0 - then.0,
                                now.1 - then.1,
                                steps
                            );
                        }
                        timeline.push(now);
                    }
                    Ok(())
                })
            },
        )
        .expect("the engine follows the model");
}

/// The top-up events show the rule, its firing, the request and the
/// credit as the API does (the same engine functions): `rule` as
/// `GET …/topup-rules/{rule_id}` shows it (`armed` as it was when the
/// event was written), `firing` and `request` as its `last_firing`, and
/// `credit` as the `credit.created` of the same top-up.
#[tokio::test]
async fn top_up_events_show_their_resources_as_the_api_does() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(20).await;
    let key = app.kiosk_key(account).await;
    let granting = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "fixed",
               "tokens": 25, "priority": 10, "expires_after": "P30D"}),
    )
    .await;
    reserve(&app, account, &key, 15).await;
    let other = app.funded_account(20).await;
    let other_key = app.kiosk_key(other).await;
    let asking = rule(
        &app,
        other,
        json!({"trigger": "threshold", "threshold_tokens": 10, "method": "target",
               "target_tokens": 40, "mode": "request", "request_ttl": "PT5M"}),
    )
    .await;
    reserve(&app, other, &other_key, 15).await;
    // The account's feed once it shows an event of `kind` (the feed shows
    // a transaction's events once every earlier writer has finished).
    let feed = |account: Uuid, kind: &'static str| {
        let app = &app;
        async move {
            for _ in 0..250 {
                let (status, page) = call(
                    app,
                    "GET",
                    &format!("/v1/events?account_id={account}&limit=1000"),
                    None,
                )
                .await;
                assert_eq!(status, StatusCode::OK);
                let events = page["events"].as_array().expect("events").clone();
                if events.iter().any(|event| event["type"] == kind) {
                    return events;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            panic!("no {kind} in the feed of {account}");
        }
    };
    let shown = |rule: &Value| {
        let app = &app;
        let path = format!(
            "/v1/accounts/{}/topup-rules/{}",
            rule["account_id"].as_str().expect("as the API answers"),
            rule["rule_id"].as_str().expect("as the API answers")
        );
        async move { call(app, "GET", &path, None).await.1 }
    };
    let without_armed = |rule: &Value| {
        let mut rule = rule.clone();
        rule.as_object_mut().expect("object").remove("armed");
        rule
    };

    let events = feed(account, "topup.granted").await;
    let granted = events
        .iter()
        .find(|event| event["type"] == "topup.granted")
        .expect("topup.granted");
    let now = shown(&granting).await;
    assert_eq!(granted["data"]["rule"], now, "topup.granted's rule");
    assert_eq!(granted["data"]["firing"], now["last_firing"]);
    assert_eq!(granted["data"]["firing"]["outcome"], json!("granted"));
    let credited = events
        .iter()
        .find(|event| {
            event["type"] == "credit.created"
                && event["data"]["credit"]["topup_rule_id"] == granting["rule_id"]
        })
        .expect("the top-up's credit.created");
    assert_eq!(granted["data"]["credit"], credited["data"]["credit"]);
    assert_eq!(granted["data"]["credit"]["priority"], json!(10));
    assert_eq!(granted["data"]["balances"]["available"], json!(30));

    let requested = feed(other, "topup.requested").await;
    let requested = requested
        .iter()
        .find(|event| event["type"] == "topup.requested")
        .expect("topup.requested");
    let now = shown(&asking).await;
    assert_eq!(
        without_armed(&requested["data"]["rule"]),
        without_armed(&now)
    );
    assert_eq!(requested["data"]["request"], now["last_firing"]);
    // target 40 from 5 available: 35 asked for.
    assert_eq!(requested["data"]["request"]["tokens"], json!(35));

    run_schedules(&mut app.conn(), Utc::now() + Duration::minutes(6), 100).expect("pass");
    let expired = feed(other, "topup.request_expired").await;
    let expired = expired
        .iter()
        .find(|event| event["type"] == "topup.request_expired")
        .expect("topup.request_expired");
    let now = shown(&asking).await;
    assert_eq!(expired["data"]["rule"], now);
    assert_eq!(expired["data"]["request"], now["last_firing"]);
    assert_eq!(expired["data"]["request"]["state"], json!("expired"));
    // Every event of both accounts is what the document's schema of its
    // type says (issue 59).
    for (account, last) in [(account, "topup.granted"), (other, "topup.request_expired")] {
        crate::openapi_types::assert_events_conform(&app, &feed(account, last).await).await;
    }
}
