//! Rollover (docs/topups.md, "Rollover"): a schedule rule's `rollover`
//! carries what its lapsing grant did not use, up to `max_tokens`, into a
//! new grant. A model over months of random spending (and reservations
//! held across the period's end) gives each period's carry as
//! min(unused, max_tokens); the books' identity holds throughout,
//! reconciliation's `rolled_over` is the model's sum, and each rollover's
//! `grant.rolled_over` comes once. Two real service processes, a lapse
//! whose transaction dies before it commits and a SIGKILLed, restarted
//! replica still carry each grant exactly once. Invalid rollovers are
//! refused with 400 `invalid_request`.
//!
//! The periods are the schedule's injected clock (`run_schedules`, months
//! in the future, so the reaper's own clock never fires them); a period's
//! end comes by moving its grants' `expires_at` to now, as
//! tests/api/grant_expiry.rs does (the engine decides by it against the
//! clock, so this is the same as waiting).

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Months, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use proptest::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::reaper::{run_pass, ReaperSettings};
use token_billing::domain::reconciliation::reconcile;
use token_billing::domain::topups::run_schedules;

use crate::crash::{post, start_service_with};
use crate::helpers::{
    assert_account_invariants, events_of, json_rows, problem, FakeProvider, TestApp, TestDatabase,
    ADMIN_KEY,
};
use crate::topups::{call, count, rule};

const REAPER: ReaperSettings = ReaperSettings {
    batch: 100,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 0,
};

/// Each period's allowance.
const ALLOWANCE: i64 = 100;

/// One period of the model: the share of what is available that is spent
/// (reserved and committed), the share of the rest held by a reservation
/// across the period's end (released after it), and whether the lapse is
/// written by the reaper or by the next spend.
#[derive(Clone, Debug)]
struct Month {
    spend_percent: i64,
    hold_percent: i64,
    lapse_by_reaper: bool,
}

fn month() -> impl Strategy<Value = Month> {
    (
        prop_oneof![1 => Just(0_i64), 1 => Just(100_i64), 4 => 0_i64..=100],
        prop_oneof![2 => Just(0_i64), 1 => 1_i64..=50],
        any::<bool>(),
    )
        .prop_map(|(spend_percent, hold_percent, lapse_by_reaper)| Month {
            spend_percent,
            hold_percent,
            lapse_by_reaper,
        })
}

/// The model's tokens: the carried grant of the last period (it lapses in
/// this one, after the spending: `P20D`) or, without an expiry, the pool of
/// every carried grant (never lapses, drawn after the allowance).
struct Model {
    expiring: bool,
    max_tokens: i64,
    carried: i64,
}

/// What one period does, in the model: (unused tokens of the allowance at
/// its lapse, tokens carried, available after the lapse).
impl Model {
    fn period(&mut self, spent: i64, held: i64) -> (i64, i64, i64) {
        // The draw order: the soonest expiry first — last period's carried
        // grant (it lapses within 20 days) before the allowance (at the
        // period's end); a carried grant that never lapses comes last.
        let drawn_from_allowance = |tokens: i64, before: i64| {
            if self.expiring {
                (tokens + before - self.carried).clamp(0, ALLOWANCE)
                    - (before - self.carried).clamp(0, ALLOWANCE)
            } else {
                (tokens + before).min(ALLOWANCE) - before.min(ALLOWANCE)
            }
        };
        let spent_allowance = drawn_from_allowance(spent, 0);
        let held_allowance = drawn_from_allowance(held, spent);
        let unused = ALLOWANCE - spent_allowance - held_allowance;
        let carry = unused.min(self.max_tokens);
        self.carried = if self.expiring {
            carry
        } else {
            // What the spending took from the pool (held tokens come back
            // to it: its grants never lapse), and the new carried grant.
            self.carried - (spent - spent_allowance) + carry
        };
        (unused, carry, self.carried)
    }
}

async fn reserve(app: &TestApp, account: Uuid, key: &str, amount: i64) -> Uuid {
    let response = app.reserve(account, key, Uuid::new_v4(), amount).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    body["reservation_id"]
        .as_str()
        .expect("an id")
        .parse()
        .expect("a uuid")
}

