//! `token-billing-bench jobs`: the job pipeline's overhead beyond provider
//! time, against a running service, over real HTTP with keep-alive. Each
//! kiosk posts a job whose simulated provider delay is known, long-polls it
//! to a terminal status, and the overhead is the wall time minus that
//! delay. It prints medians and percentiles, never asserts on time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::percentile;

#[derive(Debug, clap::Args)]
pub struct JobBenchArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin key of that service.
    #[arg(long, env = "BENCH_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: String,
    /// Jobs to run in total.
    #[arg(long, default_value_t = 500)]
    pub jobs: usize,
    /// Kiosks posting at the same time.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Provider delay of every job (`params.simulate.delay_ms`).
    #[arg(long, default_value_t = 0)]
    pub provider_delay_ms: u64,
}

async fn post(
    client: &reqwest::Client,
    url: String,
    key: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let response = client.post(url).bearer_auth(key).json(&body).send().await?;
    let status = response.status();
    let body: Value = response.json().await?;
    anyhow::ensure!(status.is_success(), "HTTP {status}: {body}");
    Ok(body)
}

pub async fn run_job_bench(args: JobBenchArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency * 2)
        .build()?;
    let account = post(
        &client,
        format!("{}/v1/accounts", args.url),
        &args.admin_key,
        json!({"name": "bench", "max_active_reservations": 0}),
    )
    .await?;
    let account = account["account_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let tokens = i64::try_from(args.jobs).unwrap_or(i64::MAX).min(1_000_000);
    let credit = json!({"amount": tokens, "external_ref": format!("bench-{}", Uuid::new_v4())});
    post(
        &client,
        format!("{}/v1/accounts/{account}/credits", args.url),
        &args.admin_key,
        credit,
    )
    .await?;

    let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(args.jobs));
    let started = Instant::now();
    let mut kiosks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, remaining) = (client.clone(), Arc::clone(&remaining));
        let (url, key, account, delay) = (
            args.url.clone(),
            args.admin_key.clone(),
            account.clone(),
            args.provider_delay_ms,
        );
        kiosks.push(tokio::spawn(async move {
            let mut overheads = Vec::new();
            while remaining
                .fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let request_id = Uuid::new_v4();
                let begin = Instant::now();
                let body = json!({"request_id": request_id, "kind": "standard", "params": {"simulate": {"delay_ms": delay}}});
                post(&client, format!("{url}/v1/accounts/{account}/jobs"), &key, body).await?;
                let job: Value = client
                    .get(format!("{url}/v1/accounts/{account}/jobs/{request_id}?wait_seconds=30"))
                    .bearer_auth(&key)
                    .send()
                    .await?
                    .json()
                    .await?;
                anyhow::ensure!(job["status"] == "succeeded", "job did not succeed: {job}");
                let total = begin.elapsed();
                overheads.push(total.saturating_sub(Duration::from_millis(delay)).as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(overheads)
        }));
    }
    let mut overheads = Vec::new();
    for kiosk in kiosks {
        overheads.extend(kiosk.await??);
    }
    let elapsed = started.elapsed();
    overheads.sort_by(f64::total_cmp);
    println!(
        "jobs={} concurrency={} provider_delay_ms={} elapsed_s={:.2} jobs_per_s={:.1}",
        overheads.len(),
        args.concurrency,
        args.provider_delay_ms,
        elapsed.as_secs_f64(),
        overheads.len() as f64 / elapsed.as_secs_f64()
    );
    println!(
        "overhead beyond provider time (ms): p50={:.1} p90={:.1} p99={:.1} max={:.1}",
        percentile(&overheads, 0.50),
        percentile(&overheads, 0.90),
        percentile(&overheads, 0.99),
        overheads.last().copied().unwrap_or(f64::NAN)
    );
    let balances: Value = client
        .get(format!("{}/v1/accounts/{account}", args.url))
        .bearer_auth(&args.admin_key)
        .send()
        .await?
        .json()
        .await?;
    let used = balances["used"].as_i64().unwrap_or(-1);
    println!(
        "account used={used} (expected {}) reserved={}",
        overheads.len(),
        balances["reserved"]
    );
    anyhow::ensure!(
        used == i64::try_from(overheads.len())?,
        "charged tokens do not match succeeded jobs"
    );
    Ok(())
}
