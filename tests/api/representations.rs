//! One representation per resource: every event type's `data` shows its
//! resource exactly as the API does (the same serializer, the engine's
//! `engine_*_json`), with ids named the same (`entry_id`, `credit_id`,
//! `job_id`, …) and every time in `Z` with six fractional digits. Each event
//! is compared, field for field, with the resource read from the API after
//! it: the ledger entry it names, the credit or adjustment as its POST
//! answered, the reservation, the grant and the job as their GETs show
//! them.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{TestApp, ADMIN_KEY};

const SETTINGS: ReaperSettings = ReaperSettings {
    batch: 500,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 72,
};

async fn get(app: &TestApp, path: &str) -> Value {
    let response = app.get(path, ADMIN_KEY).await;
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    response.json().await.expect("json")
}

async fn post(app: &TestApp, path: &str, body: Value) -> (StatusCode, Value) {
    let response = app.post(path, ADMIN_KEY, &body).await;
    let status = response.status();
    (status, response.json().await.expect("json"))
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("a string: {value}"))
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn is_time_in_z_with_microseconds(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 27
        && bytes.iter().enumerate().all(|(i, byte)| match i {
            4 | 7 => *byte == b'-',
            10 => *byte == b'T',
            13 | 16 => *byte == b':',
            19 => *byte == b'.',
            26 => *byte == b'Z',
            _ => byte.is_ascii_digit(),
        })
}

/// Every member named `…_at` (a time) is null or in `Z` with microseconds.
fn assert_times(what: &str, value: &Value) {
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                if name.ends_with("_at") && !member.is_null() {
                    assert!(
                        member.as_str().is_some_and(is_time_in_z_with_microseconds),
                        "{what}: {name} = {member}"
                    );
                }
                assert_times(what, member);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| assert_times(what, item)),
        _ => {}
    }
}

fn expire_reservation(app: &TestApp, reservation: Uuid) {
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<SqlUuid, _>(reservation)
    .execute(&mut app.conn())
    .expect("expired");
}

fn lapse_grant(app: &TestApp, grant: Uuid) {
    diesel::sql_query("UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = $1")
        .bind::<SqlUuid, _>(grant)
        .execute(&mut app.conn())
        .expect("lapsed");
}