async fn settle(app: &TestApp, account: Uuid, key: &str, id: Uuid, verb: &str) {
    let response = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/{verb}"),
            key,
            &json!({}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// The grant the rule made last.
fn allowance_of(conn: &mut PgConnection, rule: Uuid) -> Uuid {
    let rows = json_rows(
        conn,
        "SELECT to_jsonb(f.credit_id) AS row FROM topup_firings f \
         WHERE f.rule_id = $1 AND f.outcome = 'granted' ORDER BY f.period_start DESC LIMIT 1",
        rule,
    );
    rows[0].as_str().expect("granted").parse().expect("a uuid")
}

/// The grant carried from `grant`: (amount, created_at, expires_at).
fn carried_from(conn: &mut PgConnection, account: Uuid, grant: Uuid) -> Vec<Value> {
    json_rows(
        conn,
        &format!(
            "SELECT jsonb_build_object('amount', amount, 'created_at', created_at, \
                    'expires_at', expires_at, 'rule', topup_rule_id) AS row \
             FROM credit_grants WHERE account_id = $1 AND rolled_over_from = '{grant}'"
        ),
        account,
    )
}

fn age_grants(conn: &mut PgConnection, account: Uuid) {
    diesel::sql_query(
        "UPDATE credit_grants SET expires_at = clock_timestamp() \
         WHERE account_id = $1 AND expired_at IS NULL AND expires_at IS NOT NULL",
    )
    .bind::<SqlUuid, _>(account)
    .execute(conn)
    .expect("the period ends");
}

/// Months of random spending against the model: each period carries
/// min(unused, max_tokens); the books balance after every step; the
/// events and the reconciliation agree with the model.
#[test]
fn each_period_carries_min_of_unused_and_max_tokens_over_months_of_random_spending() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // The background reaper never runs during the test (once a year):
    // the test runs its passes itself.
    let app = runtime.block_on(TestApp::spawn_with_flags(&[
        "--reaper-schedule",
        "0 0 0 1 1 *",
    ]));
    let mut runner = proptest::test_runner::TestRunner::new(crate::helpers::property_config(12));
    runner
        .run(
            &(
                1_i64..=130,
                any::<bool>(),
                proptest::collection::vec(month(), 2..8),
            ),
            |(max_tokens, expiring, months)| {
                runtime.block_on(async {
                    let started = Utc::now() - Duration::seconds(1);
                    // Earlier cases' rules never fire again (a failing case
                    // stops before it deletes its own).
                    diesel::sql_query("UPDATE topup_rules SET enabled = false")
                        .execute(&mut app.conn())
                        .expect("earlier rules stopped");
                    let account = app.funded_account(0).await;
                    let key = app.kiosk_key(account).await;
                    let mut rollover = json!({"max_tokens": max_tokens});
                    if expiring {
                        rollover["expires_after"] = json!("P20D");
                    }
                    let made = rule(
                        &app,
                        account,
                        json!({"trigger": "schedule", "period": "monthly", "anchor_day": 1,
                               "method": "fixed", "tokens": ALLOWANCE,
                               "expires_at_period_end": true, "rollover": rollover,
                               "allow_uncapped": true}),
                    )
                    .await;
                    prop_assert_eq!(&made["rollover"]["max_tokens"], &json!(max_tokens));
                    let rule_id: Uuid = made["rule_id"]
                        .as_str()
                        .expect("an id")
                        .parse()
                        .expect("a uuid");
                    let mut model = Model {
                        expiring,
                        max_tokens,
                        carried: 0,
                    };
                    let mut conn = app.conn();
                    // Months 40 days and more ahead: the allowance lapses
                    // after every carried grant of 20 days.
                    let base = Utc::now() + Duration::days(40);
                    let mut carries = Vec::new();
                    let mut lapsed_by_spend: Option<(Uuid, i64)> = None;
                    for (index, month) in months.iter().enumerate() {
                        let at = base + Months::new(u32::try_from(index).expect("few"));
                        let (scheduled, _, credited) =
                            run_schedules(&mut conn, at, 100).expect("the period fires");
                        prop_assert!(scheduled >= 1);
                        prop_assert_eq!(credited, ALLOWANCE);
                        let grant = allowance_of(&mut conn, rule_id);
                        let available = ALLOWANCE + model.carried;
                        let spent = available * month.spend_percent / 100;
                        let held = (available - spent) * month.hold_percent / 100;
                        if spent > 0 {
                            let id = reserve(&app, account, &key, spent).await;
                            settle(&app, account, &key, id, "commit").await;
                        }
                        if let Some((previous, carry)) = lapsed_by_spend.take() {
                            // The spend (or the reaper, when there was none)
                            // wrote last period's lapse.
                            if spent == 0 {
                                run_pass(&mut conn, &REAPER, None).expect("pass");
                            }
                            let carried = carried_from(&mut conn, account, previous);
                            prop_assert_eq!(carried.len(), usize::from(carry > 0));
                            if carry > 0 {
                                prop_assert_eq!(&carried[0]["amount"], &json!(carry));
                            }
                        }
                        let hold = if held > 0 {
                            Some(reserve(&app, account, &key, held).await)
                        } else {
                            None
                        };
                        let (unused, carry, after) = model.period(spent, held);
                        age_grants(&mut conn, account);
                        if month.lapse_by_reaper || index + 1 == months.len() {
                            let pass = run_pass(&mut conn, &REAPER, None).expect("pass");
                            prop_assert!(pass.grants_expired >= 1);
                        } else {
                            lapsed_by_spend = Some((grant, carry));
                        }
                        if let Some(id) = hold {
                            settle(&app, account, &key, id, "release").await;
                        }
                        if lapsed_by_spend.is_none() {
                            let carried = carried_from(&mut conn, account, grant);
                            prop_assert_eq!(carried.len(), usize::from(carry > 0));
                            if let Some(carried) = carried.first() {
                                prop_assert_eq!(&carried["amount"], &json!(carry));
                                prop_assert_eq!(&carried["rule"], &json!(rule_id));
                                let created: DateTime<Utc> =
                                    serde_json::from_value(carried["created_at"].clone())
                                        .expect("a time");
                                let expires: Option<DateTime<Utc>> =
                                    serde_json::from_value(carried["expires_at"].clone())
                                        .expect("a time");
                                prop_assert_eq!(
                                    expires,
                                    expiring.then(|| created + Duration::days(20))
                                );
                            }
                            prop_assert_eq!(app.assert_invariants(account).available, after);
                        }
                        app.assert_invariants(account);
                        carries.push((grant, unused, carry));
                    }
                    // Each rollover's event once, as the model says.
                    let events = events_of(&mut conn, account, "grant.rolled_over");
                    let expected: Vec<Value> = carries
                        .iter()
                        .filter(|(_, _, carry)| *carry > 0)
                        .map(|(grant, unused, carry)| {
                            json!({"grant_id": grant, "unused": unused, "tokens": carry,
                                   "max_tokens": max_tokens})
                        })
                        .collect();
                    let seen: Vec<Value> = events
                        .iter()
                        .map(|event| {
                            json!({"grant_id": event["grant_id"], "unused": event["unused"],
                                   "tokens": event["tokens"],
                                   "max_tokens": event["max_tokens"]})
                        })
                        .collect();
                    prop_assert_eq!(seen, expected);
                    // The books: the identity, and the reconciliation's
                    // rolled_over the model's sum (its roll-forward ties out).
                    let balances = app.assert_invariants(account);
                    let total: i64 = carries.iter().map(|(_, _, carry)| carry).sum();
                    let report = reconcile(&mut conn, started, Utc::now(), Some(account))
                        .expect("the report");
                    prop_assert_eq!(report.status, "ok", "{:?}", report.discrepancies);
                    let line = &report.accounts[0];
                    prop_assert_eq!(line.rolled_over, total);
                    prop_assert_eq!(report.totals.rolled_over, total);
                    let periods = i64::try_from(months.len()).expect("few");
                    prop_assert_eq!(line.credited_by_rules, ALLOWANCE * periods);
                    prop_assert_eq!(line.credited, ALLOWANCE * periods + total);
                    prop_assert_eq!(line.closing, balances.available);
                    // Stop the rule: later cases' clocks never fire it.
                    let (status, _) = call(
                        &app,
                        "DELETE",
                        &format!("/v1/accounts/{account}/topup-rules/{rule_id}"),
                        None,
                    )
                    .await;
                    prop_assert_eq!(status, StatusCode::NO_CONTENT);
                    Ok(())
                })
            },
        )
        .expect("rollover follows its model");
}

/// Exactly once: two real service processes, their reapers each second,
/// kiosks spending on both as the period ends, a lapse whose transaction
/// dies before it commits, and one replica SIGKILLed and started again.
/// Each account's allowance is carried once: one carried grant of
/// min(unused, max_tokens), one `grant.rolled_over`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_rolls_over_once_across_two_replicas_a_dead_lapse_and_a_restart() {
    const ACCOUNTS: usize = 6;
    let provider = FakeProvider::start(0).await;
    let database = TestDatabase::create();
    let env = [
        ("WORKER_CONCURRENCY", "0"),
        ("REAPER_SCHEDULE", "* * * * * *"),
    ];
    let first = start_service_with(&database.url, &provider.url, &env).await;
    let mut second = start_service_with(&database.url, &provider.url, &env).await;
    let client = reqwest::Client::new();
    let mut kiosks = Vec::new();
    for index in 0..ACCOUNTS {
        let (account, key) = crate::crash::funded_kiosk(
            &client,
            &first.base,
            json!({"name": format!("booth {index}")}),
            json!({"amount": 1, "external_ref": format!("seed-{index}")}),
        )
        .await;
        let account: Uuid = account.parse().expect("a uuid");
        post(
            &client,
            format!("{}/v1/accounts/{account}/topup-rules", first.base),
            json!({"trigger": "schedule", "period": "monthly", "anchor_day": 1,
                   "method": "fixed", "tokens": 100, "expires_at_period_end": true,
                   "rollover": {"max_tokens": 30, "expires_after": "P7D"},
                   "allow_uncapped": true}),
        )
        .await;
        kiosks.push((account, key));
    }
    let mut conn = database.connect();
    // The reapers fire this month's allowance.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(30);
    while count(
        &mut conn,
        "SELECT count(*) AS n FROM credit_grants WHERE topup_rule_id IS NOT NULL \
         AND $1::uuid IS NOT NULL",
        Uuid::nil(),
    ) < i64::try_from(ACCOUNTS).expect("few")
    {
        assert!(std::time::Instant::now() < deadline, "the schedules fired");
        tokio::time::sleep(StdDuration::from_millis(200)).await;
    }
    // Spending on both replicas: account i spends 10 × i of its 101 (the
    // seed credit never lapses: it is drawn after the allowance).
    let spend = |base: String, account: Uuid, key: String, amount: i64| {
        let client = client.clone();
        async move {
            let response = client
                .post(format!("{base}/v1/accounts/{account}/reservations"))
                .bearer_auth(&key)
                .json(&json!({"request_id": Uuid::new_v4(), "amount": amount}))
                .send()
                .await
                .expect("sent");
            assert_eq!(response.status(), StatusCode::CREATED);
            let id = response.json::<Value>().await.expect("json")["reservation_id"]
                .as_str()
                .expect("an id")
                .to_owned();
            let response = client
                .post(format!(
                    "{base}/v1/accounts/{account}/reservations/{id}/commit"
                ))
                .bearer_auth(&key)
                .json(&json!({}))
                .send()
                .await
                .expect("sent");
            assert_eq!(response.status(), StatusCode::OK);
        }
    };
    for (index, (account, key)) in kiosks.iter().enumerate() {
        let amount = i64::try_from(index).expect("few") * 10;
        if amount > 0 {
            let base = if index % 2 == 0 {
                &first.base
            } else {
                &second.base
            };
            spend(base.clone(), *account, key.clone(), amount).await;
        }
    }
    // The period ends. A lapse begins and dies before it commits (its
    // connection closes mid-transaction, as a killed replica's does).
    for (account, _) in &kiosks {
        age_grants(&mut conn, *account);
    }
    {
        let mut dying = database.connect();
        dying
            .batch_execute("BEGIN; SELECT engine_expire_grants(100);")
            .expect("a lapse in flight");
        drop(dying);
    }
    // Both replicas race to write it (their reapers, and a kiosk's spend
    // on each), and the second is SIGKILLed in the middle and restarted.
    let mut racing = Vec::new();
    for (index, (account, key)) in kiosks.iter().enumerate() {
        let base = if index % 2 == 0 {
            &second.base
        } else {
            &first.base
        };
        racing.push(tokio::spawn(spend(base.clone(), *account, key.clone(), 1)));
    }
    tokio::time::sleep(StdDuration::from_millis(300)).await;
    second.child.kill().expect("SIGKILL");
    let _ = second.child.wait();
    for race in racing {
        // A spend on the killed replica may have died with it.
        let _ = race.await;
    }
    let _restarted = start_service_with(&database.url, &provider.url, &env).await;
    let deadline = std::time::Instant::now() + StdDuration::from_secs(30);
    loop {
        let due = count(
            &mut conn,
            "SELECT count(*) AS n FROM credit_grants g WHERE g.expired_at IS NULL \
             AND g.expires_at <= now() AND g.remaining > 0 AND $1::uuid IS NOT NULL",
            Uuid::nil(),
        );
        if due == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lapses were written"
        );
        tokio::time::sleep(StdDuration::from_millis(200)).await;
    }
    for (index, (account, _)) in kiosks.iter().enumerate() {
        let unused = 100 - i64::try_from(index).expect("few") * 10;
        let events = events_of(&mut conn, *account, "grant.rolled_over");
        assert_eq!(events.len(), 1, "account {index}: {events:?}");
        assert_eq!(events[0]["unused"], json!(unused));
        assert_eq!(events[0]["tokens"], json!(unused.min(30)));
        let grant: Uuid = serde_json::from_value(events[0]["grant_id"].clone()).expect("id");
        let carried = carried_from(&mut conn, *account, grant);
        assert_eq!(carried.len(), 1);
        assert_eq!(carried[0]["amount"], json!(unused.min(30)));
        assert_eq!(
            count(
                &mut conn,
                "SELECT count(*) AS n FROM credit_grants \
                 WHERE account_id = $1 AND rolled_over_from IS NOT NULL",
                *account,
            ),
            1
        );
        let balances = assert_account_invariants(&mut conn, *account);
        // The seed token, the carried tokens, less what the racing spends
        // took (each 1, if it landed).
        let raced = count(
            &mut conn,
            "SELECT count(*) AS n FROM ledger_entries WHERE account_id = $1 AND kind = 'commit' \
             AND amount = 1",
            *account,
        );
        assert_eq!(
            balances.available + balances.reserved,
            1 + unused.min(30) - raced
        );
    }
    drop(first);
}

