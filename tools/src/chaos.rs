//! `token-billing-tools chaos`: a seeded, reproducible fault run. It starts
//! several replicas of the service binary and the fake provider on loopback,
//! drives a kiosk workload (jobs with provider faults, re-sent and reused
//! request ids, explicit reservations committed, partly committed, released
//! or abandoned), injects faults on a schedule drawn from the seed (SIGKILL
//! of a replica, SIGSTOP longer than the lease and the TTL, PostgreSQL
//! `restart -m immediate`), lets the system recover, and then checks the
//! books. It exits non-zero on any violation.
//!
//! With `--failover-command` the only fault is the loss of the primary:
//! the command (`tests/failover/run.sh` passes one) kills the primary and
//! promotes its standby at a random moment, and the checks add that every
//! acknowledged reservation, commit, credit and job is on the new primary
//! (`failover`).
//!
//! It leaves nothing behind: every replica runs in its own process group
//! (the `faketime` wrapper forks the real process, so killing the wrapper
//! alone would orphan it); stopping a replica signals the whole group,
//! SIGTERM then SIGKILL after a grace of 3 s, and the cluster's `Drop`
//! kills every group still there when the run ends in any other way.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use uuid::Uuid;

mod failover;

use crate::fake_provider::build_fake_provider;
use token_billing::provider::fake::FakeBackend;

const ADMIN_KEY: &str = "chaos-admin-key-0123456789";
/// Short lifetimes so that faults longer than them happen within minutes.
const LEASE_SECONDS: u64 = 4;
const TTL_SECONDS: u64 = 12;
const PROVIDER_TIMEOUT_SECONDS: u64 = 3;

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Seed of the workload and the fault schedule (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds of workload under faults.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    #[arg(long, default_value_t = 12)]
    pub kiosks: usize,
    /// Accounts, each with few tokens, shared by the kiosks.
    #[arg(long, default_value_t = 3)]
    pub accounts: usize,
    /// Also restart PostgreSQL among the faults: with
    /// `--postgres-restart-command`, or else the cluster of this machine
    /// that the database URL reaches (the `pg_lsclusters` entry with its data
    /// directory: `pg_ctlcluster … restart -m immediate`). A URL that reaches
    /// no such cluster needs the command.
    #[arg(long)]
    pub restart_postgres: bool,
    /// The shell command that restarts the PostgreSQL the database URL
    /// reaches (for example `pg_ctl restart -m immediate -D /srv/pg`); it
    /// implies `--restart-postgres`. A command that exits non-zero fails the
    /// run.
    #[arg(long)]
    pub postgres_restart_command: Option<String>,
    /// Run the first replica under `faketime` with its clock 5 minutes
    /// ahead: expiry decisions must use the database clock.
    #[arg(long)]
    pub skewed_clock: bool,
    /// The service binary the replicas run (default: `token-billing` beside
    /// this binary).
    #[arg(long)]
    pub service_binary: Option<PathBuf>,
    /// A shell command that kills the database's primary and promotes its
    /// standby (the database URL must list both hosts with
    /// `target_session_attrs=read-write`). It runs once, at a moment drawn
    /// from the seed, and replaces the other faults.
    #[arg(long)]
    pub failover_command: Option<String>,
    /// With `--failover-command`: the failover is one fault among the
    /// others (SIGKILL, SIGSTOP, restarts), every tenth from the fifth on,
    /// instead of the run's only fault. A failover command that fails is a
    /// violation, like a restart command.
    #[arg(long, requires = "failover_command")]
    pub failover_among_faults: bool,
    /// The shortest pause between two faults, in milliseconds; each pause
    /// is drawn between it and twice it.
    #[arg(long, default_value_t = 3_000)]
    pub fault_gap_ms: u64,
}

/// How long the final recovery may take: every job terminal and every
/// hold settled, the last abandoned ones expired by a reaper after their
/// TTL.
const FINAL_RECOVERY_LIMIT: Duration = Duration::from_secs(90);

/// How long a stopped replica's process group gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// What a kiosk saw of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Ok,
    Refused,
    Indeterminate,
}

