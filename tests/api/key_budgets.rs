//! Key budgets: a kiosk key's spending limit per period, decided by the
//! engine in the reserve's transaction (docs/fleet.md, "Key budgets").

use std::sync::Arc;

use chrono::{DateTime, Datelike, Duration, FixedOffset, NaiveTime, TimeZone, Utc};
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{events_of, TestApp, ADMIN_KEY};

/// A kiosk key on `account` with `budget` (the key's secret and id).
async fn budgeted_key(app: &TestApp, account: Uuid, budget: Value) -> (String, Uuid) {
    let response = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "booth 7", "budget": budget}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    (
        body["key"].as_str().expect("key").to_owned(),
        body["key_id"].as_str().expect("id").parse().expect("uuid"),
    )
}

/// The key's budget as the key itself reads it.
async fn budget_of(app: &TestApp, key: &str) -> Value {
    let me: Value = app.get("/v1/me", key).await.json().await.expect("json");
    me["budget"].clone()
}

/// Reserves `amount`: the reservation's id, or the problem's code.
async fn reserve(app: &TestApp, account: Uuid, key: &str, amount: i64) -> Result<String, Value> {
    let response = app.reserve(account, key, Uuid::new_v4(), amount).await;
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    if status == StatusCode::CREATED {
        Ok(body["reservation_id"].as_str().expect("id").to_owned())
    } else {
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
        Err(body)
    }
}

async fn settle(app: &TestApp, account: Uuid, key: &str, id: &str, action: &str, body: Value) {
    let response = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/{action}"),
            key,
            &body,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{action}");
}

/// Forty reserves of one token at once on one key with a budget of ten,
/// spread over two replicas: exactly ten are held, thirty refused with
/// key_budget_exhausted, and the account holds ten. The budget's events
/// come once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_reserves_on_two_replicas_hold_exactly_the_budget() {
    let first = TestApp::spawn().await;
    let second = first.spawn_replica(|_| {}).await;
    let account = first.funded_account(1_000).await;
    let (key, _) = budgeted_key(
        &first,
        account,
        json!({"budget_tokens": 10, "budget_period": "total"}),
    )
    .await;
    let replicas = Arc::new([first, second]);
    let mut kiosks = Vec::new();
    for kiosk in 0..40 {
        let replicas = Arc::clone(&replicas);
        let key = key.clone();
        kiosks.push(tokio::spawn(async move {
            reserve(&replicas[kiosk % 2], account, &key, 1).await
        }));
    }
    let mut held = 0;
    let mut refused = 0;
    for kiosk in kiosks {
        match kiosk.await.expect("a kiosk") {
            Ok(_) => held += 1,
            Err(problem) => {
                assert_eq!(problem["code"], "key_budget_exhausted", "{problem}");
                assert_eq!(problem["remaining"], 0, "{problem}");
                assert_eq!(problem["resets_at"], Value::Null, "a total never resets");
                refused += 1;
            }
        }
    }
    assert_eq!((held, refused), (10, 30));
    let app = &replicas[0];
    // The refusal is the document's 402.
    let problem = reserve(app, account, &key, 1).await.expect_err("none left");
    let doc = crate::openapi_types::document(app).await;
    let schema = json!({"$ref": "#/components/schemas/Problem402"});
    let broken = crate::openapi_types::violations(&doc, &schema, &problem, "402");
    assert!(broken.is_empty(), "{broken:?}");
    assert_eq!(app.account(account).await["reserved"], 10);
    let budget = budget_of(app, &key).await;
    assert_eq!(
        (budget["spent"].clone(), budget["remaining"].clone()),
        (json!(10), json!(0))
    );
    let mut conn = app.conn();
    let low = events_of(&mut conn, account, "key.budget_low");
    assert_eq!(low.len(), 1);
    crate::openapi_types::assert_data_conforms(app, "key.budget_low", &low[0]).await;
    let exhausted = events_of(&mut conn, account, "key.budget_exhausted");
    assert_eq!(exhausted.len(), 1);
    crate::openapi_types::assert_data_conforms(app, "key.budget_exhausted", &exhausted[0]).await;
    assert_eq!(exhausted[0]["budget"]["spent"], 10, "{}", exhausted[0]);
    assert_eq!(exhausted[0]["label"], "booth 7");
    // Refusals are counted by reason, never by key.
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("token_billing_reservations_total{outcome=\"key_budget\"}"),
        "{metrics}"
    );
}