async fn grant_shown(app: &TestApp, account: Uuid, grant: &Value) -> Value {
    get(app, &format!("/v1/accounts/{account}/grants?limit=1000")).await["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .find(|shown| shown["grant_id"] == *grant)
        .cloned()
        .unwrap_or_else(|| panic!("grant {grant}"))
}

#[tokio::test]
async fn every_event_shows_its_resource_as_the_api_does() {
    let app = TestApp::spawn().await;
    let account = app
        .create_account_from(&json!({"name": "one vocabulary", "low_balance_threshold": 5}))
        .await;
    let base = format!("/v1/accounts/{account}");

    // A credit whose grant lapses, its expiry a bare date (its midnight
    // UTC), and one that never does.
    let day = (Utc::now() + chrono::Duration::days(2)).date_naive();
    let lapsing_body = json!({"amount": 3, "external_ref": "lapsing",
                              "expires_at": day.format("%Y-%m-%d").to_string()});
    let (status, lapsing) = post(&app, &format!("{base}/credits"), lapsing_body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{lapsing}");
    assert_eq!(
        lapsing["expires_at"],
        format!("{}T00:00:00.000000Z", day.format("%Y-%m-%d"))
    );
    let (status, replay) = post(&app, &format!("{base}/credits"), lapsing_body).await;
    assert_eq!(
        (status, &replay),
        (StatusCode::OK, &lapsing),
        "a replay answers alike"
    );
    let (_, lasting) = post(
        &app,
        &format!("{base}/credits"),
        json!({"amount": 10, "external_ref": "lasting"}),
    )
    .await;
    let mut answered: HashMap<String, Value> = HashMap::new();
    answered.insert(text(&lapsing["credit_id"]).to_owned(), lapsing.clone());
    answered.insert(text(&lasting["credit_id"]).to_owned(), lasting.clone());

    // grant.expiring, read back at once.
    assert_eq!(
        run_pass(&mut app.conn(), &SETTINGS, None)
            .expect("pass")
            .grants_noticed,
        1
    );
    let expiring_grant = grant_shown(&app, account, &lapsing["grant_id"]).await;

    for (amount, reference) in [(2, "goodwill"), (-1, "correction")] {
        let (status, adjusted) = post(
            &app,
            &format!("{base}/adjustments"),
            json!({"amount": amount, "reason": "representations", "external_ref": reference}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{adjusted}");
        answered.insert(text(&adjusted["adjustment_id"]).to_owned(), adjusted);
    }

    // A reservation: its POST answer (the engine's row) reads as its GET
    // (the engine's view); then it expires.
    let response = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 4).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let reserved: Value = response.json().await.expect("json");
    let reservation_id: Uuid = text(&reserved["reservation_id"]).parse().expect("uuid");
    assert_eq!(
        get(&app, &format!("{base}/reservations/{reservation_id}")).await,
        reserved,
        "a reservation reads as it was answered"
    );
    assert_times("a reservation", &reserved);
    expire_reservation(&app, reservation_id);
    run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");

    // The lapsing grant lapses.
    lapse_grant(&app, text(&lapsing["grant_id"]).parse().expect("uuid"));
    run_pass(&mut app.conn(), &SETTINGS, None).expect("pass");

    // One job succeeds, one fails.
    let mut jobs = Vec::new();
    for params in [json!({}), json!({"simulate": {"outcome": "fail"}})] {
        let request_id = Uuid::new_v4();
        let response = app
            .create_job(account, ADMIN_KEY, request_id, &params)
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let job = app.wait_job(account, request_id, 10).await;
        assert!(
            ["succeeded", "failed"].contains(&text(&job["status"])),
            "{job}"
        );
        jobs.push(request_id);
    }

    // The rest goes: account.balance_depleted.
    let available = app.account(account).await["available"]
        .as_i64()
        .expect("available");
    let (status, emptied) = post(
        &app,
        &format!("{base}/adjustments"),
        json!({"amount": -available, "reason": "close", "external_ref": "close"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{emptied}");
    answered.insert(text(&emptied["adjustment_id"]).to_owned(), emptied);

    let wanted: BTreeSet<&str> = [
        "account.balance_depleted",
        "account.balance_low",
        "account.balance_recovered",
        "adjustment.created",
        "credit.created",
        "grant.expired",
        "grant.expiring",
        "job.failed",
        "job.succeeded",
        "reservation.expired",
    ]
    .into();
    let mut events = Vec::new();
    for _ in 0..250 {
        let page = get(&app, &format!("/v1/events?account_id={account}&limit=1000")).await;
        events = page["events"].as_array().expect("events").clone();
        let seen: BTreeSet<&str> = events.iter().map(|event| text(&event["type"])).collect();
        if wanted.is_subset(&seen) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen: BTreeSet<&str> = events.iter().map(|event| text(&event["type"])).collect();
    assert!(wanted.is_subset(&seen), "events: {seen:?}");

    let ledger = get(&app, &format!("{base}/ledger?limit=1000")).await;
    let entries: HashMap<i64, Value> = ledger["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| (entry["entry_id"].as_i64().expect("entry_id"), entry.clone()))
        .collect();
    assert_times("the ledger", &ledger);

    // Each event is what the document's schema of its type says (issue 59).
    let document = crate::openapi_types::document(&app).await;
    let event_schema = json!({"$ref": "#/components/schemas/EventView"});
    for event in &events {
        let kind = text(&event["type"]);
        let data = &event["data"];
        let broken = crate::openapi_types::violations(&document, &event_schema, event, kind);
        assert!(broken.is_empty(), "{kind} breaks its schema: {broken:#?}");
        assert_times(kind, event);
        if !data["entry"].is_null() {
            let id = data["entry"]["entry_id"]
                .as_i64()
                .unwrap_or_else(|| panic!("{kind}: entry without entry_id: {data}"));
            assert_eq!(data["entry"], entries[&id], "{kind}: its entry");
        }
        match kind {
            "credit.created" => {
                let credit = &data["credit"];
                assert_eq!(*credit, answered[text(&credit["credit_id"])], "{kind}");
                assert_eq!(credit["ledger_entry_id"], data["entry"]["entry_id"]);
            }
            "adjustment.created" => {
                let adjustment = &data["adjustment"];
                assert_eq!(
                    *adjustment,
                    answered[text(&adjustment["adjustment_id"])],
                    "{kind}"
                );
            }
            "reservation.expired" => {
                let id = text(&data["reservation"]["reservation_id"]);
                let shown = get(&app, &format!("{base}/reservations/{id}")).await;
                assert_eq!(data["reservation"], shown, "{kind}");
                assert_eq!(shown["state"], "expired");
            }
            "grant.expiring" => assert_eq!(data["grant"], expiring_grant, "{kind}"),
            "grant.expired" => {
                let shown = grant_shown(&app, account, &data["grant"]["grant_id"]).await;
                assert_eq!(data["grant"], shown, "{kind}");
            }
            "job.succeeded" | "job.failed" => {
                let job = &data["job"];
                let shown = get(&app, &format!("{base}/jobs/{}", text(&job["request_id"]))).await;
                assert_eq!(*job, shown, "{kind}");
                assert_eq!(format!("job.{}", text(&shown["status"])), kind);
                for private in ["id", "lease_owner", "lease_token", "lease_expires_at"] {
                    assert!(job.get(private).is_none(), "{kind} shows {private}: {job}");
                }
            }
            _ => {}
        }
    }
    for request_id in jobs {
        assert_times(
            "a job",
            &get(&app, &format!("{base}/jobs/{request_id}")).await,
        );
    }
}
