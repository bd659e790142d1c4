//! Nothing is lost by a crash: a replica SIGKILLed in the middle of a
//! delivery (another replica sends it again, same `webhook-id`), and a
//! PostgreSQL server crashed and restarted under deliveries and credits
//! (its own throwaway cluster, never the main one).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use serde_json::json;
use uuid::Uuid;

use crate::crash::{free_port, post, start_service_with};
use crate::helpers::{TestDatabase, ADMIN_KEY};
use crate::receiver::{verified_with, Receiver};

async fn set_up(client: &reqwest::Client, base: &str, hook: String) -> (String, String) {
    let account = post(
        client,
        format!("{base}/v1/accounts"),
        json!({"name": "durable"}),
    )
    .await;
    let endpoint = post(
        client,
        format!("{base}/v1/webhook-endpoints"),
        json!({"url": hook, "events": ["credit.created"]}),
    )
    .await;
    (
        account["account_id"].as_str().expect("account").to_owned(),
        endpoint["secret"].as_str().expect("secret").to_owned(),
    )
}

/// A credit, retried with the same external_ref until it is acknowledged
/// (requests fail while the database is away; the ref makes retries safe).
async fn credit_until_acknowledged(
    client: &reqwest::Client,
    base: &str,
    account: &str,
    reference: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = client
            .post(format!("{base}/v1/accounts/{account}/credits"))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({"amount": 1, "external_ref": reference}))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if sent.is_ok_and(|response| response.status().is_success()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "credit {reference} never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const FAST_RETRIES: [(&str, &str); 3] = [
    ("WEBHOOK_ALLOW_PRIVATE_URLS", "true"),
    ("WEBHOOK_TIMEOUT_SECONDS", "3"),
    (
        "WEBHOOK_RETRY_SCHEDULE",
        "0,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3,0.3",
    ),
];

/// The receiver holds the first delivery; its replica is SIGKILLed while
/// it waits; a second replica sends the event again once the lease has
/// run out — the same `webhook-id`, verified — and it is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_delivery_loses_nothing() {
    let database = TestDatabase::create();
    let receiver = Receiver::start();
    let client = reqwest::Client::new();
    let first = start_service_with(&database.url, "http://127.0.0.1:9", &FAST_RETRIES).await;
    let (account, secret) = set_up(
        &client,
        &first.base,
        receiver.hook("slow", "fail=1&hang=60&status=200"),
    )
    .await;
    receiver.verify_with(&[&secret]).await;
    credit_until_acknowledged(&client, &first.base, &account, "killed-mid-delivery").await;
    let held = receiver
        .wait_for(
            "the first delivery to arrive",
            Duration::from_secs(20),
            |received| !received.is_empty(),
        )
        .await;
    drop(first); // SIGKILL while the receiver still holds the request
    let second = start_service_with(&database.url, "http://127.0.0.1:9", &FAST_RETRIES).await;
    let received = receiver
        .wait_for("the delivery again", Duration::from_secs(30), |received| {
            received.len() >= 2
        })
        .await;
    assert_eq!(received[0]["webhook_id"], held[0]["webhook_id"]);
    assert_eq!(received[1]["webhook_id"], held[0]["webhook_id"]);
    assert_eq!(received[1]["status"], 200);
    assert!(received
        .iter()
        .all(|delivery| verified_with(delivery, &secret)));
    let mut conn = database.connect();
    let delivered =
        crate::helpers::eventually("the delivery recorded", Duration::from_secs(10), || {
            diesel::sql_query("SELECT 1 FROM webhook_deliveries WHERE status = 'delivered'")
                .execute(&mut conn)
                .ok()
                .filter(|rows| *rows == 1)
        })
        .await;
    assert_eq!(delivered, 1);
    drop(second);
}

/// A private PostgreSQL server in a temporary directory on a free port
/// (as the `postgres` user when run as root); stopped and removed when
/// dropped.
struct Cluster {
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
}

fn as_postgres(program: &std::path::Path) -> Command {
    // SAFETY-free check of the effective user: root must not run the server.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    if root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

impl Cluster {
    fn start() -> Cluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql")
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("bin"))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .expect("an initdb");
        let dir = std::env::temp_dir().join(format!("tb-webhook-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status();
        let port = free_port();
        let cluster = Cluster { dir, port, bin };
        let status = as_postgres(&cluster.bin.join("initdb"))
            .args(["-U", "postgres", "--auth=trust", "-D"])
            .arg(cluster.dir.join("data"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed");
        cluster.pg_ctl("start");
        cluster
    }

    fn pg_ctl(&self, action: &str) {
        let mut command = as_postgres(&self.bin.join("pg_ctl"));
        command.arg("-D").arg(self.dir.join("data"));
        if action == "start" {
            command
                .args(["-w", "-l"])
                .arg(self.dir.join("log"))
                .arg("-o")
                .arg(format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
                    self.port,
                    self.dir.display()
                ))
                .arg("start");
        } else {
            command.args(["-w", "-m", "immediate", "stop"]);
        }
        let status = command
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "pg_ctl {action} failed");
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/tb_webhooks", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut command = as_postgres(&self.bin.join("pg_ctl"));
        let _ = command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Credits before and after a crash of the PostgreSQL server (immediate
/// stop: no checkpoint, WAL replay on start) while deliveries are failing
/// and being retried: every acknowledged credit has its event, and every
/// event reaches the receiver, verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_and_restart_loses_nothing() {
    let cluster = Cluster::start();
    let receiver = Receiver::start();
    let client = reqwest::Client::new();
    let service = start_service_with(&cluster.url(), "http://127.0.0.1:9", &FAST_RETRIES).await;
    let (account, secret) =
        set_up(&client, &service.base, receiver.hook("restart", "fail=2")).await;
    receiver.verify_with(&[&secret]).await;
    for n in 0..20 {
        credit_until_acknowledged(&client, &service.base, &account, &format!("before-{n}")).await;
    }
    cluster.pg_ctl("stop");
    cluster.pg_ctl("start");
    for n in 0..20 {
        credit_until_acknowledged(&client, &service.base, &account, &format!("after-{n}")).await;
    }
    let received = receiver
        .wait_for(
            "all 40 events delivered",
            Duration::from_secs(60),
            |received| {
                received
                    .iter()
                    .filter(|delivery| delivery["status"] == 200)
                    .map(|delivery| {
                        delivery["webhook_id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned()
                    })
                    .collect::<BTreeSet<_>>()
                    .len()
                    >= 40
            },
        )
        .await;
    assert!(received
        .iter()
        .all(|delivery| verified_with(delivery, &secret)));
    let mut conn = PgConnection::establish(&cluster.url()).expect("cluster connection");
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    let events: BTreeSet<String> =
        diesel::sql_query("SELECT id::text AS id FROM events WHERE type = 'credit.created'")
            .load::<Id>(&mut conn)
            .expect("events")
            .into_iter()
            .map(|row| row.id)
            .collect();
    assert_eq!(events.len(), 40, "one event per acknowledged credit");
    let delivered: BTreeSet<String> = received
        .iter()
        .filter(|delivery| delivery["status"] == 200)
        .map(|delivery| delivery["webhook_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(delivered, events, "every event delivered, nothing else");
    let disagreements = token_billing::domain::checks::events_disagreeing_with_books(&mut conn)
        .expect("events check");
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    drop(service);
}