/// A rollover belongs to a schedule rule in mode grant whose grants lapse;
/// its bounds are checked; the rule shows it, and a PATCH may remove it.
#[tokio::test]
async fn rollover_is_validated_and_shown() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(0).await;
    let schedule = json!({"trigger": "schedule", "period": "daily", "method": "fixed",
                          "tokens": 10, "expires_at_period_end": true});
    let with = |changes: Value| {
        let mut body = schedule.clone();
        for (name, value) in changes.as_object().expect("an object") {
            if value.is_null() {
                body.as_object_mut().expect("an object").remove(name);
            } else {
                body[name] = value.clone();
            }
        }
        body
    };
    for (body, says) in [
        (
            with(json!({"rollover": {"max_tokens": 0}})),
            "rollover.max_tokens must be between 1 and 1000000000",
        ),
        (
            with(json!({"rollover": {"max_tokens": 1_000_000_001_i64}})),
            "rollover.max_tokens must be between 1 and 1000000000",
        ),
        (
            with(json!({"rollover": {"max_tokens": 5, "expires_after": "P1M"}})),
            "rollover.expires_after must be an ISO 8601 duration",
        ),
        (
            with(json!({"rollover": {"max_tokens": 5, "expires_after": "PT30S"}})),
            "rollover.expires_after must be between PT1M and P3650D",
        ),
        (
            with(json!({"rollover": {"max_tokens": 5}, "expires_at_period_end": null})),
            "rollover needs grants that lapse",
        ),
        (
            with(
                json!({"rollover": {"max_tokens": 5}, "expires_at_period_end": null,
                        "mode": "request"}),
            ),
            "rollover applies to a schedule rule in mode grant only",
        ),
        (
            json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed",
                   "tokens": 10, "expires_after": "P1D", "rollover": {"max_tokens": 5}}),
            "rollover applies to a schedule rule in mode grant only",
        ),
    ] {
        let response = app
            .post(
                &format!("/v1/accounts/{account}/topup-rules"),
                ADMIN_KEY,
                &body,
            )
            .await;
        let (status, problem) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(problem["code"], "invalid_request");
        let detail = problem["detail"].as_str().expect("a detail");
        assert!(detail.contains(says), "{body}: {detail}");
    }
    // An unknown member of the rollover is refused too.
    let response = app
        .post(
            &format!("/v1/accounts/{account}/topup-rules"),
            ADMIN_KEY,
            &with(json!({"rollover": {"max_tokens": 5, "max": 3}})),
        )
        .await;
    assert_eq!(problem(response).await.0, StatusCode::BAD_REQUEST);

    // Valid: shown as given (expires_after as the API writes durations).
    let made = rule(
        &app,
        account,
        with(json!({"rollover": {"max_tokens": 25, "expires_after": "P1W"}})),
    )
    .await;
    assert_eq!(
        made["rollover"],
        json!({"max_tokens": 25, "expires_after": "P7D"})
    );
    let path = crate::topups::rule_path_of(account, &made);
    // A PATCH that keeps it keeps it; removing the expiry the rollover
    // needs is refused; null removes it.
    let (status, kept) = call(&app, "PATCH", &path, Some(json!({"tokens": 12}))).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(kept["rollover"], made["rollover"]);
    let (status, refused) = call(
        &app,
        "PATCH",
        &path,
        Some(json!({"expires_at_period_end": false})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, removed) = call(&app, "PATCH", &path, Some(json!({"rollover": null}))).await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["rollover"], Value::Null);
}

