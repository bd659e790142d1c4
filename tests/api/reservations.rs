use chrono::{DateTime, Utc};
use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

fn reservation_path(account: Uuid, reservation: &Value, action: &str) -> String {
    let id = reservation["reservation_id"]
        .as_str()
        .expect("reservation id");
    if action.is_empty() {
        format!("/v1/accounts/{account}/reservations/{id}")
    } else {
        format!("/v1/accounts/{account}/reservations/{id}/{action}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_commit_and_replays() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let kiosk = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();

    let response = app.reserve(account, &kiosk, request_id, 2).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let reservation: Value = response.json().await.expect("json");
    assert_eq!(location, reservation_path(account, &reservation, ""));
    assert_eq!(
        (
            reservation["state"].as_str(),
            reservation["amount"].as_i64()
        ),
        (Some("held"), Some(2))
    );
    assert_eq!(reservation["request_id"], request_id.to_string());
    let balances = app.assert_invariants(account);
    assert_eq!((balances.available, balances.reserved), (3, 2));

    // The same request again is a replay: same reservation, no second hold.
    let replay = app.reserve(account, &kiosk, request_id, 2).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed: Value = replay.json().await.expect("json");
    assert_eq!(replayed["reservation_id"], reservation["reservation_id"]);
    // The same request_id with another amount, or another TTL, is refused.
    let path = format!("/v1/accounts/{account}/reservations");
    for body in [
        json!({"request_id": request_id, "amount": 3}),
        json!({"request_id": request_id, "amount": 2, "ttl_seconds": 60}),
    ] {
        let (status, problem_body) = problem(app.post(&path, &kiosk, &body).await).await;
        assert_eq!(
            (status, problem_body["code"].as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("idempotency_key_reused")
            ),
            "{body}"
        );
    }

    let commit = reservation_path(account, &reservation, "commit");
    let committed = app.post(&commit, &kiosk, &json!({})).await;
    assert_eq!(committed.status(), StatusCode::OK);
    assert!(committed.headers().get("idempotent-replayed").is_none());
    let committed: Value = committed.json().await.expect("json");
    assert_eq!(
        (
            committed["state"].as_str(),
            committed["committed_amount"].as_i64()
        ),
        (Some("committed"), Some(2))
    );
    assert!(committed["resolved_at"].is_string());

    // A retried commit (lost response) answers the same, spends nothing more.
    let again = app.post_raw(&commit, &kiosk, "").await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    // Releasing a committed reservation is a conflict that names the state.
    let (status, body) = problem(
        app.post(
            &reservation_path(account, &reservation, "release"),
            &kiosk,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str(), body["state"].as_str()),
        (
            StatusCode::CONFLICT,
            Some("reservation_not_held"),
            Some("committed")
        )
    );

    let fetched: Value = app
        .get(&reservation_path(account, &reservation, ""), &kiosk)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(fetched["state"], "committed");
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (3, 0, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_commit_releases_the_rest_in_one_transaction() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let reservation: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 5)
        .await
        .json()
        .await
        .expect("json");
    let commit = reservation_path(account, &reservation, "commit");
    // One token more than is held is refused, and changes nothing.
    let (status, body) = problem(app.post(&commit, ADMIN_KEY, &json!({"amount": 6})).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("exceeds the 5 tokens held")),
        "{body}"
    );
    let response: Value = app
        .post(&commit, ADMIN_KEY, &json!({"amount": 2}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        (
            response["state"].as_str(),
            response["committed_amount"].as_i64()
        ),
        (Some("committed"), Some(2))
    );
    // Replaying the same partial commit is fine; a different amount is not.
    assert_eq!(
        app.post(&commit, ADMIN_KEY, &json!({"amount": 2}))
            .await
            .status(),
        StatusCode::OK
    );
    let (status, _) = problem(app.post(&commit, ADMIN_KEY, &json!({"amount": 3})).await).await;
    assert_eq!(status, StatusCode::CONFLICT);

    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (8, 0, 2)
    );
    let ledger: Value = app
        .get(&format!("/v1/accounts/{account}/ledger"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    let kinds: Vec<(&str, i64)> = ledger["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| {
            (
                entry["kind"].as_str().expect("kind"),
                entry["amount"].as_i64().expect("amount"),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("credit", 10),
            ("reserve", 5),
            ("commit", 2),
            ("release", 3)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_extend() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    let reservation: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 3)
        .await
        .json()
        .await
        .expect("json");
    let expires_at: DateTime<Utc> = reservation["expires_at"]
        .as_str()
        .expect("time")
        .parse()
        .expect("rfc3339");

    let extended: Value = app
        .post(
            &reservation_path(account, &reservation, "extend"),
            ADMIN_KEY,
            &json!({"ttl_seconds": 3600}),
        )
        .await
        .json()
        .await
        .expect("json");
    let new_expiry: DateTime<Utc> = extended["expires_at"]
        .as_str()
        .expect("time")
        .parse()
        .expect("rfc3339");
    assert!(
        new_expiry > expires_at + chrono::Duration::seconds(3000),
        "{expires_at} → {new_expiry}"
    );

    let release = reservation_path(account, &reservation, "release");
    let released = app.post(&release, ADMIN_KEY, &json!({})).await;
    assert_eq!(released.status(), StatusCode::OK);
    let released: Value = released.json().await.expect("json");
    assert_eq!(
        (
            released["state"].as_str(),
            released["committed_amount"].as_i64()
        ),
        (Some("released"), Some(0))
    );
    let replay = app.post(&release, ADMIN_KEY, &json!({})).await;
    assert_eq!(
        (
            replay.status(),
            replay.headers()["idempotent-replayed"].to_str().ok()
        ),
        (StatusCode::OK, Some("true"))
    );
    let (status, body) = problem(
        app.post(
            &reservation_path(account, &reservation, "extend"),
            ADMIN_KEY,
            &json!({"ttl_seconds": 60}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::CONFLICT, Some("released"))
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (3, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_past_expiry_cannot_be_committed_and_returns_its_tokens() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(4).await;
    let reservation: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 4)
        .await
        .json()
        .await
        .expect("json");
    let reservation_id: Uuid = reservation["reservation_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    // Move the expiry into the past on the database clock (no sleeping).
    {
        use token_billing::db::schema::reservations;
        diesel::update(reservations::table.find(reservation_id))
            .set(
                reservations::expires_at.eq(diesel::dsl::sql::<diesel::sql_types::Timestamptz>(
                    "now() - interval '1 second'",
                )),
            )
            .execute(&mut app.conn())
            .expect("update");
    }
    let (status, body) = problem(
        app.post(
            &reservation_path(account, &reservation, "commit"),
            ADMIN_KEY,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str(), body["state"].as_str()),
        (
            StatusCode::CONFLICT,
            Some("reservation_not_held"),
            Some("expired")
        )
    );
    let (status, _) = problem(
        app.post(
            &reservation_path(account, &reservation, "release"),
            ADMIN_KEY,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (4, 0, 0)
    );
    let ledger: Value = app
        .get(&format!("/v1/accounts/{account}/ledger"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    let last = ledger["entries"]
        .as_array()
        .and_then(|entries| entries.last())
        .expect("entries")
        .clone();
    assert_eq!(
        (
            last["kind"].as_str(),
            last["reason"].as_str(),
            last["amount"].as_i64()
        ),
        (Some("expire"), Some("expired_on_access"), Some(4))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_insufficient_tokens_and_unknown_ids() {
    let app = TestApp::spawn().await;
    let account = app.create_account(2).await;
    app.credit(account, 10).await;
    let first: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 1)
        .await
        .json()
        .await
        .expect("json");
    app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    let before = app.snapshot(account);
    let refused = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    // The slots are other kiosks': one is usually free within seconds.
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok()),
        Some("1")
    );
    let (status, body) = problem(refused).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("too_many_active_reservations")
        )
    );
    assert_eq!(app.snapshot(account), before);
    // It names the limit and the setting that raises it.
    assert_eq!(body["max_active_reservations"], json!(2), "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("limit of 2") && detail.contains("PATCH /v1/accounts/"),
        "{body}"
    );
    app.post(
        &reservation_path(account, &first, "release"),
        ADMIN_KEY,
        &json!({}),
    )
    .await;
    assert_eq!(
        app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1)
            .await
            .status(),
        StatusCode::CREATED
    );

    let (status, body) = problem(app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let other = app.funded_account(1).await;
    app.reserve(other, ADMIN_KEY, Uuid::new_v4(), 1).await;
    let (status, body) = problem(app.reserve(other, ADMIN_KEY, Uuid::new_v4(), 1).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::PAYMENT_REQUIRED, Some("insufficient_tokens"))
    );
    assert_eq!(
        (body["available"].as_i64(), body["reserved"].as_i64()),
        (Some(0), Some(1))
    );
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("another kiosk"),
        "{body}"
    );

    let (status, _) = problem(
        app.reserve(Uuid::new_v4(), ADMIN_KEY, Uuid::new_v4(), 1)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = problem(
        app.get(
            &format!("/v1/accounts/{account}/reservations/{}", Uuid::new_v4()),
            ADMIN_KEY,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = problem(
        app.post(
            &format!(
                "/v1/accounts/{account}/reservations/{}/commit",
                Uuid::new_v4()
            ),
            ADMIN_KEY,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.assert_invariants(account);
    app.assert_invariants(other);
}

/// A request_id is one account's own: the same one on another account is a
/// new reservation (or job), never a replay of the first account's. Both
/// batched together (one coalesced engine call) and one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_belongs_to_its_account() {
    let app = TestApp::spawn().await;
    let first = app.funded_account(5).await;
    let second = app.funded_account(5).await;
    let first_key = app.kiosk_key(first).await;
    let second_key = app.kiosk_key(second).await;
    let request_id = Uuid::new_v4();

    let (a, b) = tokio::join!(
        app.reserve(first, &first_key, request_id, 2),
        app.reserve(second, &second_key, request_id, 3)
    );
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    let a: Value = a.json().await.expect("json");
    let b: Value = b.json().await.expect("json");
    assert_ne!(a["reservation_id"], b["reservation_id"]);
    assert_eq!(
        (a["amount"].as_i64(), b["amount"].as_i64()),
        (Some(2), Some(3))
    );
    // The same request on the second account again replays the second
    // account's reservation.
    let later = app.reserve(second, &second_key, request_id, 3).await;
    assert_eq!(
        later.status(),
        StatusCode::OK,
        "a replay on the second account"
    );
    let later: Value = later.json().await.expect("json");
    assert_eq!(later["reservation_id"], b["reservation_id"]);
    let first_balances = app.assert_invariants(first);
    let second_balances = app.assert_invariants(second);
    assert_eq!((first_balances.reserved, second_balances.reserved), (2, 3));

    // Jobs: the same request_id on both accounts makes two jobs.
    let job_request = Uuid::new_v4();
    let params = json!({"simulate": {"delay_ms": 0}});
    let one = app
        .create_job(first, &first_key, job_request, &params)
        .await;
    assert_eq!(one.status(), StatusCode::CREATED);
    let other = app
        .create_job(second, &second_key, job_request, &params)
        .await;
    assert_eq!(
        other.status(),
        StatusCode::CREATED,
        "not a replay of the first account's job"
    );
    let one: Value = one.json().await.expect("json");
    let other: Value = other.json().await.expect("json");
    assert!(one["job_id"].is_string());
    assert_ne!(one["job_id"], other["job_id"]);
}

/// A new account's default fits a fleet of 20 booths: about two held
/// reservations each (one per picture, one for an overlapping press).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_limit_fits_a_fleet_of_twenty_booths() {
    let app = TestApp::spawn().await;
    let account = app
        .create_account_from(&json!({"name": "twenty booths"}))
        .await;
    app.credit(account, 100).await;
    let shown = app.account(account).await;
    assert_eq!(shown["max_active_reservations"], json!(50), "{shown}");
    let booths: Vec<_> = (0..40)
        .map(|_| app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1))
        .collect();
    for answer in futures_util::future::join_all(booths).await {
        assert_eq!(answer.status(), StatusCode::CREATED);
    }
}
