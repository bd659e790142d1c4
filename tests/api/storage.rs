//! A database that cannot write its files (a full disk or tablespace) is a
//! database that takes no writes: every answer is 503 `unavailable` with
//! `Retry-After`, never a 500 a kiosk gives up on, nothing half-done is
//! kept, and writes come back by themselves when space does.
//!
//! The full disk is real: a private PostgreSQL cluster (`initdb` as the
//! `postgres` user in a temporary directory, on a free port — never the
//! main cluster) whose database lives in a tablespace on a 64 MiB tmpfs
//! that the test fills. It needs root (mount, `runuser`), so a plain
//! `cargo test` leaves it out and `.ci/run` runs it by name with
//! `--ignored`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::crash::{free_port, funded_kiosk, start_service_with};
use crate::helpers::{assert_account_invariants, FakeProvider};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL cluster of the test's own, removed (with its mounts) on drop.
pub(crate) struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    mounts: Vec<PathBuf>,
}

fn run(command: &mut Command) {
    let shown = format!("{command:?}");
    let status = command
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|error| panic!("{shown}: {error}"));
    assert!(status.success(), "{shown}: {status}");
}

fn as_postgres(program: &str) -> Command {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--", &format!("{PG_BIN}/{program}")]);
    command
}

impl PrivateCluster {
    pub(crate) fn start() -> PrivateCluster {
        let dir = std::env::temp_dir().join(format!("tb-storage-{}", Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).expect("a temporary directory");
        let cluster = PrivateCluster {
            dir,
            port: free_port(),
            mounts: Vec::new(),
        };
        run(Command::new("chown").arg("postgres").arg(&cluster.dir));
        let data = cluster.dir.join("data");
        run(as_postgres("initdb")
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(&data));
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("postgresql.conf");
        writeln!(
            conf,
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             lc_messages = 'C'\nmax_connections = 40",
            cluster.port,
            cluster.dir.display()
        )
        .expect("write postgresql.conf");
        run(as_postgres("pg_ctl")
            .args(["start", "-w", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("postgres.log")));
        cluster
    }

    pub(crate) fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A tmpfs of `size` (e.g. `64m`) at `name` in the cluster's directory,
    /// owned by `postgres`.
    fn mount_tmpfs(&mut self, name: &str, size: &str) -> PathBuf {
        let at = self.dir.join(name);
        std::fs::create_dir(&at).expect("a mount point");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(&at));
        self.mounts.push(at.clone());
        run(Command::new("chown").arg("postgres").arg(&at));
        at
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = as_postgres("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.dir.join("data"))
            .stdout(Stdio::null())
            .status();
        for mount in &self.mounts {
            let _ = Command::new("umount").arg(mount).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("the filler file");
    let block = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&block).and_then(|()| file.sync_data()) {
            Ok(()) => {}
            Err(error) if error.raw_os_error() == Some(28) => return, // ENOSPC
            Err(error) => panic!("filling {}: {error}", path.display()),
        }
    }
}

struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("an answer");
    Answer {
        status: response.status(),
        retry_after: response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
        body: response.json().await.unwrap_or(Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (mount, runuser) for a private cluster and a tmpfs: .ci/run runs it \
            (cargo test --test api private_cluster -- --ignored)"]
async fn private_cluster_a_full_tablespace_answers_503_never_500() {
    let mut cluster = PrivateCluster::start();
    let tablespace = cluster.mount_tmpfs("tablespace", "64m");
    let mut admin = PgConnection::establish(&cluster.url("postgres")).expect("connect");
    admin
        .batch_execute(&format!(
            "CREATE TABLESPACE small LOCATION '{}'",
            tablespace.display()
        ))
        .expect("a tablespace on the tmpfs");
    admin
        .batch_execute("CREATE DATABASE tb_full TABLESPACE small")
        .expect("a database in the tmpfs tablespace");
    let provider = FakeProvider::start(10).await;
    let service = start_service_with(&cluster.url("tb_full"), &provider.url, &[]).await;
    let client = reqwest::Client::new();
    let base = &service.base;
    let (account, key) = funded_kiosk(
        &client,
        base,
        json!({"name": "full disk", "max_active_reservations": 1000}),
        json!({"amount": 100_000, "external_ref": "before"}),
    )
    .await;
    let account: Uuid = account.parse().expect("an account id");
    let accounts = format!("{base}/v1/accounts/{account}");

    // Some rows in every table first, so that the refusals are not only
    // of a table's very first page.
    for _ in 0..20 {
        let reserve = json!({"request_id": Uuid::new_v4(), "amount": 1});
        let request = client
            .post(format!("{accounts}/reservations"))
            .bearer_auth(&key);
        let id = send(request.json(&reserve)).await.body["reservation_id"]
            .as_str()
            .expect("a reservation before the disk is full")
            .to_owned();
        let request = client
            .post(format!("{accounts}/reservations/{id}/commit"))
            .bearer_auth(&key);
        assert_eq!(send(request.json(&json!({}))).await.status, StatusCode::OK);
    }
    let before = 20;

    fill(&tablespace.join("filler"));

    // Reservations (each committed) and credits until the full
    // tablespace has refused enough of them: every answer is a success or
    // a 503 to retry.
    let mut acknowledged_reservations = Vec::new();
    let mut acknowledged_credits = 1;
    let mut unavailable = std::collections::BTreeMap::<&str, u32>::new();
    for round in 0..600 {
        if unavailable.values().sum::<u32>() >= 20 {
            break;
        }
        let (kind, answer) = if round % 10 == 9 {
            let credit = json!({"amount": 1, "external_ref": format!("during-{round}")});
            let request = client
                .post(format!("{accounts}/credits"))
                .bearer_auth(crate::helpers::ADMIN_KEY);
            ("credit", send(request.json(&credit)).await)
        } else {
            let reserve = json!({"request_id": Uuid::new_v4(), "amount": 1});
            let request = client
                .post(format!("{accounts}/reservations"))
                .bearer_auth(&key);
            ("reserve", send(request.json(&reserve)).await)
        };
        let (kind, answer) = match (kind, answer.status) {
            ("reserve", StatusCode::CREATED) => {
                let id = answer.body["reservation_id"]
                    .as_str()
                    .expect("an id")
                    .to_owned();
                acknowledged_reservations.push(id.clone());
                let request = client
                    .post(format!("{accounts}/reservations/{id}/commit"))
                    .bearer_auth(&key);
                ("commit", send(request.json(&json!({}))).await)
            }
            ("credit", StatusCode::CREATED) => {
                acknowledged_credits += 1;
                continue;
            }
            _ => (kind, answer),
        };
        match answer.status {
            StatusCode::OK => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(
                    answer.body["code"], "unavailable",
                    "{kind}: {}",
                    answer.body
                );
                assert_eq!(answer.retry_after.as_deref(), Some("1"), "{kind}");
                *unavailable.entry(kind).or_insert(0) += 1;
            }
            other => panic!(
                "{kind} answered {other} while the tablespace was full: {}",
                answer.body
            ),
        }
    }
    println!(
        "full tablespace: {} reservations and {acknowledged_credits} credits acknowledged, \
         503 by kind {unavailable:?}",
        acknowledged_reservations.len()
    );
    assert!(
        unavailable.values().sum::<u32>() >= 20,
        "the full tablespace refused only {unavailable:?}"
    );

    // Space again: writes come back by themselves.
    std::fs::remove_file(tablespace.join("filler")).expect("free the space");
    for _ in 0..10 {
        let reserve = json!({"request_id": Uuid::new_v4(), "amount": 1});
        let request = client
            .post(format!("{accounts}/reservations"))
            .bearer_auth(&key);
        let answer = send(request.json(&reserve)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "after: {}", answer.body);
        let id = answer.body["reservation_id"]
            .as_str()
            .expect("an id")
            .to_owned();
        let request = client
            .post(format!("{accounts}/reservations/{id}/commit"))
            .bearer_auth(&key);
        let answer = send(request.json(&json!({}))).await;
        assert_eq!(answer.status, StatusCode::OK, "after: {}", answer.body);
        acknowledged_reservations.push(id);
    }

    // Every acknowledged reservation and credit is in the books, which
    // balance.
    let mut conn = PgConnection::establish(&cluster.url("tb_full")).expect("connect");
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        count: i64,
    }
    let found: Count =
        diesel::sql_query("SELECT count(*) AS count FROM reservations WHERE id::text = ANY($1)")
            .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(
                &acknowledged_reservations,
            )
            .get_result(&mut conn)
            .expect("count reservations");
    assert_eq!(found.count as usize, acknowledged_reservations.len());
    let all: Count = diesel::sql_query("SELECT count(*) AS count FROM reservations")
        .get_result(&mut conn)
        .expect("count reservations");
    assert_eq!(
        all.count as usize,
        before + acknowledged_reservations.len(),
        "a refused reservation was kept"
    );
    let credits: Count = diesel::sql_query("SELECT count(*) AS count FROM credits")
        .get_result(&mut conn)
        .expect("count credits");
    assert_eq!(credits.count, acknowledged_credits);
    assert_account_invariants(&mut conn, account);
    drop(service);
}
