//! `token-billing-tools bench jobs`: a small load generator against a running
//! service, over real HTTP with keep-alive. It measures the job pipeline's
//! overhead beyond provider time: each kiosk posts a job whose simulated
//! provider delay is known, long-polls it to a terminal status, and the
//! overhead is the wall time minus that delay. It prints medians and
//! percentiles, never asserts on time.

pub mod flood;
pub mod history;
pub mod load;
pub mod sink;
pub mod throttle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

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

/// Latency percentiles of a sample, in milliseconds.
pub fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (quantile * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
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

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_pick_ranks() {
        let sample: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sample, 0.5), 51.0);
        assert_eq!(percentile(&sample, 0.99), 99.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}

#[derive(Debug, clap::Args)]
pub struct ReconciliationBenchArgs {
    /// Accounts to seed.
    #[arg(long, default_value_t = 10_000)]
    pub accounts: i64,
    /// Ledger entries per account (≥ 2).
    #[arg(long, default_value_t = 100)]
    pub entries_per_account: i64,
    /// Reports to time.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

/// A connection to the bench's scratch database: created if missing,
/// migrated, the engine installed, and refused if it holds any account (a
/// bench never writes into real books).
pub fn scratch_database(database_url: &str) -> anyhow::Result<diesel::PgConnection> {
    use diesel::prelude::*;

    token_billing::db::create_database_if_missing(database_url)?;
    let mut conn = PgConnection::establish(database_url)?;
    token_billing::db::run_migrations(&mut conn)?;
    token_billing::engine::install::install(&mut conn)?;
    let existing: i64 = token_billing::db::schema::accounts::table
        .count()
        .get_result(&mut conn)?;
    anyhow::ensure!(
        existing == 0,
        "the bench builds on a scratch database; this one already has {existing} accounts"
    );
    Ok(conn)
}

/// Seeds a scratch database (which must hold no accounts) with consistent
/// books — per account a credit, then reserve/commit pairs, one last
/// reservation held — and times full reconciliation reports over it.
pub fn run_reconciliation_bench(
    database_url: &str,
    args: &ReconciliationBenchArgs,
) -> anyhow::Result<()> {
    use diesel::prelude::*;
    use diesel::sql_types::BigInt;

    anyhow::ensure!(
        args.entries_per_account >= 2,
        "--entries-per-account must be at least 2"
    );
    let mut conn = scratch_database(database_url)?;
    let seeding = Instant::now();
    // Entry 1 credits 1,000; entries 2… alternate reserve 1 / commit 1.
    diesel::sql_query(
        "INSERT INTO accounts (id, name, max_active_reservations, created_at) \
         SELECT gen_random_uuid(), 'bench ' || a, 0, now() - interval '31 days' FROM generate_series(1, $1) a",
    )
    .bind::<BigInt, _>(args.accounts)
    .execute(&mut conn)?;
    diesel::sql_query(
        "INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, actor, created_at) \
         SELECT a.id, \
                CASE WHEN n = 1 THEN 'credit' WHEN n % 2 = 0 THEN 'reserve' ELSE 'commit' END, \
                CASE WHEN n = 1 THEN 1000 ELSE 1 END, \
                1000 - n / 2, CASE WHEN n > 1 AND n % 2 = 0 THEN 1 ELSE 0 END, (n - 1) / 2, 'bench', \
                now() - interval '30 days' + (n * interval '1 minute') \
         FROM accounts a CROSS JOIN generate_series(1, $1) n",
    )
    .bind::<BigInt, _>(args.entries_per_account)
    .execute(&mut conn)?;
    let last = args.entries_per_account;
    let (reserved, used) = (i64::from(last % 2 == 0), (last - 1) / 2);
    diesel::sql_query(
        "UPDATE accounts SET credited = 1000, available = 1000 - $1 / 2, reserved = $2, used = $3, \
                active_reservations = $2::int",
    )
    .bind::<BigInt, _>(last)
    .bind::<BigInt, _>(reserved)
    .bind::<BigInt, _>(used)
    .execute(&mut conn)?;
    if reserved == 1 {
        diesel::sql_query(
            "INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at) \
             SELECT gen_random_uuid(), id, gen_random_uuid(), 1, 'held', now() + interval '1 day' FROM accounts",
        )
        .execute(&mut conn)?;
    }
    diesel::sql_query("ANALYZE").execute(&mut conn)?;
    println!(
        "seeded accounts={} ledger_entries={} in {:.1} s",
        args.accounts,
        args.accounts * args.entries_per_account,
        seeding.elapsed().as_secs_f64()
    );
    let to = chrono::Utc::now();
    let from = to - chrono::Duration::days(31);
    let mut timings = Vec::new();
    let mut status = "";
    for _ in 0..args.runs {
        let started = Instant::now();
        let report = token_billing::domain::reconciliation::reconcile(&mut conn, from, to, None)?;
        timings.push(started.elapsed().as_secs_f64() * 1000.0);
        status = report.status;
        anyhow::ensure!(
            report.accounts.len() as i64 == args.accounts,
            "every account reported"
        );
    }
    timings.sort_by(f64::total_cmp);
    println!(
        "reconciliation over {} days: status={status} runs={} median={:.0} ms min={:.0} ms max={:.0} ms",
        (to - from).num_days(),
        timings.len(),
        percentile(&timings, 0.5),
        timings.first().copied().unwrap_or(f64::NAN),
        timings.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}