#[derive(Default)]
struct Journal {
    outcomes: BTreeMap<(&'static str, &'static str), u64>,
    latencies_ms: Vec<f64>,
    /// (account, request_id, job_id) of every job answer a kiosk got.
    job_answers: Vec<(Uuid, Uuid, Uuid)>,
    /// Jobs a kiosk saw succeed.
    jobs_seen_succeeded: Vec<Uuid>,
    /// (reservation, committed amount) of every commit a kiosk saw succeed.
    commits_seen: Vec<(Uuid, i64)>,
    /// Reservations a kiosk saw created.
    reservations_seen: Vec<Uuid>,
    /// Credits finance saw accepted.
    credits_seen: Vec<Uuid>,
    /// When the failover command started (the primary's kill).
    failover_at: Option<Instant>,
    /// The longest time between two reservations the failover probe saw
    /// accepted (from the failover command's start until it is done).
    first_reserve_after_failover: Option<Duration>,
    violations: Vec<String>,
    faults: BTreeMap<&'static str, u64>,
    recoveries_ms: Vec<(&'static str, f64)>,
}

type Shared = Arc<Mutex<Journal>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Journal> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Replica {
    child: Option<Child>,
    port: u16,
}

struct Cluster {
    binary: std::path::PathBuf,
    database_url: String,
    provider_url: String,
    replicas: Vec<Mutex<Replica>>,
    /// The replica whose wall clock runs ahead (under `faketime`).
    skewed: Option<usize>,
}

/// Where replica `index` writes its log: appended to
/// `$CHAOS_REPLICA_LOGS/replica<index>.log` when that directory is set (the
/// failover scripts keep it with the nodes' logs), else nowhere.
fn replica_log(index: usize) -> anyhow::Result<Stdio> {
    match std::env::var_os("CHAOS_REPLICA_LOGS") {
        Some(dir) => Ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(std::path::Path::new(&dir).join(format!("replica{index}.log")))?
            .into()),
        None => Ok(Stdio::null()),
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Cluster {
    fn spawn(&self, index: usize, port: u16) -> anyhow::Result<Child> {
        let mut command = if self.skewed == Some(index) {
            // Only the wall clock: tokio's timers read the monotonic clock.
            let mut command = Command::new("faketime");
            command
                .args(["-f", "+5m"])
                .arg(&self.binary)
                .env("DONT_FAKE_MONOTONIC", "1");
            command
        } else {
            Command::new(&self.binary)
        };
        Ok(command
            // Its own process group: signals reach the faketime wrapper and
            // the replica it forked alike.
            .process_group(0)
            .arg("serve")
            .env("DATABASE_URL", &self.database_url)
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("ADMIN_API_KEY", ADMIN_KEY)
            .env("PROVIDER", "http")
            .env("PROVIDER_URL", &self.provider_url)
            .env(
                "PROVIDER_TIMEOUT_SECONDS",
                PROVIDER_TIMEOUT_SECONDS.to_string(),
            )
            .env("JOB_LEASE_SECONDS", LEASE_SECONDS.to_string())
            .env("RESERVATION_TTL_SECONDS", TTL_SECONDS.to_string())
            .env("JOB_MAX_ATTEMPTS", "3")
            .env("JOB_RETRY_BACKOFF_MS", "200")
            .env("REAPER_SCHEDULE", "*/2 * * * * *")
            .env("WORKER_CONCURRENCY", "4")
            .env("DB_POOL_SIZE", "8")
            .env("RATE_LIMIT_PER_SECOND", "0")
            .env("SHUTDOWN_GRACE_SECONDS", "2")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(replica_log(index)?)
            .spawn()?)
    }

    fn url(&self, index: usize) -> String {
        let port = self.replicas[index]
            .lock()
            .map(|replica| replica.port)
            .unwrap_or(0);
        format!("http://127.0.0.1:{port}")
    }

    fn signal(&self, index: usize, signal: &str) {
        if let Ok(replica) = self.replicas[index].lock() {
            if let Some(child) = &replica.child {
                signal_group(child, signal);
            }
        }
    }

    fn restart(&self, index: usize) -> anyhow::Result<()> {
        let mut replica = self.replicas[index]
            .lock()
            .map_err(|_| anyhow::anyhow!("replica lock"))?;
        if let Some(mut child) = replica.child.take() {
            signal_group(&child, "-KILL");
            let _ = child.wait();
        }
        replica.child = Some(self.spawn(index, replica.port)?);
        Ok(())
    }

    /// SIGTERM to every replica's group, SIGKILL to what is left after the
    /// grace.
    fn stop_all(&self) {
        for index in 0..self.replicas.len() {
            self.signal(index, "-CONT");
            self.signal(index, "-TERM");
        }
        let deadline = Instant::now() + STOP_GRACE;
        for replica in &self.replicas {
            if let Ok(mut replica) = replica.lock() {
                if let Some(mut child) = replica.child.take() {
                    // Reap the leader first: a zombie still counts as alive.
                    while Instant::now() < deadline
                        && (matches!(child.try_wait(), Ok(None)) || group_alive(&child))
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    signal_group(&child, "-KILL");
                    let _ = child.wait();
                }
            }
        }
    }
}

impl Drop for Cluster {
    /// The run ended early (an error, a panic, a signal): no replica may
    /// outlive it.
    fn drop(&mut self) {
        for replica in &self.replicas {
            let mut replica = match replica.lock() {
                Ok(replica) => replica,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Some(mut child) = replica.child.take() {
                signal_group(&child, "-KILL");
                let _ = child.wait();
            }
        }
    }
}

/// Sends `signal` (e.g. `-TERM`) to the child's whole process group.
fn signal_group(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{}", child.id())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// True while any process of the child's group is alive.
fn group_alive(child: &Child) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{}", child.id())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The service binary: `--service-binary`, else `token-billing` beside
/// this executable (cargo builds both into one directory).
fn service_binary(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path);
    }
    let tools = std::env::current_exe()?;
    let sibling = tools.with_file_name("token-billing");
    anyhow::ensure!(
        sibling.is_file(),
        "the service binary {} is missing: build it (cargo build) or pass --service-binary",
        sibling.display()
    );
    Ok(sibling)
}

async fn ready(client: &reqwest::Client, url: &str) -> bool {
    matches!(client.get(format!("{url}/readyz")).send().await, Ok(response) if response.status().is_success())
}

/// Waits until every replica answers `/readyz`; returns the time it took.
async fn await_ready(
    client: &reqwest::Client,
    cluster: &Cluster,
    limit: Duration,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    loop {
        let mut all = true;
        for index in 0..cluster.replicas.len() {
            all &= ready(client, &cluster.url(index)).await;
        }
        if all {
            return Ok(started.elapsed().as_secs_f64() * 1000.0);
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "replicas not ready after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn record(shared: &Shared, kind: &'static str, seen: Seen, started: Instant) {
    let label = match seen {
        Seen::Ok => "ok",
        Seen::Refused => "refused",
        Seen::Indeterminate => "indeterminate",
    };
    let mut journal = lock(shared);
    *journal.outcomes.entry((kind, label)).or_insert(0) += 1;
    journal
        .latencies_ms
        .push(started.elapsed().as_secs_f64() * 1000.0);
}

/// Answers 500 seen by any client of the run (never expected: a database
/// that is away is a 503).
static SERVER_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sends one request; connection errors and timeouts are indeterminate.
async fn send(request: reqwest::RequestBuilder) -> (Seen, u16, Value) {
    match request.timeout(Duration::from_secs(5)).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            if status == 500 {
                SERVER_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
            let body = response.json().await.unwrap_or(Value::Null);
            let seen = match status {
                200..=299 => Seen::Ok,
                500..=599 => Seen::Indeterminate,
                _ => Seen::Refused,
            };
            (seen, status, body)
        }
        Err(_) => (Seen::Indeterminate, 0, Value::Null),
    }
}

fn uuid_of(body: &Value, field: &str) -> Option<Uuid> {
    body[field]
        .as_str()
        .and_then(|text| Uuid::parse_str(text).ok())
}

fn provider_params(rng: &mut StdRng, guest: u64) -> Value {
    let roll: u32 = rng.gen_range(0..100);
    let simulate = match roll {
        0..=59 => json!({"delay_ms": rng.gen_range(100..1500)}),
        60..=69 => json!({"outcome": "fail", "delay_ms": 200}),
        70..=79 => json!({"fail_times": rng.gen_range(1..3), "delay_ms": 300}),
        80..=84 => json!({"outcome": "hang"}),
        85..=94 => json!({"outcome": "drop_after_success", "delay_ms": 100}),
        _ => json!({"delay_ms": 2_500}),
    };
    json!({"simulate": simulate, "guest": guest})
}

struct Kiosk {
    rng: StdRng,
    client: reqwest::Client,
    cluster: Arc<Cluster>,
    accounts: Arc<Vec<(Uuid, String)>>,
    journal: Shared,
}

impl Kiosk {
    fn replica_url(&mut self) -> String {
        let index = self.rng.gen_range(0..self.cluster.replicas.len());
        self.cluster.url(index)
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        let mut guest = 0u64;
        while !stop.load(Ordering::Relaxed) {
            guest += 1;
            let account = self.rng.gen_range(0..self.accounts.len());
            if self.rng.gen_bool(0.7) {
                self.job(account, guest).await;
            } else {
                self.reservation(account).await;
            }
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(20..200))).await;
        }
    }

    /// One guest action: a job, re-sent after indeterminate answers (and
    /// sometimes at once, concurrently), occasionally reused with another
    /// body, then waited for.
    async fn job(&mut self, index: usize, guest: u64) {
        let (account, key) = self.accounts[index].clone();
        let request_id = Uuid::new_v4();
        let body = json!({"request_id": request_id, "kind": "standard", "params": provider_params(&mut self.rng, guest)});
        let duplicate = self.rng.gen_bool(0.1);
        let mut answered = None;
        for attempt in 0..4 {
            let url = format!("{}/v1/accounts/{account}/jobs", self.replica_url());
            let started = Instant::now();
            let (seen, _, answer) = if duplicate && attempt == 0 {
                let twin = self.client.post(&url).bearer_auth(&key).json(&body);
                let other = format!("{}/v1/accounts/{account}/jobs", self.replica_url());
                let (first, second) = tokio::join!(
                    send(twin),
                    send(self.client.post(other).bearer_auth(&key).json(&body))
                );
                if let (Some(a), Some(b)) =
                    (uuid_of(&first.2, "job_id"), uuid_of(&second.2, "job_id"))
                {
                    if a != b {
                        lock(&self.journal).violations.push(format!(
                            "concurrent duplicate {request_id} got jobs {a} and {b}"
                        ));
                    }
                }
                if first.0 == Seen::Ok {
                    first
                } else {
                    second
                }
            } else {
                send(self.client.post(url).bearer_auth(&key).json(&body)).await
            };
            record(&self.journal, "job_create", seen, started);
            if seen != Seen::Indeterminate {
                answered = Some((seen, answer));
                break;
            }
            tokio::time::sleep(Duration::from_millis(300 * (attempt + 1))).await;
        }
        let Some((Seen::Ok, answer)) = answered else {
            return;
        };
        let Some(job_id) = uuid_of(&answer, "job_id") else {
            return;
        };
        lock(&self.journal)
            .job_answers
            .push((account, request_id, job_id));
        if self.rng.gen_bool(0.02) {
            // The same request_id with another body must be refused.
            let reused =
                json!({"request_id": request_id, "kind": "standard", "params": {"other": guest}});
            let url = format!("{}/v1/accounts/{account}/jobs", self.replica_url());
            let started = Instant::now();
            let (seen, status, _) =
                send(self.client.post(url).bearer_auth(&key).json(&reused)).await;
            record(&self.journal, "job_reuse", seen, started);
            if seen == Seen::Ok {
                lock(&self.journal).violations.push(format!(
                    "reused request_id {request_id} accepted ({status})"
                ));
            }
        }
        let url = format!(
            "{}/v1/accounts/{account}/jobs/{request_id}?wait_seconds=8",
            self.replica_url()
        );
        let started = Instant::now();
        let (seen, _, job) = send(self.client.get(url).bearer_auth(&key)).await;
        record(&self.journal, "job_wait", seen, started);
        if job["status"] == "succeeded" {
            lock(&self.journal).jobs_seen_succeeded.push(job_id);
        }
    }

    /// An explicit reservation: committed, partly committed, released or
    /// abandoned (left to expire).
    async fn reservation(&mut self, index: usize) {
        let (account, key) = self.accounts[index].clone();
        let amount: i64 = self.rng.gen_range(1..3);
        let body = json!({"request_id": Uuid::new_v4(), "amount": amount});
        let mut reservation = None;
        for _ in 0..3 {
            let url = format!("{}/v1/accounts/{account}/reservations", self.replica_url());
            let started = Instant::now();
            let (seen, _, answer) = send(self.client.post(url).bearer_auth(&key).json(&body)).await;
            record(&self.journal, "reserve", seen, started);
            if seen != Seen::Indeterminate {
                reservation = (seen == Seen::Ok)
                    .then(|| uuid_of(&answer, "reservation_id"))
                    .flatten();
                if let Some(id) = reservation {
                    lock(&self.journal).reservations_seen.push(id);
                }
                break;
            }
        }
        let Some(id) = reservation else { return };
        let roll: u32 = self.rng.gen_range(0..100);
        let (action, body, committed) = match roll {
            0..=39 => ("commit", json!({}), amount),
            40..=59 => ("commit", json!({"amount": 1}), 1),
            60..=79 => ("release", json!({}), 0),
            _ => return,
        };
        for _ in 0..3 {
            let url = format!(
                "{}/v1/accounts/{account}/reservations/{id}/{action}",
                self.replica_url()
            );
            let started = Instant::now();
            let (seen, _, _) = send(self.client.post(url).bearer_auth(&key).json(&body)).await;
            record(&self.journal, action, seen, started);
            if seen == Seen::Ok && committed > 0 {
                lock(&self.journal).commits_seen.push((id, committed));
            }
            if seen != Seen::Indeterminate {
                break;
            }
        }
    }
}

/// Finance tops the accounts up every few seconds (idempotent credits, sent
/// to any replica, retried with the same external_ref when indeterminate),
/// so the low balances keep running out and refilling; half of them are
/// grants that lapse during the run.
async fn top_up(
    cluster: Arc<Cluster>,
    accounts: Arc<Vec<(Uuid, String)>>,
    journal: Shared,
    client: reqwest::Client,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(2_000..4_000))).await;
        round += 1;
        for (account, _) in accounts.iter() {
            // Every other top-up is an event's: a grant that lapses 10 to
            // 30 s later, often while reservations hold its tokens, at a
            // random priority (so spends draw it first or last).
            let mut body = json!({"amount": rng.gen_range(5..15), "external_ref": format!("top-up-{account}-{round}")});
            if round.is_multiple_of(2) {
                let lapses = chrono::Utc::now() + chrono::Duration::seconds(rng.gen_range(10..30));
                body["expires_at"] = json!(lapses.to_rfc3339());
                body["priority"] = json!(rng.gen_range(0..=100));
            }
            for _ in 0..5 {
                let index = rng.gen_range(0..cluster.replicas.len());
                let url = format!("{}/v1/accounts/{account}/credits", cluster.url(index));
                let started = Instant::now();
                let (seen, _, answer) =
                    send(client.post(url).bearer_auth(ADMIN_KEY).json(&body)).await;
                record(&journal, "credit", seen, started);
                if let Some(credit) = uuid_of(&answer, "credit_id").filter(|_| seen == Seen::Ok) {
                    lock(&journal).credits_seen.push(credit);
                }
                if seen != Seen::Indeterminate {
                    break;
                }
            }
        }
    }
}

