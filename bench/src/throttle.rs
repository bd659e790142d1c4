//! `token-billing-bench throttle-probe`: the address throttle as an
//! attacker meets it, over real HTTP (docs/security.md, "The attacker
//! model"). Every client address is named in `X-Forwarded-For`, so the
//! service must run with `TRUSTED_PROXIES=127.0.0.1/32`.
//!
//! For `--seconds`, made-up keys are sent as fast as `--concurrency`
//! allows from `--addresses` addresses in turn (IPv4 addresses, addresses
//! of one IPv6 /64, or one address in each of as many /64s); optionally,
//! requests with no key at `--anonymous-per-second` from a venue's address
//! (a web page on a guest's phone), and two kiosks polling once a second
//! from that address: one in use from the start, one whose key this
//! replica has never seen (first used after 5 s, as after a restart). It
//! prints, per 10-second window and in all, the guesses answered (401:
//! each one a guess the attacker learnt the answer to) and refused (429),
//! and every answer the kiosks and the anonymous requests got.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use crate::load::post_ok;

/// Where the guesses come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// 10.0.0.0, 10.0.0.1, …: one IPv4 address each.
    Ipv4,
    /// 2001:db8:1:2::1, ::2, …: addresses of one IPv6 /64.
    #[value(name = "one-64")]
    One64,
    /// 2001:db8:<n>::1: one address in each of as many /64s.
    #[value(name = "many-64")]
    Many64,
}

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin key, to set up the kiosks of `--kiosks`.
    #[arg(long, env = "BENCH_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// Seconds the probe runs.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Addresses the made-up keys come from, in turn (0: no guesses).
    #[arg(long, default_value_t = 1)]
    pub addresses: u32,
    /// How those addresses are spread.
    #[arg(long, value_enum, default_value_t = Spread::Ipv4)]
    pub spread: Spread,
    /// Guesses in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The guesses come from the venue's address (a guest on the kiosks'
    /// network) instead of `--addresses`.
    #[arg(long)]
    pub from_the_venue: bool,
    /// Requests with no key per second from the venue's address.
    #[arg(long, default_value_t = 0)]
    pub anonymous_per_second: u32,
    /// Two kiosks polling once a second from the venue's address (needs
    /// `--admin-key`).
    #[arg(long)]
    pub kiosks: bool,
}

/// The venue: the address the kiosks (and a guest's phone) share.
const VENUE: &str = "203.0.113.5";

/// The `n`-th guessing address.
fn address(spread: Spread, n: u32) -> IpAddr {
    match spread {
        Spread::Ipv4 => IpAddr::V4(Ipv4Addr::from(0x0a00_0000_u32 | (n & 0x00ff_ffff))),
        Spread::One64 => IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            1,
            2,
            0,
            0,
            (n >> 16) as u16,
            (n & 0xffff) as u16,
        )),
        Spread::Many64 => IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            (n >> 16) as u16,
            (n & 0xffff) as u16,
            0,
            0,
            0,
            1,
        )),
    }
}