/// A rollover is not use: the threshold rule's count of its tokens that
/// nothing has used yet (`unconsumed_tokens`) stays as it was across a
/// lapse that carries, so the rule does not fire again sooner (no firing
/// without consumption). An API credit, which is use, lowers it.
#[tokio::test]
async fn a_rollover_is_not_use_against_a_threshold_rule() {
    let app = TestApp::spawn_with_flags(&["--reaper-schedule", "0 0 0 1 1 *"]).await;
    let account = app.funded_account(200).await;
    let key = app.kiosk_key(account).await;
    let made = rule(
        &app,
        account,
        json!({"trigger": "schedule", "period": "monthly", "anchor_day": 1,
               "method": "fixed", "tokens": ALLOWANCE, "expires_at_period_end": true,
               "rollover": {"max_tokens": 30}, "allow_uncapped": true}),
    )
    .await;
    let mut conn = app.conn();
    let (scheduled, _, _) =
        run_schedules(&mut conn, Utc::now() + Duration::days(40), 100).expect("the period fires");
    assert!(scheduled >= 1);
    let allowance = allowance_of(
        &mut conn,
        made["rule_id"]
            .as_str()
            .expect("an id")
            .parse()
            .expect("a uuid"),
    );
    // 300 available; the threshold rule fires when a spend goes below 250.
    rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 250, "method": "fixed",
               "tokens": 100, "allow_uncapped": true}),
    )
    .await;
    let id = reserve(&app, account, &key, 60).await;
    settle(&app, account, &key, id, "commit").await;
    let unconsumed = |conn: &mut PgConnection| {
        count(
            conn,
            "SELECT topup_unconsumed AS n FROM accounts WHERE id = $1",
            account,
        )
    };
    let before = unconsumed(&mut conn);
    assert!(before >= 30, "the threshold rule fired: {before}");
    // The allowance (drawn first: it lapses soonest) lapses holding 40 and
    // carries 30.
    age_grants(&mut conn, account);
    run_pass(&mut conn, &REAPER, None).expect("pass");
    let carried = carried_from(&mut conn, account, allowance);
    assert_eq!(carried.len(), 1, "one carry");
    assert_eq!(carried[0]["amount"], json!(30));
    assert_eq!(unconsumed(&mut conn), before, "a rollover is not use");
    // The grants API names the carried grant's origin.
    let (status, page) = call(&app, "GET", &format!("/v1/accounts/{account}/grants"), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let shown: Vec<(Value, Value)> = page["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .map(|grant| (grant["rolled_over_from"].clone(), grant["amount"].clone()))
        .filter(|(from, _)| !from.is_null())
        .collect();
    assert_eq!(shown, vec![(json!(allowance), json!(30))]);
    // A credit from elsewhere is.
    let response = app
        .post(
            &format!("/v1/accounts/{account}/credits"),
            ADMIN_KEY,
            &json!({"amount": 10, "external_ref": format!("paid-{account}")}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(unconsumed(&mut conn), before - 10);
    assert_account_invariants(&mut conn, account);
}