/// What `inject_faults` does to PostgreSQL: the commands that restart it
/// and fail it over (every tenth fault from the fifth on), and the
/// shortest pause between two faults.
struct DatabaseFaults {
    restart_command: Option<String>,
    failover_command: Option<String>,
    gap_ms: u64,
}

/// Injects faults on the seed's schedule until `stop`. A restart or
/// failover command that fails is a violation, and no fault follows it.
async fn inject_faults(
    cluster: Arc<Cluster>,
    journal: Shared,
    client: reqwest::Client,
    mut rng: StdRng,
    database: DatabaseFaults,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let restart_command = database.restart_command;
    let gap_ms = database.gap_ms.max(1);
    let mut number = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(gap_ms..gap_ms * 2))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        number += 1;
        let index = rng.gen_range(0..cluster.replicas.len());
        let kinds: &[&'static str] = if restart_command.is_some() {
            &["sigkill", "sigstop", "postgres_restart"]
        } else {
            &["sigkill", "sigstop"]
        };
        let drawn = kinds[rng.gen_range(0..kinds.len())];
        let (kind, command) = match &database.failover_command {
            Some(failover) if number % 10 == 5 => ("primary_failover", Some(failover)),
            _ => (drawn, restart_command.as_ref()),
        };
        *lock(&journal).faults.entry(kind).or_insert(0) += 1;
        let fault_end = match (kind, command) {
            ("sigkill", _) => {
                cluster.signal(index, "-KILL");
                tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1_500))).await;
                cluster.restart(index)?;
                Instant::now()
            }
            ("sigstop", _) => {
                // Longer than the lease and the TTL: its late writes must be fenced off.
                cluster.signal(index, "-STOP");
                tokio::time::sleep(Duration::from_secs(TTL_SECONDS + 2)).await;
                cluster.signal(index, "-CONT");
                Instant::now()
            }
            (_, Some(command)) => {
                let status = run_shell(command).await?;
                if !status.success() {
                    // The command is not printed: it may hold a password.
                    let what = if kind == "primary_failover" {
                        "failover"
                    } else {
                        "restart"
                    };
                    lock(&journal).violations.push(format!(
                        "the PostgreSQL {what} command failed ({status}): the run \
                         injected no fault after it"
                    ));
                    return Ok(());
                }
                Instant::now()
            }
            (_, None) => unreachable!("a database fault is drawn only with its command"),
        };
        let recovered = await_ready(&client, &cluster, Duration::from_secs(60)).await?;
        let since_fault = fault_end.elapsed().as_secs_f64() * 1000.0;
        lock(&journal)
            .recoveries_ms
            .push((kind, recovered.max(since_fault)));
    }
    Ok(())
}

