//! Generation jobs end to end: the real `http` provider against the fake
//! provider over loopback, the simulated provider, and the fencing rules.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::config::ProviderKind;
use token_billing::db::schema::{generation_jobs, ledger_entries};

use crate::helpers::{problem, FakeProvider, TestApp, ADMIN_KEY};

async fn http_app(
    provider: &FakeProvider,
    adjust: impl FnOnce(&mut token_billing::config::Config),
) -> TestApp {
    let url = provider.url.clone();
    TestApp::spawn_with(move |config| {
        config.provider = ProviderKind::Http;
        config.provider_url = Some(url);
        adjust(config);
    })
    .await
}

fn ledger_kinds(app: &TestApp, account: Uuid) -> Vec<String> {
    ledger_entries::table
        .filter(ledger_entries::account_id.eq(account))
        .order(ledger_entries::id.asc())
        .select(ledger_entries::kind)
        .load(&mut app.conn())
        .expect("ledger")
}

fn job_id(job: &Value) -> String {
    job["job_id"].as_str().expect("job id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_provider_success_charges_once() {
    let provider = FakeProvider::start(30).await;
    let app = http_app(&provider, |_| {}).await;
    let account = app.funded_account(3).await;
    let kiosk = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();

    let response = app
        .create_job(
            account,
            &kiosk,
            request_id,
            &json!({"prompt": "bride and groom"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response.headers()["location"].to_str().expect("ascii"),
        format!("/v1/accounts/{account}/jobs/{request_id}")
    );
    let created: Value = response.json().await.expect("json");
    assert_eq!(
        (
            created["cost"].as_i64(),
            created["reservation"]["state"].as_str()
        ),
        (Some(1), Some("held"))
    );

    let job = app.wait_job(account, request_id, 20).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(job["result"]["output"]
        .as_str()
        .expect("output")
        .ends_with(".png"));
    assert_eq!(
        (
            job["reservation"]["state"].as_str(),
            job["attempts"].as_i64()
        ),
        (Some("committed"), Some(1))
    );
    assert_eq!(provider.backend.generations(&job_id(&job)), 1);
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (2, 0, 1)
    );
    assert_eq!(
        ledger_kinds(&app, account),
        vec!["credit", "reserve", "commit"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_5xx_twice_then_success_is_one_charge() {
    let provider = FakeProvider::start(0).await;
    let app = http_app(&provider, |_| {}).await;
    let account = app.funded_account(2).await;
    let request_id = Uuid::new_v4();
    let params = json!({"simulate": {"fail_times": 2, "delay_ms": 0}});
    assert_eq!(
        app.create_job(account, ADMIN_KEY, request_id, &params)
            .await
            .status(),
        StatusCode::CREATED
    );
    let job = app.wait_job(account, request_id, 20).await;
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_i64()),
        (Some("succeeded"), Some(3)),
        "{job}"
    );
    let id = job_id(&job);
    assert_eq!(
        (
            provider.backend.submissions(&id),
            provider.backend.generations(&id)
        ),
        (3, 1)
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (1, 0, 1)
    );
    assert_eq!(
        ledger_kinds(&app, account),
        vec!["credit", "reserve", "commit"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_hang_times_out_retries_then_fails_and_returns_tokens() {
    let provider = FakeProvider::start(0).await;
    let app = http_app(&provider, |config| {
        config.provider_timeout_seconds = 1;
        config.job_max_attempts = 2;
    })
    .await;
    let account = app.funded_account(1).await;
    let request_id = Uuid::new_v4();
    app.create_job(
        account,
        ADMIN_KEY,
        request_id,
        &json!({"simulate": {"outcome": "hang"}}),
    )
    .await;
    let job = app.wait_job(account, request_id, 20).await;
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_i64()),
        (Some("failed"), Some(2)),
        "{job}"
    );
    assert_eq!(job["error"]["code"], "provider_timeout");
    assert_eq!(job["reservation"]["state"], "released");
    assert_eq!(provider.backend.submissions(&job_id(&job)), 2);
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (1, 0, 0)
    );
    assert_eq!(
        ledger_kinds(&app, account),
        vec!["credit", "reserve", "release"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_after_success_retry_finds_the_result_one_charge() {
    let provider = FakeProvider::start(0).await;
    let app = http_app(&provider, |_| {}).await;
    let account = app.funded_account(1).await;
    let request_id = Uuid::new_v4();
    let params = json!({"simulate": {"outcome": "drop_after_success", "delay_ms": 0}});
    app.create_job(account, ADMIN_KEY, request_id, &params)
        .await;
    let job = app.wait_job(account, request_id, 20).await;
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_i64()),
        (Some("succeeded"), Some(2)),
        "{job}"
    );
    let id = job_id(&job);
    assert_eq!(
        (
            provider.backend.submissions(&id),
            provider.backend.generations(&id)
        ),
        (2, 1)
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (0, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_failure_releases_and_replays_are_idempotent() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(2).await;
    let kiosk = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();
    let params = json!({"simulate": {"outcome": "fail", "delay_ms": 0}, "prompt": "x"});
    let created: Value = app
        .create_job(account, &kiosk, request_id, &params)
        .await
        .json()
        .await
        .expect("json");
    let job = app.wait_job(account, request_id, 20).await;
    assert_eq!(
        (job["status"].as_str(), job["error"]["code"].as_str()),
        (Some("failed"), Some("provider_failed"))
    );
    assert!(job["error"]["message"].is_string());

    // A retry of the same request answers the same job; keys in another
    // order are the same request.
    let same = json!({"prompt": "x", "simulate": {"delay_ms": 0, "outcome": "fail"}});
    let replay = app.create_job(account, &kiosk, request_id, &same).await;
    assert_eq!(
        (
            replay.status(),
            replay.headers()["idempotent-replayed"].to_str().ok()
        ),
        (StatusCode::OK, Some("true"))
    );
    let replay: Value = replay.json().await.expect("json");
    assert_eq!(
        (replay["job_id"].clone(), replay["status"].as_str()),
        (created["job_id"].clone(), Some("failed"))
    );
    let before = app.snapshot(account);
    let (status, body) = problem(
        app.create_job(account, &kiosk, request_id, &json!({"prompt": "y"}))
            .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    let unknown_kind = json!({"request_id": Uuid::new_v4(), "kind": "ultra", "params": {}});
    let (status, _) = problem(
        app.post(
            &format!("/v1/accounts/{account}/jobs"),
            &kiosk,
            &unknown_kind,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let not_object = json!({"request_id": Uuid::new_v4(), "kind": "standard", "params": [1]});
    let (status, _) = problem(
        app.post(&format!("/v1/accounts/{account}/jobs"), &kiosk, &not_object)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let huge = json!({"request_id": Uuid::new_v4(), "kind": "standard", "params": {"p": "x".repeat(17_000)}});
    let (status, _) = problem(
        app.post(&format!("/v1/accounts/{account}/jobs"), &kiosk, &huge)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.snapshot(account),
        before,
        "refused job requests changed nothing"
    );
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (2, 0, 0)
    );

    // A kiosk cannot settle a job's reservation itself.
    let reservation = created["reservation"]["reservation_id"]
        .as_str()
        .expect("id");
    let (status, body) = problem(
        app.post(
            &format!("/v1/accounts/{account}/reservations/{reservation}/commit"),
            &kiosk,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_jobs_filters_and_pages() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let mut ids = Vec::new();
    for index in 0..5 {
        let request_id = Uuid::new_v4();
        let outcome = if index % 2 == 0 { "succeed" } else { "fail" };
        app.create_job(
            account,
            ADMIN_KEY,
            request_id,
            &json!({"simulate": {"outcome": outcome, "delay_ms": 0}}),
        )
        .await;
        ids.push(request_id);
    }
    app.all_jobs_terminal(Duration::from_secs(20)).await;
    let page: Value = app
        .get(
            &format!("/v1/accounts/{account}/jobs?status=failed"),
            ADMIN_KEY,
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(page["jobs"].as_array().expect("jobs").len(), 2);
    let mut seen = Vec::new();
    let mut path = format!("/v1/accounts/{account}/jobs?limit=2");
    loop {
        let page: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
        seen.extend(
            page["jobs"]
                .as_array()
                .expect("jobs")
                .iter()
                .map(|job| job["request_id"].as_str().expect("id").to_owned()),
        );
        match page["next_after"].as_str() {
            Some(after) => path = format!("/v1/accounts/{account}/jobs?limit=2&after={after}"),
            None => break,
        }
    }
    let expected: Vec<String> = ids.iter().rev().map(Uuid::to_string).collect();
    assert_eq!(seen, expected, "newest first, each once");
    let (status, _) = problem(
        app.get(
            &format!("/v1/accounts/{account}/jobs?status=lost"),
            ADMIN_KEY,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = problem(
        app.get(
            &format!("/v1/accounts/{account}/jobs/{}?wait_seconds=31", ids[0]),
            ADMIN_KEY,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_finished_by_another_replica_wakes_the_waiting_client() {
    // An API-only replica takes the request and the wait; a worker replica
    // on the same database runs the job.
    let api = TestApp::spawn_with(|config| config.worker_concurrency = 0).await;
    let _worker = api
        .spawn_replica(|config| config.simulated_latency_ms = 300)
        .await;
    let account = api.funded_account(1).await;
    let request_id = Uuid::new_v4();
    assert_eq!(
        api.create_job(account, ADMIN_KEY, request_id, &json!({}))
            .await
            .status(),
        StatusCode::CREATED
    );
    let job = api.wait_job(account, request_id, 20).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    api.assert_invariants(account);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_the_work_without_double_execution() {
    let provider = FakeProvider::start(40).await;
    let url = provider.url.clone();
    let first = http_app(&provider, |_| {}).await;
    let second = first
        .spawn_replica(move |config| {
            config.provider = ProviderKind::Http;
            config.provider_url = Some(url);
        })
        .await;
    let account = first.funded_account(40).await;
    for index in 0..40 {
        let app = if index % 2 == 0 { &first } else { &second };
        let response = app
            .create_job(account, ADMIN_KEY, Uuid::new_v4(), &json!({"n": index}))
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    first.all_jobs_terminal(Duration::from_secs(60)).await;
    let jobs: Vec<(Uuid, String, Option<String>)> = generation_jobs::table
        .select((
            generation_jobs::id,
            generation_jobs::status,
            generation_jobs::lease_owner,
        ))
        .load(&mut first.conn())
        .expect("jobs");
    assert_eq!(jobs.len(), 40);
    for (id, status, _) in &jobs {
        assert_eq!(status, "succeeded");
        assert_eq!(
            provider.backend.generations(&id.to_string()),
            1,
            "job {id} generated once"
        );
    }
    let replicas: std::collections::HashSet<String> = jobs
        .iter()
        .filter_map(|(_, _, owner)| {
            owner
                .as_deref()
                .and_then(|owner| owner.split('/').next())
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(replicas.len(), 2, "both replicas ran jobs: {replicas:?}");
    let balances = first.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (0, 0, 40)
    );
    assert_eq!(provider.backend.total_generations(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_token_two_kiosks_same_instant_one_job() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(1).await;
    let keys = [app.kiosk_key(account).await, app.kiosk_key(account).await];
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let (app, barrier) = (Arc::clone(&app), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                app.create_job(
                    account,
                    &key,
                    Uuid::new_v4(),
                    &json!({"simulate": {"delay_ms": 0}}),
                )
                .await
                .status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    statuses.sort();
    assert_eq!(
        statuses,
        vec![StatusCode::CREATED, StatusCode::PAYMENT_REQUIRED]
    );
    app.all_jobs_terminal(Duration::from_secs(20)).await;
    let count: i64 = generation_jobs::table
        .count()
        .get_result(&mut app.conn())
        .expect("count");
    assert_eq!(count, 1);
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (0, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_tokens_three_hundred_requests_with_replays_charge_exactly_hundred() {
    const UNIQUE: usize = 240;
    const REPLAYS: usize = 60;
    const THREADS: usize = 40;
    let app = Arc::new(TestApp::spawn_with(|config| config.worker_concurrency = 8).await);
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let originals: Vec<Uuid> = (0..UNIQUE).map(|_| Uuid::new_v4()).collect();
    // Every 4th original is re-sent: some concurrently, some late.
    let mut requests: Vec<Uuid> = originals.clone();
    requests.extend(
        originals
            .iter()
            .step_by(UNIQUE / REPLAYS)
            .take(REPLAYS)
            .copied(),
    );
    let seed: u64 = rand::random();
    requests.sort_by_key(|id| id.as_u128().wrapping_mul(u128::from(seed) | 1));
    let queue = Arc::new(std::sync::Mutex::new(requests));
    let tasks: Vec<_> = (0..THREADS)
        .map(|_| {
            let (app, queue, kiosk) = (Arc::clone(&app), Arc::clone(&queue), kiosk.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                loop {
                    let next = queue.lock().expect("queue").pop();
                    let Some(request_id) = next else {
                        return answers;
                    };
                    let params = json!({"simulate": {"delay_ms": 0}, "guest": request_id});
                    let response = app.create_job(account, &kiosk, request_id, &params).await;
                    let status = response.status();
                    let body: Value = response.json().await.expect("json");
                    answers.push((
                        request_id,
                        status,
                        body["job_id"].as_str().map(str::to_owned),
                    ));
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("task"));
    }
    assert_eq!(answers.len(), UNIQUE + REPLAYS, "seed {seed}");
    let mut job_of: std::collections::HashMap<Uuid, String> = std::collections::HashMap::new();
    for (request_id, status, job) in &answers {
        match *status {
            StatusCode::CREATED | StatusCode::OK => {
                let job = job.clone().expect("a 2xx carries the job");
                let first = job_of.entry(*request_id).or_insert_with(|| job.clone());
                assert_eq!(
                    *first, job,
                    "every answer for {request_id} names the same job"
                );
            }
            StatusCode::PAYMENT_REQUIRED => {}
            other => panic!("unexpected status {other} (seed {seed})"),
        }
    }
    assert_eq!(
        job_of.len(),
        100,
        "exactly 100 request_ids got a job (seed {seed})"
    );
    assert_eq!(
        answers
            .iter()
            .filter(|(_, status, _)| *status == StatusCode::CREATED)
            .count(),
        100
    );
    app.all_jobs_terminal(Duration::from_secs(60)).await;
    let count: i64 = generation_jobs::table
        .count()
        .get_result(&mut app.conn())
        .expect("count");
    assert_eq!(count, 100);
    let backend = app.simulated.as_ref().expect("simulated provider");
    assert_eq!(backend.total_generations(), 100, "one generation per job");
    let balances = app.assert_invariants(account);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (0, 0, 100)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_params_keep_big_integers_exactly_and_refuse_nul() {
    let app = TestApp::spawn_with(|config| config.worker_concurrency = 0).await;
    let account = app.funded_account(5).await;
    let path = format!("/v1/accounts/{account}/jobs");
    let request_id = Uuid::new_v4();
    let body = |seed: &str| {
        format!(r#"{{"request_id":"{request_id}","kind":"standard","params":{{"seed":{seed}}}}}"#)
    };
    let first = app
        .post_raw(&path, ADMIN_KEY, body("12345678901234567890123"))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    // The same request_id with a number that only differs past 64 bits is
    // another request, not a replay.
    let reused = app
        .post_raw(&path, ADMIN_KEY, body("12345678901234567890999"))
        .await;
    let (status, problem_body) = problem(reused).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem_body}");
    let mut conn = app.database.connect();
    let stored: Value = generation_jobs::table
        .filter(generation_jobs::request_id.eq(request_id))
        .select(generation_jobs::params)
        .first(&mut conn)
        .expect("job");
    assert_eq!(stored.to_string(), r#"{"seed":12345678901234567890123}"#);
    for params in [r#"{"prompt":"a\u0000b"}"#, r#"{"a\u0000":1}"#] {
        let body = format!(
            r#"{{"request_id":"{}","kind":"standard","params":{params}}}"#,
            Uuid::new_v4()
        );
        let (status, problem_body) = problem(app.post_raw(&path, ADMIN_KEY, body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem_body}");
    }
    assert_eq!(
        app.account(account).await["available"],
        4,
        "only the first job reserved"
    );
}

/// One heartbeat ticker per replica keeps all its running jobs leased (no
/// job is reclaimed over several leases), and a job whose reservation it
/// finds past expiry fails at once and its worker lets go of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_heartbeat_keeps_its_jobs_and_drops_one_whose_reservation_expired() {
    let app = TestApp::spawn_with(|config| {
        config.simulated_latency_ms = 50_000;
        config.job_lease_seconds = 2;
        config.worker_concurrency = 4;
        // The reaper would expire the reservation itself.
        config.reaper_schedule = "0 0 0 1 1 *".into();
    })
    .await;
    let account = app.funded_account(10).await;
    for index in 0..3 {
        let response = app
            .create_job(account, ADMIN_KEY, Uuid::new_v4(), &json!({"n": index}))
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let mut conn = app.conn();
    type Running = (Uuid, Uuid, i64, i32, chrono::DateTime<chrono::Utc>);
    let claimed: Vec<Running> =
        crate::helpers::eventually("three jobs running", Duration::from_secs(20), || {
            let jobs: Vec<Running> = generation_jobs::table
                .filter(generation_jobs::status.eq("running"))
                .select((
                    generation_jobs::id,
                    generation_jobs::reservation_id,
                    generation_jobs::lease_token,
                    generation_jobs::attempts,
                    generation_jobs::lease_expires_at.assume_not_null(),
                ))
                .order(generation_jobs::id)
                .load(&mut conn)
                .expect("jobs");
            (jobs.len() == 3).then_some(jobs)
        })
        .await;
    let (doomed, doomed_reservation) = (claimed[0].0, claimed[0].1);
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(doomed_reservation)
    .execute(&mut conn)
    .expect("past expiry");
    let failed = || {
        app.state
            .metrics
            .jobs_total
            .with_label_values(&["failed"])
            .get()
    };
    crate::helpers::eventually(
        "the worker saw its job fail",
        Duration::from_secs(10),
        || (failed() == 1).then_some(()),
    )
    .await;
    let (status, error): (String, Option<Value>) = generation_jobs::table
        .find(doomed)
        .select((generation_jobs::status, generation_jobs::error))
        .first(&mut conn)
        .expect("job");
    assert_eq!(status, "failed");
    assert_eq!(error.expect("error")["code"], "reservation_expired");

    // The others' leases keep moving on, three leases past their claim,
    // under the same claim (same token, one attempt).
    let claimed_until = claimed[1].4.max(claimed[2].4);
    crate::helpers::eventually(
        "leases renewed past three leases",
        Duration::from_secs(20),
        || {
            let leases: Vec<chrono::DateTime<chrono::Utc>> = generation_jobs::table
                .filter(generation_jobs::id.eq_any([claimed[1].0, claimed[2].0]))
                .select(generation_jobs::lease_expires_at.assume_not_null())
                .load(&mut conn)
                .expect("leases");
            leases
                .iter()
                .all(|lease| *lease > claimed_until + chrono::Duration::seconds(6))
                .then_some(())
        },
    )
    .await;
    for (id, _, token, attempts, _) in &claimed[1..] {
        let now: (String, i64, i32) = generation_jobs::table
            .find(id)
            .select((
                generation_jobs::status,
                generation_jobs::lease_token,
                generation_jobs::attempts,
            ))
            .first(&mut conn)
            .expect("job");
        assert_eq!(now, ("running".to_owned(), *token, *attempts));
    }
    assert_eq!(failed(), 1);
}
