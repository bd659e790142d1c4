//! Crash recovery with the real binary: SIGKILL the service while its jobs
//! are at the provider, start it again, and every job ends terminal with
//! exactly one generation and one charge.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use diesel::prelude::*;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::db::schema::generation_jobs;

use crate::helpers::{
    assert_account_invariants, eventually, FakeProvider, TestDatabase, ADMIN_KEY,
};

/// The service as a child process; killed when dropped.
pub struct Service {
    pub child: Child,
    pub base: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

async fn start_service(database_url: &str, provider_url: &str) -> Service {
    start_service_with(database_url, provider_url, &[]).await
}

pub async fn start_service_with(
    database_url: &str,
    provider_url: &str,
    extra_env: &[(&str, &str)],
) -> Service {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .envs(extra_env.iter().copied())
        .env("DATABASE_URL", database_url)
        .env("BIND_ADDR", format!("127.0.0.1:{port}"))
        .env("ADMIN_API_KEY", ADMIN_KEY)
        .env("PROVIDER", "http")
        .env("PROVIDER_URL", provider_url)
        .env("JOB_LEASE_SECONDS", "2")
        .env("WORKER_CONCURRENCY", "4")
        .env("DB_POOL_SIZE", "8")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("service starts");
    let service = Service {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::new();
    let ready = format!("{}/readyz", service.base);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = client.get(&ready).send().await {
            if response.status().is_success() {
                return service;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "service never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An account made through the API at `base` (`account`: the body of its
/// POST), credited (`credit`: the credit's body), and a kiosk key on it:
/// (account id, key).
pub async fn funded_kiosk(
    client: &reqwest::Client,
    base: &str,
    account: Value,
    credit: Value,
) -> (String, String) {
    let account = post(client, format!("{base}/v1/accounts"), account).await["account_id"]
        .as_str()
        .expect("an account id")
        .to_owned();
    let accounts = format!("{base}/v1/accounts/{account}");
    post(client, format!("{accounts}/credits"), credit).await;
    let key = post(
        client,
        format!("{accounts}/api-keys"),
        json!({"scope": "kiosk", "label": "booth"}),
    )
    .await["key"]
        .as_str()
        .expect("a kiosk key")
        .to_owned();
    (account, key)
}

pub async fn post(client: &reqwest::Client, url: String, body: Value) -> Value {
    let response = client
        .post(url)
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert!(response.status().is_success(), "{}", response.status());
    response.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_job_then_restart_loses_nothing_and_charges_once() {
    const JOBS: usize = 4;
    let provider = FakeProvider::start(2_000).await;
    let database = TestDatabase::create();
    let client = reqwest::Client::new();
    let mut first = start_service(&database.url, &provider.url).await;

    let account = post(
        &client,
        format!("{}/v1/accounts", first.base),
        json!({"name": "crash", "max_active_reservations": 0}),
    )
    .await;
    let account: Uuid = account["account_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    post(
        &client,
        format!("{}/v1/accounts/{account}/credits", first.base),
        json!({"amount": 10, "external_ref": "crash"}),
    )
    .await;
    for _ in 0..JOBS {
        let body = json!({"request_id": Uuid::new_v4(), "kind": "standard", "params": {}});
        post(
            &client,
            format!("{}/v1/accounts/{account}/jobs", first.base),
            body,
        )
        .await;
    }
    let mut conn = database.connect();
    // Wait until every job is at the provider (running, provider id known).
    eventually("all jobs at the provider", Duration::from_secs(20), || {
        let at_provider: i64 = generation_jobs::table
            .filter(generation_jobs::status.eq("running"))
            .filter(generation_jobs::provider_job_id.is_not_null())
            .count()
            .get_result(&mut conn)
            .expect("count");
        (at_provider == i64::try_from(JOBS).expect("fits")).then_some(())
    })
    .await;

    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    let running: i64 = generation_jobs::table
        .filter(generation_jobs::status.eq("running"))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(
        running,
        i64::try_from(JOBS).expect("fits"),
        "the crash left the jobs half-done"
    );

    let _second = start_service(&database.url, &provider.url).await;
    eventually(
        "every job terminal after restart",
        Duration::from_secs(30),
        || {
            let open: i64 = generation_jobs::table
                .filter(generation_jobs::status.eq_any(["queued", "running"]))
                .count()
                .get_result(&mut conn)
                .expect("count");
            (open == 0).then_some(())
        },
    )
    .await;
    let jobs: Vec<(Uuid, String, i32)> = generation_jobs::table
        .select((
            generation_jobs::id,
            generation_jobs::status,
            generation_jobs::attempts,
        ))
        .load(&mut conn)
        .expect("jobs");
    for (id, status, attempts) in &jobs {
        assert_eq!(status, "succeeded", "job {id}");
        assert_eq!(
            *attempts, 2,
            "job {id}: one attempt before the crash, one after"
        );
        let key = id.to_string();
        assert_eq!(
            provider.backend.generations(&key),
            1,
            "job {id}: no second generation"
        );
        assert_eq!(
            provider.backend.submissions(&key),
            1,
            "job {id}: the reclaim asked about its prediction, no resubmission"
        );
    }
    let balances = assert_account_invariants(&mut conn, account);
    let jobs_count = i64::try_from(JOBS).expect("fits");
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (10 - jobs_count, 0, jobs_count)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_running_jobs_then_exits() {
    let provider = FakeProvider::start(1_500).await;
    let database = TestDatabase::create();
    let client = reqwest::Client::new();
    let mut service = start_service_with(
        &database.url,
        &provider.url,
        &[("SHUTDOWN_GRACE_SECONDS", "20")],
    )
    .await;
    let account = post(
        &client,
        format!("{}/v1/accounts", service.base),
        json!({"name": "drain"}),
    )
    .await;
    let account: Uuid = account["account_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    post(
        &client,
        format!("{}/v1/accounts/{account}/credits", service.base),
        json!({"amount": 1, "external_ref": "d"}),
    )
    .await;
    let body = json!({"request_id": Uuid::new_v4(), "kind": "standard", "params": {}});
    post(
        &client,
        format!("{}/v1/accounts/{account}/jobs", service.base),
        body,
    )
    .await;
    let mut conn = database.connect();
    eventually("the job at the provider", Duration::from_secs(20), || {
        let running: i64 = generation_jobs::table
            .filter(generation_jobs::provider_job_id.is_not_null())
            .count()
            .get_result(&mut conn)
            .expect("count");
        (running == 1).then_some(())
    })
    .await;

    let status = Command::new("kill")
        .args(["-TERM", &service.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    // While draining, the replica tells load balancers it is not ready.
    let ready = format!("{}/readyz", service.base);
    let mut saw_unready = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = service.child.try_wait().expect("try_wait") {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the service did not exit after SIGTERM"
        );
        if let Ok(response) = client.get(&ready).send().await {
            saw_unready |= response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "clean exit: {exit:?}");
    assert!(saw_unready, "/readyz answered 503 while draining");
    let status: String = generation_jobs::table
        .select(generation_jobs::status)
        .first(&mut conn)
        .expect("job");
    assert_eq!(
        status, "succeeded",
        "the running job finished before the process exited"
    );
    let balances = assert_account_invariants(&mut conn, account);
    assert_eq!((balances.reserved, balances.used), (0, 1));
}