/// Runs `command` with `sh -c` (its output goes to stderr); its status.
async fn run_shell(command: &str) -> anyhow::Result<std::process::ExitStatus> {
    let command = command.to_owned();
    Ok(tokio::task::spawn_blocking(move || {
        Command::new("sh")
            .arg("-c")
            .arg(&command)
            .stdout(Stdio::null())
            .status()
    })
    .await??)
}

/// The command that restarts PostgreSQL for the run's `postgres_restart`
/// faults: `--postgres-restart-command`; else, with `--restart-postgres`,
/// `pg_ctlcluster … restart -m immediate` of the cluster of this machine
/// whose data directory is the one the database URL reaches (asked of the
/// server itself, so that the URL is honoured); else none.
fn postgres_restart_command(
    maintenance_url: &str,
    args: &ChaosArgs,
) -> anyhow::Result<Option<String>> {
    if let Some(command) = &args.postgres_restart_command {
        return Ok(Some(command.clone()));
    }
    if !args.restart_postgres {
        return Ok(None);
    }
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
    }
    let mut conn = PgConnection::establish(maintenance_url)?;
    let data_directory = diesel::sql_query("SELECT current_setting('data_directory') AS setting")
        .get_result::<Setting>(&mut conn)
        .map_err(|error| {
            anyhow::anyhow!(
                "--restart-postgres: cannot ask the server for its data directory ({error}); \
                 say how to restart it with --postgres-restart-command"
            )
        })?
        .setting;
    let listed = Command::new("pg_lsclusters")
        .arg("--no-header")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    cluster_restart_command(&listed, &data_directory)
        .map(Some)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--restart-postgres: the database URL reaches the server of {data_directory}, \
                 which is no cluster of this machine's pg_lsclusters; say how to restart it \
                 with --postgres-restart-command"
            )
        })
}

