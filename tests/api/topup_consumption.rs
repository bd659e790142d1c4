//! A threshold top-up rule fires only against consumption (docs/topups.md):
//! what it added must be used (committed) before it adds again, or a
//! credit that is not its own must arrive. Reserving and releasing below
//! the line, a reservation's expiry, the lapse of the rule's own grant and
//! an unanswered request never make it add tokens that nothing used; an
//! unanswered request never ends the rule in silence; and a rule without
//! any cap must be asked for.

use chrono::{Duration, Utc};
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::reaper::{run_pass, ReaperSettings};
use token_billing::domain::topups::run_schedules;

use crate::helpers::{events_of, TestApp};
use crate::topups::{call, count, rule};

const REAPER: ReaperSettings = ReaperSettings {
    batch: 100,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 0,
};

/// Reserves `amount`; the reservation's path.
async fn reserve(app: &TestApp, account: Uuid, key: &str, amount: i64) -> String {
    let response = app.reserve(account, key, Uuid::new_v4(), amount).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    format!(
        "/v1/accounts/{account}/reservations/{}",
        body["reservation_id"].as_str().expect("as the API answers")
    )
}

async fn settle(app: &TestApp, key: &str, reservation: &str, verb: &str) {
    let response = app
        .post(&format!("{reservation}/{verb}"), key, &json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{verb}");
}

fn rule_tokens(conn: &mut PgConnection, account: Uuid) -> i64 {
    count(
        conn,
        "SELECT COALESCE(sum(amount), 0)::bigint AS n FROM credit_grants \
         WHERE account_id = $1 AND topup_rule_id IS NOT NULL",
        account,
    )
}

/// The probe's finding: grant mode, threshold 50, 100 a firing, no cap;
/// twenty reserve/release pairs below the line. Before, each pair fired
/// (2,000 tokens added, `used` 0); now the first crossing fires once, and
/// the rule waits until its 100 tokens are used.
#[tokio::test]
async fn reserving_and_releasing_below_the_line_fires_once_until_tokens_are_used() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(60).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed",
               "tokens": 100, "allow_uncapped": true}),
    )
    .await;
    assert_eq!(made["max_tokens_per_day"], Value::Null, "{made}");
    let mut conn = app.conn();
    for _ in 0..20 {
        let balance = app.assert_invariants(account).available;
        let held = reserve(&app, account, &key, balance - 45).await;
        settle(&app, &key, &held, "release").await;
    }
    assert_eq!(
        rule_tokens(&mut conn, account),
        100,
        "one firing, nothing used"
    );
    let rule_path = crate::topups::rule_path_of(account, &made);
    // Below the line with its 100 unused: the rule says it waits.
    let balance = app.assert_invariants(account).available;
    let held = reserve(&app, account, &key, balance - 45).await;
    let shown = call(&app, "GET", &rule_path, None).await.1;
    assert_eq!(shown["status"], json!("waiting_for_use"), "{shown}");
    assert_eq!(shown["unconsumed_tokens"], json!(100), "{shown}");
    // Used: 115 committed (more than the 100 it added): it fires again.
    settle(&app, &key, &held, "commit").await;
    assert_eq!(rule_tokens(&mut conn, account), 200);
    let shown = call(&app, "GET", &rule_path, None).await.1;
    assert_eq!(shown["unconsumed_tokens"], json!(100), "{shown}");
    assert_eq!(shown["status"], json!("armed"), "{shown}");
}

/// Request mode: five reserve/release cycles below the line asked the
/// customer's card five times before; now once.
#[tokio::test]
async fn a_request_rule_asks_once_for_reserves_that_are_released() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(60).await;
    let key = app.kiosk_key(account).await;
    rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed",
               "tokens": 100, "mode": "request", "request_ttl": "PT1M"}),
    )
    .await;
    let mut conn = app.conn();
    for cycle in 0..5 {
        let balance = app.assert_invariants(account).available;
        let held = reserve(&app, account, &key, balance - 45).await;
        settle(&app, &key, &held, "release").await;
        if cycle == 0 {
            // The customer answers the first request at once.
            let requested = events_of(&mut conn, account, "topup.requested");
            let (status, _) = call(
                &app,
                "POST",
                &format!("/v1/accounts/{account}/credits"),
                Some(json!({"amount": 100,
                            "external_ref": requested[0]["request"]["firing_id"]})),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED);
        }
    }
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 1);
}

