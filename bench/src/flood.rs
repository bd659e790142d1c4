//! `token-billing-bench auth-flood`: a flood of made-up keys over real
//! HTTP, each from another client address (`X-Forwarded-For`, so the
//! service must run with `TRUSTED_PROXIES=127.0.0.1/32`), to show that the
//! per-key and per-address limits keep the service's memory flat: prints the
//! answers by status, the rate, and the service's RSS before and after.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

#[derive(Debug, clap::Args)]
pub struct FloodArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Requests in all, each with a made-up key and a new address.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Distinct client addresses the requests come from, in turn.
    #[arg(long, default_value_t = 1_000_000)]
    pub addresses: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// PID of the service, to read its RSS.
    #[arg(long)]
    pub service_pid: u32,
}

fn rss_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with(field))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

pub async fn run_flood(args: FloodArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let before = rss_mib(args.service_pid, "VmRSS:");
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, url, total, addresses) = (
            client.clone(),
            Arc::clone(&next),
            format!("{}/v1/accounts", args.url),
            args.requests,
            args.addresses.max(1),
        );
        tasks.push(tokio::spawn(async move {
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return statuses;
                }
                // Addresses in turn: 10.x.y.z from n modulo `addresses`.
                let address =
                    Ipv4Addr::from(0x0a00_0000_u32 | ((n % addresses) as u32 & 0x00ff_ffff));
                let key = format!(
                    "tbk_{}_{}",
                    Uuid::new_v4().simple(),
                    Uuid::new_v4().simple()
                );
                let status = client
                    .get(&url)
                    .bearer_auth(key)
                    .header("x-forwarded-for", address.to_string())
                    .send()
                    .await
                    .map_or(0, |response| response.status().as_u16());
                *statuses.entry(status).or_default() += 1;
            }
        }));
    }
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for task in tasks {
        for (status, count) in task.await? {
            *statuses.entry(status).or_default() += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = rss_mib(args.service_pid, "VmRSS:");
    let peak = rss_mib(args.service_pid, "VmHWM:");
    println!(
        "requests={} addresses={} seconds={elapsed:.1} per_second={:.0} statuses={statuses:?} \
         rss_before_mib={before:.1} rss_after_mib={after:.1} peak_rss_mib={peak:.1}",
        args.requests,
        args.addresses,
        args.requests as f64 / elapsed
    );
    Ok(())
}