/// Answers by (what sent the request, 10-second window, status).
type Tally = BTreeMap<(&'static str, u64, u16), u64>;

fn made_up_key() -> String {
    format!(
        "tbk_{}_{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )
}

async fn status_of(client: &reqwest::Client, url: &str, key: Option<&str>, from: &str) -> u16 {
    let mut request = client.get(url).header("x-forwarded-for", from);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request
        .send()
        .await
        .map_or(0, |response| response.status().as_u16())
}

/// A new account and a kiosk key of it: (the account's URL, the key).
async fn kiosk(
    client: &reqwest::Client,
    url: &str,
    admin_key: &str,
) -> anyhow::Result<(String, String)> {
    let account = post_ok(
        client,
        format!("{url}/v1/accounts"),
        admin_key,
        json!({"name": "throttle probe", "max_active_reservations": 0}),
    )
    .await?;
    let id = account["account_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let key = post_ok(
        client,
        format!("{url}/v1/accounts/{id}/api-keys"),
        admin_key,
        json!({"scope": "kiosk", "label": "throttle probe"}),
    )
    .await?;
    Ok((
        format!("{url}/v1/accounts/{id}"),
        key["key"].as_str().unwrap_or_default().to_owned(),
    ))
}

pub async fn run_probe(args: ProbeArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency + 8)
        .build()?;
    // Set up before any guess: the admin's own requests come from the
    // proxy's address.
    let kiosks = if args.kiosks {
        let admin_key = args
            .admin_key
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--kiosks needs --admin-key (BENCH_ADMIN_KEY)"))?;
        Some((
            kiosk(&client, &args.url, admin_key).await?,
            kiosk(&client, &args.url, admin_key).await?,
        ))
    } else {
        None
    };
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    let window = move || started.elapsed().as_secs() / 10 * 10;
    let mut tasks: Vec<tokio::task::JoinHandle<Tally>> = Vec::new();

    let next = Arc::new(AtomicU64::new(0));
    let guessers = if args.addresses > 0 || args.from_the_venue {
        args.concurrency
    } else {
        0
    };
    for _ in 0..guessers {
        let (client, next, url) = (
            client.clone(),
            Arc::clone(&next),
            format!("{}/v1/accounts", args.url),
        );
        let (spread, addresses, from_the_venue) = (
            args.spread,
            u64::from(args.addresses.max(1)),
            args.from_the_venue,
        );
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            while Instant::now() < end {
                let n = next.fetch_add(1, Ordering::Relaxed) % addresses;
                let from = if from_the_venue {
                    VENUE.to_owned()
                } else {
                    address(spread, n as u32).to_string()
                };
                let status = status_of(&client, &url, Some(&made_up_key()), &from).await;
                *tally.entry(("guess", window(), status)).or_default() += 1;
            }
            tally
        }));
    }

    if args.anonymous_per_second > 0 {
        let (client, url) = (client.clone(), format!("{}/v1/accounts", args.url));
        let every = Duration::from_secs_f64(1.0 / f64::from(args.anonymous_per_second));
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut sent = Vec::new();
            while Instant::now() < end {
                tick.tick().await;
                let client = client.clone();
                let url = url.clone();
                sent.push(tokio::spawn(async move {
                    (window(), status_of(&client, &url, None, VENUE).await)
                }));
            }
            let mut tally = Tally::new();
            for request in sent {
                if let Ok((at, status)) = request.await {
                    *tally.entry(("anonymous", at, status)).or_default() += 1;
                }
            }
            tally
        }));
    }

    if let Some(((in_use_url, in_use), (fresh_url, fresh))) = kiosks {
        for (name, url, key, from_second) in [
            ("kiosk in use", in_use_url, in_use, 0),
            ("kiosk not remembered", fresh_url, fresh, 5),
        ] {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::new();
                tokio::time::sleep(Duration::from_secs(from_second)).await;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                while Instant::now() < end {
                    tick.tick().await;
                    let status = status_of(&client, &url, Some(&key), VENUE).await;
                    *tally.entry((name, window(), status)).or_default() += 1;
                }
                tally
            }));
        }
    }

    let mut tally = Tally::new();
    for task in tasks {
        for (entry, count) in task.await? {
            *tally.entry(entry).or_default() += count;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut totals: BTreeMap<(&str, u16), u64> = BTreeMap::new();
    for ((what, at, status), count) in &tally {
        println!("t={at:>4}s {what:<22} {status} × {count}");
        *totals.entry((what, *status)).or_default() += count;
    }
    let answered = totals.get(&("guess", 401)).copied().unwrap_or(0);
    // After the first minute the bursts are spent: the rate that lasts.
    let later: u64 = tally
        .iter()
        .filter(|((what, at, status), _)| *what == "guess" && *at >= 60 && *status == 401)
        .map(|(_, count)| count)
        .sum();
    let later_rate = if seconds > 60.0 {
        format!(
            " answered_per_second_after_60s={:.1}",
            later as f64 / (seconds - 60.0)
        )
    } else {
        String::new()
    };
    println!(
        "addresses={} spread={:?} seconds={seconds:.1} answered_guesses={answered} \
         answered_per_second={:.1}{later_rate} totals={totals:?}",
        if args.from_the_venue {
            "venue".to_owned()
        } else {
            args.addresses.to_string()
        },
        args.spread,
        answered as f64 / seconds
    );
    Ok(())
}