/// The `pg_ctlcluster` restart of the cluster with `data_directory` among
/// `pg_lsclusters --no-header` lines (version, name, port, status, owner,
/// data directory, log file).
fn cluster_restart_command(listed: &str, data_directory: &str) -> Option<String> {
    let wanted = data_directory.trim_end_matches('/');
    listed.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() >= 6 && fields[5].trim_end_matches('/') == wanted).then(|| {
            format!(
                "pg_ctlcluster --skip-systemctl-redirect {} {} restart -m immediate",
                fields[0], fields[1]
            )
        })
    })
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

fn count(conn: &mut PgConnection, sql: &str) -> anyhow::Result<i64> {
    Ok(diesel::sql_query(sql).get_result::<Count>(conn)?.count)
}

/// The end-of-run checks, straight against the database.
fn check_books(conn: &mut PgConnection, journal: &Journal) -> anyhow::Result<Vec<String>> {
    let mut violations = journal.violations.clone();
    for discrepancy in token_billing::domain::checks::find_violations(conn)? {
        violations.push(format!("invariant: {discrepancy:?}"));
    }
    for disagreement in token_billing::domain::checks::events_disagreeing_with_books(conn)? {
        violations.push(format!("events: {disagreement}"));
    }
    for discrepancy in token_billing::domain::checks::grants_disagreeing_with_ledger(conn)? {
        violations.push(format!("grant: {discrepancy:?}"));
    }
    let checks = [
        // A commit drawn from several grants writes one entry per grant:
        // charged twice is more committed in the ledger than on the row.
        ("jobs charged twice", "SELECT count(*) AS count FROM (SELECT e.reservation_id FROM ledger_entries e JOIN reservations r ON r.id = e.reservation_id WHERE e.kind = 'commit' GROUP BY e.reservation_id HAVING sum(e.amount) > max(r.committed_amount)) twice"),
        ("held reservations past their expiry", "SELECT count(*) AS count FROM reservations WHERE state = 'held' AND expires_at < now()"),
        // Nothing holds tokens once the workload has stopped and every TTL
        // has run out (`FINAL_RECOVERY_LIMIT` is longer than the TTL).
        ("reservations still held after the final recovery", "SELECT count(*) AS count FROM reservations WHERE state = 'held'"),
        ("jobs not terminal", "SELECT count(*) AS count FROM generation_jobs WHERE status IN ('queued', 'running')"),
        ("succeeded jobs without a committed reservation", "SELECT count(*) AS count FROM generation_jobs j JOIN reservations r ON r.id = j.reservation_id WHERE j.status = 'succeeded' AND r.state <> 'committed'"),
        ("failed jobs with a committed reservation", "SELECT count(*) AS count FROM generation_jobs j JOIN reservations r ON r.id = j.reservation_id WHERE j.status = 'failed' AND r.state = 'committed'"),
    ];
    for (name, sql) in checks {
        let found = count(conn, sql)?;
        if found > 0 {
            violations.push(format!("{name}: {found}"));
        }
    }
    for (account, request_id, job_id) in &journal.job_answers {
        let found = diesel::sql_query(
            "SELECT count(*) AS count FROM generation_jobs WHERE account_id = $1 AND request_id = $2 AND id = $3",
        )
        .bind::<SqlUuid, _>(account)
        .bind::<SqlUuid, _>(request_id)
        .bind::<SqlUuid, _>(job_id)
        .get_result::<Count>(conn)?
        .count;
        if found != 1 {
            violations.push(format!(
                "request_id {request_id} was answered with job {job_id}, which is not its job"
            ));
        }
    }
    for job_id in &journal.jobs_seen_succeeded {
        let commits = diesel::sql_query(
            // One commit, however many grants it drew from (one entry per
            // grant, all written at once).
            "SELECT count(DISTINCT l.created_at) AS count FROM ledger_entries l \
             JOIN generation_jobs j ON j.reservation_id = l.reservation_id \
             WHERE j.id = $1 AND l.kind = 'commit'",
        )
        .bind::<SqlUuid, _>(job_id)
        .get_result::<Count>(conn)?
        .count;
        if commits != 1 {
            violations.push(format!(
                "job {job_id} was seen succeeding but has {commits} commits"
            ));
        }
    }
    violations.extend(failover::acknowledged_missing(conn, journal)?);
    for (reservation, amount) in &journal.commits_seen {
        let committed = diesel::sql_query(
            "SELECT count(*) AS count FROM reservations WHERE id = $1 AND state = 'committed' AND committed_amount = $2",
        )
        .bind::<SqlUuid, _>(reservation)
        .bind::<BigInt, _>(amount)
        .get_result::<Count>(conn)?
        .count;
        if committed != 1 {
            violations.push(format!(
                "reservation {reservation} was seen committed ({amount}) but is not"
            ));
        }
    }
    let report = token_billing::domain::reconciliation::reconcile(
        conn,
        chrono::Utc::now() - chrono::Duration::days(1),
        chrono::Utc::now() + chrono::Duration::seconds(1),
        None,
    )?;
    if report.status != "ok" {
        violations.push(format!(
            "reconciliation: {} discrepancies",
            report.discrepancies.len()
        ));
    }
    Ok(violations)
}

