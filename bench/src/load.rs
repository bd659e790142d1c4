//! `token-billing-bench load`: simulated kiosk fleets over real HTTP with
//! keep-alive, against a running service. Scenarios:
//! - `spread`: reserve → commit cycles over many accounts (a kiosk key each);
//! - `hot`: the same cycles, all on one account;
//! - `jobs`: the full job pipeline (create, long-poll to terminal) with the
//!   simulated provider at zero delay.
//!
//! It reports throughput and latency percentiles, the service's peak RSS
//! (from `/proc/<pid>/status` when `--service-pid` is given), and then
//! checks the books with the reconciliation endpoint: a fast wrong answer
//! counts as zero.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::percentile;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Spread,
    Hot,
    Jobs,
}

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    #[arg(long, env = "BENCH_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: String,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Concurrent kiosks (connections).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Seconds of measured load (after a 2 s warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Accounts of the `spread` scenario.
    #[arg(long, default_value_t = 1_000)]
    pub accounts: usize,
    /// PID of the service, to report its peak RSS (VmHWM).
    #[arg(long)]
    pub service_pid: Option<u32>,
    /// A shell command started when the measured window opens (after the
    /// warm-up), e.g. a flood of events; it must succeed.
    #[arg(long)]
    pub on_measure: Option<String>,
    /// The `jobs` scenario's simulated provider delay per job, in ms.
    #[arg(long, default_value_t = 0)]
    pub job_delay_ms: u64,
    /// Credits per account, each its own grant (1 … 3): the account's
    /// tokens split evenly, priorities 0, 50 and 100 in turn, so spending
    /// draws from them in turn; all but the last expire (in 30 and 60
    /// days). With 1 the credit carries no priority and no expiry (an older
    /// service knows neither).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub grants: u8,
}

struct Fleet {
    client: reqwest::Client,
    url: String,
    /// (account id, kiosk key) per account.
    accounts: Vec<(String, String)>,
    job_delay_ms: u64,
}

async fn send(request: reqwest::RequestBuilder) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let response = request.send().await?;
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

pub(crate) async fn post_ok(
    client: &reqwest::Client,
    url: String,
    key: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let (status, body) = send(client.post(url).bearer_auth(key).json(&body)).await?;
    anyhow::ensure!(status.is_success(), "HTTP {status}: {body}");
    Ok(body)
}