/// A release, an expiry and the rest of a partial commit give the unspent
/// part back; what was committed stays spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_reservation_did_not_use_goes_back_to_the_budget() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(1_000).await;
    let (key, _) = budgeted_key(
        &app,
        account,
        json!({"budget_tokens": 5, "budget_period": "day", "budget_time_zone": "Europe/Berlin"}),
    )
    .await;
    let three = reserve(&app, account, &key, 3).await.expect("3 of 5");
    settle(&app, account, &key, &three, "commit", json!({"amount": 1})).await;
    assert_eq!(
        budget_of(&app, &key).await["spent"],
        1,
        "a partial commit gives 2 back"
    );
    let four = reserve(&app, account, &key, 4)
        .await
        .expect("4 of the 4 left");
    let refused = reserve(&app, account, &key, 1)
        .await
        .expect_err("none left");
    assert_eq!(refused["remaining"], 0);
    settle(&app, account, &key, &four, "release", json!({})).await;
    assert_eq!(
        budget_of(&app, &key).await["spent"],
        1,
        "a release gives all back"
    );
    // An expiry: the reservation's hold ends, and a commit finds it expired.
    let two = reserve(&app, account, &key, 2)
        .await
        .expect("2 of the 4 left");
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<SqlUuid, _>(two.parse::<Uuid>().expect("uuid"))
    .execute(&mut app.conn())
    .expect("expire");
    let late = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{two}/commit"),
            &key,
            &json!({}),
        )
        .await;
    assert_eq!(late.status(), StatusCode::CONFLICT);
    assert_eq!(
        budget_of(&app, &key).await["spent"],
        1,
        "an expiry gives all back"
    );
    // A budget of another period counts anew: the same day keeps its count.
    let patched = app
        .patch(
            &format!("/v1/api-keys/{}", key_id_of(&app, &key).await),
            ADMIN_KEY,
            &json!({"budget": {"budget_tokens": 2, "budget_period": "day",
                               "budget_time_zone": "Europe/Berlin"}}),
        )
        .await;
    assert_eq!(patched.status(), StatusCode::OK);
    let patched: Value = patched.json().await.expect("json");
    assert_eq!(
        (
            patched["budget"]["spent"].clone(),
            patched["budget"]["remaining"].clone()
        ),
        (json!(1), json!(1))
    );
    reserve(&app, account, &key, 2)
        .await
        .expect_err("2 > the 1 left");
    reserve(&app, account, &key, 1).await.expect("the 1 left");
}

async fn key_id_of(app: &TestApp, key: &str) -> String {
    let me: Value = app.get("/v1/me", key).await.json().await.expect("json");
    me["key_id"].as_str().expect("id").to_owned()
}

/// The next midnight after `now` at the fixed offset `offset` (hours east
/// of UTC), computed here with chrono, not by the engine.
fn next_midnight(now: DateTime<Utc>, offset: i32) -> DateTime<Utc> {
    let zone = FixedOffset::east_opt(offset * 3600).expect("offset");
    let tomorrow = now.with_timezone(&zone).date_naive() + Duration::days(1);
    zone.from_local_datetime(&tomorrow.and_time(NaiveTime::MIN))
        .single()
        .expect("a midnight")
        .with_timezone(&Utc)
}

/// A day is a day of the budget's time zone: it resets at that zone's
/// midnight, and the next day's count starts from 0. A week starts on
/// Monday.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_period_resets_at_midnight_in_the_keys_time_zone() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(1_000).await;
    // Kiribati's Line Islands: UTC+14 all year (no daylight saving).
    let (key, key_id) = budgeted_key(
        &app,
        account,
        json!({"budget_tokens": 2, "budget_period": "day",
               "budget_time_zone": "Pacific/Kiritimati"}),
    )
    .await;
    reserve(&app, account, &key, 2).await.expect("2 of 2");
    let refused = reserve(&app, account, &key, 1)
        .await
        .expect_err("none left today");
    let resets_at: DateTime<Utc> = refused["resets_at"]
        .as_str()
        .expect("resets_at")
        .parse()
        .expect("an instant");
    assert_eq!(resets_at, next_midnight(Utc::now(), 14), "{refused}");
    // The day passes: the count was yesterday's, today's starts from 0.
    diesel::sql_query(
        "UPDATE api_keys SET budget_period_start = budget_period_start - interval '1 day' \
         WHERE id = $1",
    )
    .bind::<SqlUuid, _>(key_id)
    .execute(&mut app.conn())
    .expect("yesterday");
    assert_eq!(budget_of(&app, &key).await["spent"], 0);
    reserve(&app, account, &key, 2).await.expect("today's 2");
    // A week from Monday 00:00 in the zone.
    let (weekly, _) = budgeted_key(
        &app,
        account,
        json!({"budget_tokens": 1, "budget_period": "week",
               "budget_time_zone": "Pacific/Kiritimati"}),
    )
    .await;
    let resets: DateTime<Utc> = budget_of(&app, &weekly).await["resets_at"]
        .as_str()
        .expect("resets_at")
        .parse()
        .expect("an instant");
    let local = resets.with_timezone(&FixedOffset::east_opt(14 * 3600).expect("offset"));
    assert_eq!(
        (local.weekday(), local.time()),
        (chrono::Weekday::Mon, NaiveTime::MIN)
    );
    assert!(resets > Utc::now() && resets <= Utc::now() + Duration::days(7));
}