/// A request that expires unanswered: the rule asks again at the next
/// movement below the line (within its caps), and `topup.request_expired`
/// says so. Before, the rule stayed disarmed below its line for good.
#[tokio::test]
async fn an_expired_request_asks_again_at_the_next_movement_below_the_line() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(60).await;
    let key = app.kiosk_key(account).await;
    rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed",
               "tokens": 100, "mode": "request", "request_ttl": "PT1M"}),
    )
    .await;
    let mut conn = app.conn();
    reserve(&app, account, &key, 15).await; // 45: a request
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 1);
    run_schedules(&mut conn, Utc::now() + Duration::minutes(2), 100).expect("pass");
    let expired = events_of(&mut conn, account, "topup.request_expired");
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(expired[0]["next"], json!("ask_again"), "{}", expired[0]);
    reserve(&app, account, &key, 20).await; // 25: asked again
    let requested = events_of(&mut conn, account, "topup.requested");
    assert_eq!(requested.len(), 2, "{requested:?}");
    reserve(&app, account, &key, 20).await; // 5: that one is still open
    assert_eq!(events_of(&mut conn, account, "topup.requested").len(), 2);
}

/// A rule whose grants lapse: the lapse of its own grant is not
/// consumption, so the rule does not grant again. Before, each lapse
/// crossed the line and the rule granted anew (credited 400,
/// grant_expired 300, used 0).
#[tokio::test]
async fn the_lapse_of_the_rules_own_grant_never_fires_it_again() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(60).await;
    let key = app.kiosk_key(account).await;
    rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed",
               "tokens": 100, "expires_after": "PT1M"}),
    )
    .await;
    let mut conn = app.conn();
    let held = reserve(&app, account, &key, 15).await; // 45: +100 lapsing in a minute
    assert_eq!(app.assert_invariants(account).available, 145);
    for _ in 0..3 {
        // The rule's grants reach their expiry; the reaper lapses them.
        diesel::sql_query(
            "UPDATE credit_grants SET expires_at = clock_timestamp() \
             WHERE account_id = $1 AND topup_rule_id IS NOT NULL AND remaining > 0",
        )
        .bind::<SqlUuid, _>(account)
        .execute(&mut conn)
        .expect("due to lapse");
        run_pass(&mut conn, &REAPER, None).expect("pass");
    }
    // Each lapse took the balance back below the line (45).
    let books = app.assert_invariants(account);
    assert_eq!(books.available, 45, "{books:?}");
    assert_eq!(rule_tokens(&mut conn, account), 100, "granted once");
    assert_eq!(
        count(
            &mut conn,
            "SELECT grant_expired AS n FROM accounts WHERE id = $1",
            account
        ),
        100
    );
    settle(&app, &key, &held, "release").await;
    assert_eq!(app.assert_invariants(account).available, 60);
}

/// A new rule that names no cap gets a daily cap of ten firings' worth; a
/// rule without any cap must be asked for (`allow_uncapped`), and so must a
/// change that removes the last cap.
#[tokio::test]
async fn a_rule_gets_a_default_daily_cap_and_uncapped_must_be_asked_for() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(60).await;
    let path = format!("/v1/accounts/{account}/topup-rules");
    let made = rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 50, "method": "fixed", "tokens": 30}),
    )
    .await;
    assert_eq!(made["max_tokens_per_day"], json!(300), "{made}");
    assert_eq!(made["max_tokens_per_month"], Value::Null, "{made}");
    let rule_path = format!("{path}/{}", made["rule_id"].as_str().expect("an id"));

    let before = call(&app, "GET", &rule_path, None).await.1;
    let (status, problem) = call(
        &app,
        "PATCH",
        &rule_path,
        Some(json!({"max_tokens_per_day": null})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("allow_uncapped")),
        "{problem}"
    );
    assert_eq!(call(&app, "GET", &rule_path, None).await.1, before);

    let (status, changed) = call(
        &app,
        "PATCH",
        &rule_path,
        Some(json!({"max_tokens_per_day": null, "allow_uncapped": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["max_tokens_per_day"], Value::Null, "{changed}");
    // An uncapped rule stays so through other changes.
    let (status, changed) = call(&app, "PATCH", &rule_path, Some(json!({"tokens": 40}))).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["max_tokens_per_day"], Value::Null, "{changed}");

    // A schedule's default cap too; a target rule's is ten targets.
    let (status, target) = call(
        &app,
        "POST",
        &path,
        Some(
            json!({"trigger": "schedule", "period": "daily", "method": "target",
                    "target_tokens": 70}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{target}");
    assert_eq!(target["max_tokens_per_day"], json!(700), "{target}");
}
