//! The one-statement spending paths (reserve, commit, release verify the
//! key inside their own statement): they must refuse exactly what the full
//! path refuses, answer a bad key before bad input, write the same ledger,
//! and really run as cached prepared statements.

use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, tampered, TestApp, TestDatabase, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_check_inside_the_statement_refuses_what_the_full_path_refuses() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let other = app.funded_account(10).await;
    let kiosk = app.kiosk_key(account).await;
    let other_kiosk = app.kiosk_key(other).await;
    let finance = app.finance_key().await;
    let held: Value = app
        .reserve(account, &kiosk, Uuid::new_v4(), 2)
        .await
        .json()
        .await
        .expect("json");
    let held = held["reservation_id"].as_str().expect("id").to_owned();
    let before = app.snapshot(account);
    let commit = format!("/v1/accounts/{account}/reservations/{held}/commit");
    let release = format!("/v1/accounts/{account}/reservations/{held}/release");

    let cases = [
        (tampered(&kiosk), StatusCode::UNAUTHORIZED, "unauthorized"),
        (finance.clone(), StatusCode::FORBIDDEN, "forbidden"),
        (other_kiosk.clone(), StatusCode::NOT_FOUND, "not_found"),
    ];
    for (key, status, code) in &cases {
        let answers = [
            app.reserve(account, key, Uuid::new_v4(), 1).await,
            app.create_job(account, key, Uuid::new_v4(), &json!({}))
                .await,
            app.post(&commit, key, &json!({})).await,
            app.post(&release, key, &json!({})).await,
        ];
        for answer in answers {
            let (got, body) = problem(answer).await;
            assert_eq!((got, body["code"].as_str()), (*status, Some(*code)));
        }
    }
    assert_eq!(app.snapshot(account), before, "nothing changed");

    // Revocation: the very next request with the key is refused.
    let key_id = kiosk.split('_').nth(1).expect("key id").to_owned();
    let key_id = Uuid::parse_str(&key_id).expect("uuid");
    let revoked = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{key_id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(revoked.status(), StatusCode::NO_CONTENT);
    let before = app.snapshot(account);
    for answer in [
        app.reserve(account, &kiosk, Uuid::new_v4(), 1).await,
        app.create_job(account, &kiosk, Uuid::new_v4(), &json!({}))
            .await,
        app.post(&commit, &kiosk, &json!({})).await,
        app.post(&release, &kiosk, &json!({})).await,
    ] {
        assert_eq!(problem(answer).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(app.snapshot(account), before, "nothing changed");
    let reservation = app
        .get(
            &format!("/v1/accounts/{account}/reservations/{held}"),
            ADMIN_KEY,
        )
        .await;
    let reservation: Value = reservation.json().await.expect("json");
    assert_eq!(reservation["state"], "held");
    app.assert_invariants(account);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_is_answered_before_bad_input() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let kiosk = app.kiosk_key(account).await;
    let bad_key = tampered(&kiosk);
    let reserve = format!("/v1/accounts/{account}/reservations");
    let jobs = format!("/v1/accounts/{account}/jobs");
    let commit = format!(
        "/v1/accounts/{account}/reservations/{}/commit",
        Uuid::new_v4()
    );
    let before = app.snapshot(account);
    for (path, body) in [
        (reserve.as_str(), "{not json"),
        (reserve.as_str(), r#"{"request_id": "x", "amount": 1}"#),
        (jobs.as_str(), "{not json"),
        (
            jobs.as_str(),
            r#"{"request_id": "00000000-0000-4000-8000-000000000001", "kind": "no-such-kind", "params": {}}"#,
        ),
        ("/v1/accounts/not-a-uuid/jobs", "{}"),
        ("/v1/accounts/not-a-uuid/reservations", "{}"),
        (commit.as_str(), "{not json"),
        ("/v1/accounts/x/reservations/y/commit", "{}"),
        ("/v1/accounts/x/reservations/y/release", "{}"),
    ] {
        for (key, expected) in [
            (bad_key.as_str(), StatusCode::UNAUTHORIZED),
            (kiosk.as_str(), StatusCode::BAD_REQUEST),
        ] {
            let answer = app.post_raw(path, key, body.as_bytes().to_vec()).await;
            let (status, problem_body) = problem(answer).await;
            assert_eq!(status, expected, "{path} {body}: {problem_body}");
        }
    }
    // The job read verifies its key in its first trip to the pool.
    let job = format!("/v1/accounts/{account}/jobs/{}", Uuid::new_v4());
    for path in [
        "/v1/accounts/x/jobs/y".to_owned(),
        format!("{job}?wait_seconds=99"),
        format!("{job}?wait_seconds=-1"),
    ] {
        let (status, _) = problem(app.get(&path, &bad_key).await).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        let (status, _) = problem(app.get(&path, &kiosk).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
    }
    let (status, _) = problem(app.get(&job, &bad_key).await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = problem(app.get(&job, &kiosk).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(app.snapshot(account), before, "nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_paths_write_the_full_paths_ledger() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let kiosk = app.kiosk_key(account).await;
    let key_id = Uuid::parse_str(kiosk.split('_').nth(1).expect("key id")).expect("uuid");
    let mut ids = Vec::new();
    for (key, amount) in [(kiosk.as_str(), 5), (ADMIN_KEY, 3), (kiosk.as_str(), 1)] {
        let answer = app.reserve(account, key, Uuid::new_v4(), amount).await;
        assert_eq!(answer.status(), StatusCode::CREATED);
        let body: Value = answer.json().await.expect("json");
        ids.push(body["reservation_id"].as_str().expect("id").to_owned());
    }
    // A partial commit (2 of 5), a full commit by the admin, a release.
    let path =
        |id: &str, action: &str| format!("/v1/accounts/{account}/reservations/{id}/{action}");
    let partial = app
        .post(&path(&ids[0], "commit"), &kiosk, &json!({"amount": 2}))
        .await;
    assert_eq!(partial.status(), StatusCode::OK);
    let partial: Value = partial.json().await.expect("json");
    assert_eq!(
        (
            partial["state"].as_str(),
            partial["committed_amount"].as_i64()
        ),
        (Some("committed"), Some(2))
    );
    let full = app
        .post(&path(&ids[1], "commit"), ADMIN_KEY, &json!({}))
        .await;
    assert_eq!(full.status(), StatusCode::OK);
    let released = app
        .post(&path(&ids[2], "release"), &kiosk, &json!({}))
        .await;
    assert_eq!(released.status(), StatusCode::OK);

    let ledger: Value = app
        .get(
            &format!("/v1/accounts/{account}/ledger?limit=100"),
            ADMIN_KEY,
        )
        .await
        .json()
        .await
        .expect("json");
    let entries = ledger["entries"].as_array().expect("entries");
    let seen: Vec<(String, i64, i64, i64, i64, String)> = entries
        .iter()
        .map(|entry| {
            (
                entry["kind"].as_str().expect("kind").to_owned(),
                entry["amount"].as_i64().expect("amount"),
                entry["available_after"].as_i64().expect("available"),
                entry["reserved_after"].as_i64().expect("reserved"),
                entry["used_after"].as_i64().expect("used"),
                entry["actor"].as_str().expect("actor").to_owned(),
            )
        })
        .collect();
    let kiosk_actor = key_id.to_string();
    let expected: Vec<(String, i64, i64, i64, i64, String)> = [
        ("credit", 10, 10, 0, 0, "bootstrap-admin"),
        ("reserve", 5, 5, 5, 0, kiosk_actor.as_str()),
        ("reserve", 3, 2, 8, 0, "bootstrap-admin"),
        ("reserve", 1, 1, 9, 0, kiosk_actor.as_str()),
        ("commit", 2, 1, 7, 2, kiosk_actor.as_str()),
        ("release", 3, 4, 4, 2, kiosk_actor.as_str()),
        ("commit", 3, 4, 1, 5, "bootstrap-admin"),
        ("release", 1, 5, 0, 5, kiosk_actor.as_str()),
    ]
    .into_iter()
    .map(|(kind, amount, available, reserved, used, actor)| {
        (
            kind.to_owned(),
            amount,
            available,
            reserved,
            used,
            actor.to_owned(),
        )
    })
    .collect();
    let mut oldest_first = seen.clone();
    if entries.first().and_then(|e| e["entry_id"].as_i64())
        > entries.last().and_then(|e| e["entry_id"].as_i64())
    {
        oldest_first.reverse();
    }
    assert_eq!(oldest_first, expected);
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (5, 0, 5)
    );
}

#[test]
fn raw_statements_are_prepared_once_per_connection() {
    #[derive(QueryableByName)]
    struct Sum {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        count: i64,
    }
    let database = TestDatabase::create();
    let mut conn = database.connect();
    for value in [1_i64, 41] {
        let sum: Sum = token_billing::db::prepared("SELECT $1::bigint + $1 AS n")
            .bind::<diesel::sql_types::BigInt, _>(value)
            .get_result(&mut conn)
            .expect("query");
        assert_eq!(sum.n, value * 2);
    }
    let prepared: Count = diesel::sql_query(
        "SELECT count(*) AS count FROM pg_prepared_statements \
         WHERE statement = 'SELECT $1::bigint + $2 AS n'",
    )
    .get_result(&mut conn)
    .expect("count");
    assert_eq!(prepared.count, 1, "prepared once, executed twice");
}