async fn set_up_accounts(
    client: &reqwest::Client,
    url: &str,
    count: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Vec<(Uuid, String)>> {
    let mut accounts = Vec::new();
    for index in 0..count {
        let post = |path: String, body: Value| {
            client
                .post(format!("{url}{path}"))
                .bearer_auth(ADMIN_KEY)
                .json(&body)
                .send()
        };
        let account: Value = post(
            "/v1/accounts".into(),
            json!({"name": format!("chaos {index}"), "max_active_reservations": 6}),
        )
        .await?
        .json()
        .await?;
        let id =
            uuid_of(&account, "account_id").ok_or_else(|| anyhow::anyhow!("account: {account}"))?;
        let tokens: i64 = rng.gen_range(20..40);
        post(
            format!("/v1/accounts/{id}/credits"),
            json!({"amount": tokens, "external_ref": format!("chaos-{id}")}),
        )
        .await?;
        let key: Value = post(
            format!("/v1/accounts/{id}/api-keys"),
            json!({"scope": "kiosk", "label": "chaos"}),
        )
        .await?
        .json()
        .await?;
        accounts.push((id, key["key"].as_str().unwrap_or_default().to_owned()));
    }
    Ok(accounts)
}

fn summary(seed: u64, journal: &Journal, violations: &[String], elapsed: Duration) {
    let mut latencies = journal.latencies_ms.clone();
    latencies.sort_by(f64::total_cmp);
    println!("chaos seed={seed} elapsed_s={:.0}", elapsed.as_secs_f64());
    println!("faults: {:?}", journal.faults);
    let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (kind, ms) in &journal.recoveries_ms {
        by_kind.entry(kind).or_default().push(*ms);
    }
    let mut worst_of_all: Option<(f64, &str)> = None;
    for (kind, times) in by_kind {
        let worst = times.iter().copied().fold(0.0, f64::max);
        println!(
            "recovery after {kind}: {} faults, worst {worst:.0} ms",
            times.len()
        );
        if worst_of_all.is_none_or(|(most, _)| worst > most) {
            worst_of_all = Some((worst, kind));
        }
    }
    if let Some((worst, kind)) = worst_of_all {
        println!("worst recovery: {worst:.0} ms (after {kind})");
    }
    let operations: u64 = journal.outcomes.values().sum();
    let faults: u64 = journal.faults.values().sum();
    println!("totals: {operations} operations, {faults} faults");
    for ((kind, outcome), count) in &journal.outcomes {
        println!("operations {kind}/{outcome}: {count}");
    }
    println!(
        "latency ms: p50={:.1} p99={:.1} max={:.1}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "kiosk observations: {} job answers, {} successes seen, {} commits seen",
        journal.job_answers.len(),
        journal.jobs_seen_succeeded.len(),
        journal.commits_seen.len()
    );
    println!("answers 500: {}", SERVER_ERRORS.load(Ordering::Relaxed));
    if let Some(recovered) = journal.first_reserve_after_failover {
        println!(
            "failover: longest time without an accepted reservation: {:.0} ms (probe every 50 ms)",
            recovered.as_secs_f64() * 1000.0
        );
    } else if journal.failover_at.is_some() {
        println!("failover: no reservation accepted after the primary's kill");
    }
    if violations.is_empty() {
        println!("violations: 0");
    } else {
        for violation in violations {
            println!("VIOLATION: {violation}");
        }
    }
}

/// Connects to the database just created. With several hosts, libpq
/// stops at the first server that refuses the connection after it
/// answered, and a standby that has not yet replayed the `DROP DATABASE`
/// and `CREATE DATABASE` refuses it ("database … does not exist", "cannot
/// connect to invalid database"): try again for up to 30 s.
fn connect_once_created(database_url: &str) -> anyhow::Result<PgConnection> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match PgConnection::establish(database_url) {
            Err(error)
                if ["does not exist", "invalid database"]
                    .iter()
                    .any(|refusal| error.to_string().contains(refusal))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            connected => return Ok(connected?),
        }
    }
}