async fn set_up(args: &LoadArgs, client: &reqwest::Client) -> anyhow::Result<Fleet> {
    let count = if args.scenario == Scenario::Spread {
        args.accounts
    } else {
        1
    };
    let mut accounts = Vec::with_capacity(count);
    let tokens = 1_000_000;
    for index in 0..count {
        let account = post_ok(
            client,
            format!("{}/v1/accounts", args.url),
            &args.admin_key,
            json!({"name": format!("load {index}"), "max_active_reservations": 0}),
        )
        .await?;
        let id = account["account_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let grants = i64::from(args.grants);
        for grant in 0..grants {
            let mut credit = json!({
                "amount": tokens / grants,
                "external_ref": format!("load-{}", Uuid::new_v4()),
            });
            if grants > 1 {
                credit["priority"] = json!(grant * 50);
            }
            // With several grants, all but the last expire (30 and 60 days
            // ahead: nothing lapses during a run, but every spend looks for
            // lapsed grants among them).
            if grant + 1 < grants {
                credit["expires_at"] = json!((chrono::Utc::now()
                    + chrono::Duration::days(30 * (grant + 1)))
                .to_rfc3339());
            }
            post_ok(
                client,
                format!("{}/v1/accounts/{id}/credits", args.url),
                &args.admin_key,
                credit,
            )
            .await?;
        }
        let key = post_ok(
            client,
            format!("{}/v1/accounts/{id}/api-keys", args.url),
            &args.admin_key,
            json!({"scope": "kiosk", "label": "load"}),
        )
        .await?;
        accounts.push((id, key["key"].as_str().unwrap_or_default().to_owned()));
    }
    Ok(Fleet {
        client: client.clone(),
        url: args.url.clone(),
        accounts,
        job_delay_ms: args.job_delay_ms,
    })
}

/// One kiosk action; returns the latencies of its requests.
async fn cycle(fleet: &Fleet, scenario: Scenario, pick: usize) -> anyhow::Result<Vec<f64>> {
    let (account, key) = &fleet.accounts[pick % fleet.accounts.len()];
    let mut latencies = Vec::with_capacity(2);
    match scenario {
        Scenario::Spread | Scenario::Hot => {
            let started = Instant::now();
            let body = json!({"request_id": Uuid::new_v4(), "amount": 1});
            let reservation = post_ok(
                &fleet.client,
                format!("{}/v1/accounts/{account}/reservations", fleet.url),
                key,
                body,
            )
            .await?;
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            let id = reservation["reservation_id"].as_str().unwrap_or_default();
            let started = Instant::now();
            let (status, body) = send(
                fleet
                    .client
                    .post(format!(
                        "{}/v1/accounts/{account}/reservations/{id}/commit",
                        fleet.url
                    ))
                    .bearer_auth(key),
            )
            .await?;
            anyhow::ensure!(status.is_success(), "commit: HTTP {status}: {body}");
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        Scenario::Jobs => {
            let started = Instant::now();
            let request_id = Uuid::new_v4();
            let body = json!({"request_id": request_id, "kind": "standard", "params": {"simulate": {"delay_ms": fleet.job_delay_ms}}});
            post_ok(
                &fleet.client,
                format!("{}/v1/accounts/{account}/jobs", fleet.url),
                key,
                body,
            )
            .await?;
            let (_, job) = send(
                fleet
                    .client
                    .get(format!(
                        "{}/v1/accounts/{account}/jobs/{request_id}?wait_seconds=30",
                        fleet.url
                    ))
                    .bearer_auth(key),
            )
            .await?;
            anyhow::ensure!(job["status"] == "succeeded", "job: {job}");
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(latencies)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

pub async fn run_load(args: LoadArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let fleet = Arc::new(set_up(&args, &client).await?);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut kiosks = Vec::new();
    for kiosk in 0..args.concurrency {
        let (fleet, measuring, stop, scenario) = (
            Arc::clone(&fleet),
            Arc::clone(&measuring),
            Arc::clone(&stop),
            args.scenario,
        );
        kiosks.push(tokio::spawn(async move {
            let (mut cycles, mut latencies) = (0u64, Vec::new());
            let mut pick = kiosk.wrapping_mul(7919);
            while !stop.load(Ordering::Relaxed) {
                pick = pick
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let result = cycle(&fleet, scenario, pick >> 17).await?;
                if measuring.load(Ordering::Relaxed) {
                    cycles += 1;
                    latencies.extend(result);
                }
            }
            Ok::<_, anyhow::Error>((cycles, latencies))
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let side_load = args.on_measure.as_deref().map(|command| {
        tokio::process::Command::new("sh")
            .args(["-c", command])
            .status()
    });
    let side_load = side_load.map(tokio::spawn);
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    if let Some(side_load) = side_load {
        let status = side_load.await??;
        anyhow::ensure!(status.success(), "--on-measure failed: {status}");
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (mut cycles, mut latencies) = (0u64, Vec::new());
    for kiosk in kiosks {
        let (done, observed) = kiosk.await??;
        cycles += done;
        latencies.extend(observed);
    }
    latencies.sort_by(f64::total_cmp);
    let report: Value = send(
        client
            .get(format!("{}/v1/reconciliation", args.url))
            .bearer_auth(&args.admin_key),
    )
    .await
    .map(|(_, body)| body)
    .unwrap_or(Value::Null);
    let books_ok = report["status"] == "ok";
    let throughput = if books_ok {
        cycles as f64 / elapsed
    } else {
        0.0
    };
    println!(
        "scenario={:?} concurrency={} accounts={} cycles_per_s={:.0} requests={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} peak_rss_mib={} books={}",
        args.scenario,
        args.concurrency,
        fleet.accounts.len(),
        throughput,
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
        args.service_pid.and_then(peak_rss_mib).map_or_else(|| "n/a".to_owned(), |mib| format!("{mib:.1}")),
        if books_ok { "ok" } else { "MISMATCH" },
    );
    anyhow::ensure!(
        books_ok,
        "reconciliation after the load: {}",
        report["status"]
    );
    Ok(())
}