/// A budget is checked where it is set, belongs to a kiosk key only, and
/// only an admin sets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_is_checked_and_set_by_an_admin_only() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    for (budget, says) in [
        (
            json!({"budget_tokens": 0, "budget_period": "day"}),
            "budget_tokens",
        ),
        (
            json!({"budget_tokens": 5, "budget_period": "year"}),
            "budget_period",
        ),
        (
            json!({"budget_tokens": 5, "budget_period": "day", "budget_time_zone": "Mars/Olympus"}),
            "time zone",
        ),
        (
            json!({"budget_tokens": 5, "budget_period": "day", "budget_low_percent": 0}),
            "budget_low_percent",
        ),
    ] {
        let refused = app
            .post(
                &format!("/v1/accounts/{account}/api-keys"),
                ADMIN_KEY,
                &json!({"scope": "kiosk", "label": "booth", "budget": budget}),
            )
            .await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{budget}");
        let problem: Value = refused.json().await.expect("json");
        assert!(
            problem["detail"].as_str().expect("detail").contains(says),
            "{problem}"
        );
    }
    let (kiosk, kiosk_id) = budgeted_key(
        &app,
        account,
        json!({"budget_tokens": 5, "budget_period": "month"}),
    )
    .await;
    let path = format!("/v1/api-keys/{kiosk_id}");
    let body = json!({"budget": {"budget_tokens": 50, "budget_period": "month"}});
    assert_eq!(
        app.patch(&path, &kiosk, &body).await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.patch(&path, ADMIN_KEY, &json!({})).await.status(),
        StatusCode::BAD_REQUEST
    );
    let finance = app.finance_key().await;
    let finance_id = key_id_of(&app, &finance).await;
    let admin_budget = app
        .patch(&format!("/v1/api-keys/{finance_id}"), ADMIN_KEY, &body)
        .await;
    assert_eq!(admin_budget.status(), StatusCode::BAD_REQUEST);
    // Removed: the key spends without a limit again.
    let removed = app.patch(&path, ADMIN_KEY, &json!({"budget": null})).await;
    assert_eq!(removed.status(), StatusCode::OK);
    assert_eq!(budget_of(&app, &kiosk).await, Value::Null);
    reserve(&app, account, &kiosk, 10).await.expect("no limit");
    // The key list shows each key's budget.
    let listed: Value = app
        .get(&format!("/v1/api-keys?account_id={account}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(listed["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .all(|key| key["budget"].is_null()));
}

/// One batch releases two reservations of one key counted in two periods
/// (the key's previous day and today): only today's gives back, as a
/// release of each alone would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_gives_back_only_to_the_period_the_key_still_counts() {
    use token_billing::engine::types::{AccountId, ReservationId};
    use token_billing::engine::{apply, Authority, Op, Operation, Outcome};
    let app = TestApp::spawn().await;
    let account = app.funded_account(100).await;
    let (key, _) = budgeted_key(
        &app,
        account,
        json!({"budget_tokens": 50, "budget_period": "day"}),
    )
    .await;
    let yesterdays = reserve(&app, account, &key, 3).await.expect("3");
    let mut conn = app.conn();
    // The first was counted in the key's previous day: the count moved on.
    diesel::sql_query(
        "UPDATE reservations SET budget_period_start = budget_period_start - interval '1 day' \
         WHERE id = $1",
    )
    .bind::<SqlUuid, _>(yesterdays.parse::<Uuid>().expect("uuid"))
    .execute(&mut conn)
    .expect("yesterday's");
    let todays = reserve(&app, account, &key, 4).await.expect("4");
    assert_eq!(budget_of(&app, &key).await["spent"], 7);
    let release = |id: &str| Operation {
        account: AccountId(account),
        authority: Authority::Verified {
            actor: "test".into(),
        },
        op: Op::Release {
            reservation: ReservationId(id.parse().expect("uuid")),
        },
    };
    // Both orders: the earlier period first, then last.
    let answers = apply(&mut conn, &[release(&yesterdays), release(&todays)]).expect("batch");
    assert!(
        answers.iter().all(|a| a.outcome == Outcome::Released),
        "{answers:?}"
    );
    assert_eq!(
        budget_of(&app, &key).await["spent"],
        3,
        "only today's 4 back"
    );
    let (first, second) = (
        reserve(&app, account, &key, 5).await.expect("5"),
        reserve(&app, account, &key, 6).await.expect("6"),
    );
    diesel::sql_query(
        "UPDATE reservations SET budget_period_start = budget_period_start - interval '1 day' \
         WHERE id = $1",
    )
    .bind::<SqlUuid, _>(second.parse::<Uuid>().expect("uuid"))
    .execute(&mut conn)
    .expect("yesterday's");
    assert_eq!(budget_of(&app, &key).await["spent"], 14);
    let answers = apply(&mut conn, &[release(&first), release(&second)]).expect("batch");
    assert!(
        answers.iter().all(|a| a.outcome == Outcome::Released),
        "{answers:?}"
    );
    assert_eq!(
        budget_of(&app, &key).await["spent"],
        9,
        "only today's 5 back"
    );
}