/// Runs the chaos run against `database_url` (a scratch database it
/// recreates). `Ok(false)` when a check failed.
pub async fn run(database_url: &str, args: ChaosArgs) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(rand::random);
    println!("chaos seed={seed} (rerun with --seed {seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let (name, maintenance) = token_billing::db::split_database_url(database_url)?;
    anyhow::ensure!(
        name.starts_with("tb_chaos"),
        "the chaos run recreates its database: name it tb_chaos…"
    );
    {
        let mut admin = PgConnection::establish(&maintenance)?;
        diesel::sql_query(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut admin)?;
    }
    let restart_command = postgres_restart_command(&maintenance, &args)?;
    token_billing::db::create_database_if_missing(database_url)?;
    let mut conn = connect_once_created(database_url)?;
    token_billing::db::run_migrations(&mut conn)?;
    token_billing::engine::install::install(&mut conn)?;
    drop(conn);

    let backend = Arc::new(FakeBackend::new(500, 0.0));
    let (provider, provider_address) = build_fake_provider("127.0.0.1:0", backend)?;
    let provider_handle = provider.handle();
    tokio::spawn(provider);
    let mut replicas = Vec::new();
    for _ in 0..args.replicas {
        replicas.push(Mutex::new(Replica {
            child: None,
            port: free_port()?,
        }));
    }
    let cluster = Arc::new(Cluster {
        binary: service_binary(args.service_binary.clone())?,
        database_url: database_url.to_owned(),
        provider_url: format!("http://{provider_address}"),
        replicas,
        skewed: args.skewed_clock.then_some(0),
    });
    if args.skewed_clock {
        anyhow::ensure!(
            Command::new("faketime")
                .arg("-f")
                .arg("+0")
                .arg("true")
                .status()
                .is_ok_and(|status| status.success()),
            "--skewed-clock needs faketime (apt-get install faketime)"
        );
        println!("replica 0 runs with its clock 5 minutes ahead (faketime)");
    }
    for index in 0..args.replicas {
        cluster.restart(index)?;
    }
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(2))
        .build()?;
    await_ready(&client, &cluster, Duration::from_secs(60)).await?;
    let accounts =
        Arc::new(set_up_accounts(&client, &cluster.url(0), args.accounts, &mut rng).await?);

    let started = Instant::now();
    let journal: Shared = Arc::new(Mutex::new(Journal::default()));
    let stop = Arc::new(AtomicBool::new(false));
    // The failover probe's own account: its reservations never compete
    // with the kiosks' few tokens.
    let probe_account = match args.failover_command {
        Some(_) if !args.failover_among_faults => {
            set_up_accounts(&client, &cluster.url(0), 1, &mut rng)
                .await?
                .pop()
        }
        _ => None,
    };
    let faults = match (args.failover_command.clone(), probe_account) {
        (Some(command), Some(probe_account)) => tokio::spawn(failover::fail_over_once(
            command,
            Arc::clone(&journal),
            StdRng::seed_from_u64(seed ^ 0xFA17),
            args.seconds,
            failover::Probe {
                cluster: Arc::clone(&cluster),
                account: probe_account,
                client: client.clone(),
            },
        )),
        _ => tokio::spawn(inject_faults(
            Arc::clone(&cluster),
            Arc::clone(&journal),
            client.clone(),
            StdRng::seed_from_u64(seed ^ 0xFA17),
            DatabaseFaults {
                restart_command,
                failover_command: args.failover_command.clone(),
                gap_ms: args.fault_gap_ms,
            },
            Arc::clone(&stop),
        )),
    };
    let finance = tokio::spawn(top_up(
        Arc::clone(&cluster),
        Arc::clone(&accounts),
        Arc::clone(&journal),
        client.clone(),
        StdRng::seed_from_u64(seed ^ 0xF1A),
        Arc::clone(&stop),
    ));
    let kiosks: Vec<_> = (0..args.kiosks)
        .map(|index| {
            let kiosk = Kiosk {
                rng: StdRng::seed_from_u64(seed.wrapping_add(index as u64 + 1)),
                client: client.clone(),
                cluster: Arc::clone(&cluster),
                accounts: Arc::clone(&accounts),
                journal: Arc::clone(&journal),
            };
            tokio::spawn(kiosk.run(Arc::clone(&stop)))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for kiosk in kiosks {
        kiosk.await?;
    }
    faults.await??;
    finance.await?;

    // Recovery: every replica up; every job terminal; every reservation
    // settled or expired, the last abandoned holds included: their TTL runs
    // past the workload, and the reapers (every 2 s) must expire them too.
    for index in 0..args.replicas {
        cluster.signal(index, "-CONT");
    }
    await_ready(&client, &cluster, Duration::from_secs(60)).await?;
    let recovery_started = Instant::now();
    let mut conn = PgConnection::establish(database_url)?;
    loop {
        let open = count(
            &mut conn,
            "SELECT count(*) AS count FROM generation_jobs WHERE status IN ('queued', 'running')",
        )? + count(
            &mut conn,
            "SELECT count(*) AS count FROM reservations WHERE state = 'held'",
        )?;
        if open == 0 || recovery_started.elapsed() > FINAL_RECOVERY_LIMIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "final recovery: {:.1} s",
        recovery_started.elapsed().as_secs_f64()
    );
    let journal = std::mem::take(&mut *lock(&journal));
    let mut violations = check_books(&mut conn, &journal)?;
    violations.extend(failover::failover_violations(
        &journal,
        SERVER_ERRORS.load(Ordering::Relaxed),
    ));
    cluster.stop_all();
    provider_handle.stop(false).await;
    summary(seed, &journal, &violations, started.elapsed());
    Ok(violations.is_empty())
}

/// The nearest-rank percentile of a sorted sample (NaN when empty).
fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (quantile * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::cluster_restart_command;

    #[test]
    fn the_restart_command_is_the_cluster_with_the_servers_data_directory() {
        let listed = "15 main  5432 online postgres /var/lib/postgresql/15/main /var/log/postgresql/postgresql-15-main.log\n\
                      15 other 5433 online postgres /srv/pg/other /var/log/postgresql/postgresql-15-other.log\n";
        assert_eq!(
            cluster_restart_command(listed, "/srv/pg/other/").as_deref(),
            Some("pg_ctlcluster --skip-systemctl-redirect 15 other restart -m immediate")
        );
        assert_eq!(
            cluster_restart_command(listed, "/var/lib/postgresql/15/main").as_deref(),
            Some("pg_ctlcluster --skip-systemctl-redirect 15 main restart -m immediate")
        );
        assert_eq!(cluster_restart_command(listed, "/tmp/private"), None);
    }
}
