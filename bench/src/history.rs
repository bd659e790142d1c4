//! `token-billing-bench history`: builds a long synthetic history
//! through the real money engine on a scratch database, then measures the
//! history reads of a running service over it.
//!
//! The build: `--accounts` accounts, each credited once, then reserve →
//! commit cycles spread over them until `--entries` ledger entries exist,
//! all through `engine::apply` (the same `engine_apply` statement the
//! service runs, in batches of `--batch` operations). The history spans
//! `--months` months: the build's connection puts a `bench_clock` schema
//! first on its `search_path`, whose `clock_timestamp()` runs
//! `bench_clock.shift` behind the real clock, and the shift shrinks from
//! the whole span to zero as the build goes. The engine's functions are
//! unchanged; only the clock they read is shifted. Then every day is
//! closed (`close_days`) and the database ANALYZEd.
//!
//! The measurements (with `--url`): `as_of` of one account (p50/p99), the
//! account list `as_of` (every page), an account's ledger page (p50/p99),
//! reconciliation of one month and of the whole span, and the disk used
//! per ledger entry. Figures are printed; nothing is asserted on time.

use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Text};
use rand::Rng;
use uuid::Uuid;

use crate::percentile;
use token_billing::engine::types::{AccountId, ExternalRef, RequestId, ReservationId, Tokens};
use token_billing::engine::{apply, Authority, CommitAmount, Op, Operation};

#[derive(Debug, clap::Args)]
pub struct HistoryBenchArgs {
    /// Ledger entries to build (about; whole reserve→commit cycles).
    #[arg(long, default_value_t = 1_000_000)]
    pub entries: i64,
    /// Accounts the entries are spread over.
    #[arg(long, default_value_t = 10_000)]
    pub accounts: i64,
    /// Months of history (30 days each), ending now.
    #[arg(long, default_value_t = 12)]
    pub months: i64,
    /// Reservations per engine call (then as many commits in the next).
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Connections building at once (each on its own share of the accounts).
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
    /// Measure only, over the history built earlier in this database.
    #[arg(long)]
    pub skip_build: bool,
    /// A running service on this database, to measure; without it, only the build.
    #[arg(long)]
    pub url: Option<String>,
    /// An admin key of that service.
    #[arg(long, env = "BENCH_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// Requests per latency figure.
    #[arg(long, default_value_t = 300)]
    pub samples: usize,
}

fn span(args: &HistoryBenchArgs) -> Duration {
    Duration::days(30 * args.months)
}

fn shift(conn: &mut PgConnection, seconds: i64) -> anyhow::Result<()> {
    conn.batch_execute(&format!("SET bench_clock.shift = '{seconds} seconds'"))?;
    Ok(())
}

/// One of the bench's operations: the service vouches for it (actor `bench`).
fn operation(account: AccountId, op: Op) -> Operation {
    Operation {
        account,
        authority: Authority::Verified {
            actor: "bench".into(),
        },
        op,
    }
}

/// Builds the history; prints its size and how long it took.
pub fn build(database_url: &str, args: &HistoryBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.accounts >= 1 && args.batch >= 1,
        "--accounts and --batch must be ≥ 1"
    );
    let mut conn = crate::scratch_database(database_url)?;
    conn.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS bench_clock; \
         CREATE OR REPLACE FUNCTION bench_clock.clock_timestamp() RETURNS timestamptz \
         LANGUAGE sql VOLATILE AS $$ SELECT pg_catalog.clock_timestamp() \
             - COALESCE(NULLIF(current_setting('bench_clock.shift', true), ''), '0')::interval $$; \
         SET search_path TO bench_clock, pg_catalog, public, {}; \
         SET statement_timeout = 0",
        token_billing::engine::install::SCHEMA
    ))?;
    let span_seconds = span(args).num_seconds();
    diesel::sql_query(
        "INSERT INTO accounts (id, name, max_active_reservations, created_at) \
         SELECT gen_random_uuid(), 'history ' || a, 0, now() - make_interval(secs => $2 + 86400) \
         FROM generate_series(1, $1) a",
    )
    .bind::<BigInt, _>(args.accounts)
    .bind::<Double, _>(span_seconds as f64)
    .execute(&mut conn)?;
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: Uuid,
    }
    let accounts: Vec<AccountId> = diesel::sql_query("SELECT id FROM accounts ORDER BY id")
        .load::<Id>(&mut conn)?
        .into_iter()
        .map(|row| AccountId(row.id))
        .collect();
    let started = Instant::now();
    shift(&mut conn, span_seconds)?;
    for chunk in accounts.chunks(args.batch) {
        let credits: Vec<Operation> = chunk
            .iter()
            .map(|account| {
                let external_ref = ExternalRef::try_from(format!("bench-{}", Uuid::new_v4()))
                    .map_err(|error| anyhow::anyhow!("{error:?}"))?;
                Ok(operation(
                    *account,
                    Op::Credit {
                        amount: Tokens::parse(1_000_000).map_err(anyhow::Error::msg)?,
                        external_ref,
                        note: None,
                        priority: Default::default(),
                        expires_at: None,
                        price: None,
                    },
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        apply(&mut conn, &credits)?;
    }
    let cycles = ((args.entries - args.accounts).max(0) / 2).max(0);
    let workers = args.parallel.max(1);
    let groups: Vec<Vec<AccountId>> = (0..workers)
        .map(|w| accounts.iter().skip(w).step_by(workers).copied().collect())
        .collect();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = groups
            .iter()
            .enumerate()
            .filter(|(_, group)| !group.is_empty())
            .map(|(w, group)| {
                let share =
                    cycles / workers as i64 + i64::from((w as i64) < cycles % workers as i64);
                scope.spawn(move || {
                    cycle_worker(
                        database_url,
                        group,
                        share,
                        args,
                        span_seconds,
                        w == 0,
                        started,
                    )
                })
            })
            .collect();
        for handle in handles {
            handle
                .join()
                .map_err(|_| anyhow::anyhow!("a build worker panicked"))??;
        }
        Ok(())
    })?;
    shift(&mut conn, 0)?;
    let built = started.elapsed().as_secs_f64();
    let entries = args.accounts + cycles * 2;
    println!(
        "built accounts={} ledger_entries={entries} months={} in {built:.0} s ({:.0} entries/s through engine_apply)",
        args.accounts,
        args.months,
        entries as f64 / built
    );
    let closing = Instant::now();
    let closed = token_billing::domain::history::close_days(&mut conn, Utc::now(), usize::MAX)?;
    println!(
        "closed days={} closing_rows={} in {:.1} s",
        closed.days.len(),
        closed.rows,
        closing.elapsed().as_secs_f64()
    );
    conn.batch_execute("ANALYZE")?;
    print_sizes(&mut conn)?;
    Ok(())
}

/// A connection whose engine reads the shifted `bench_clock`.
fn shifted_connection(database_url: &str) -> anyhow::Result<PgConnection> {
    let mut conn = PgConnection::establish(database_url)?;
    conn.batch_execute(&format!(
        "SET search_path TO bench_clock, pg_catalog, public, {}; SET statement_timeout = 0",
        token_billing::engine::install::SCHEMA
    ))?;
    Ok(conn)
}

/// `cycles` reserve → commit cycles over `accounts`, the clock moving from
/// the start of the span to now as they go.
fn cycle_worker(
    database_url: &str,
    accounts: &[AccountId],
    cycles: i64,
    args: &HistoryBenchArgs,
    span_seconds: i64,
    report: bool,
    started: Instant,
) -> anyhow::Result<()> {
    let mut conn = shifted_connection(database_url)?;
    let mut done: i64 = 0;
    let mut next_account = 0usize;
    let mut reported = 0;
    while done < cycles {
        let size = usize::try_from((cycles - done).min(args.batch as i64)).unwrap_or(1);
        let elapsed_share = done as f64 / cycles as f64;
        shift(
            &mut conn,
            ((1.0 - elapsed_share) * span_seconds as f64) as i64,
        )?;
        let reserves: Vec<Operation> = (0..size)
            .map(|i| {
                let account = accounts[(next_account + i) % accounts.len()];
                Ok(operation(
                    account,
                    Op::Reserve {
                        request_id: RequestId(Uuid::now_v7()),
                        amount: Tokens::parse(1).map_err(anyhow::Error::msg)?,
                        ttl_seconds: None,
                        effective_ttl_seconds: 86_400,
                    },
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        next_account = (next_account + size) % accounts.len();
        let answers = apply(&mut conn, &reserves)?;
        let commits: Vec<Operation> = answers
            .iter()
            .zip(&reserves)
            .filter_map(|(answer, reserve)| {
                let id = answer.object.as_ref()?["id"].as_str()?;
                let id = Uuid::parse_str(id).ok()?;
                Some(operation(
                    reserve.account,
                    Op::Commit {
                        reservation: ReservationId(id),
                        amount: CommitAmount::All,
                    },
                ))
            })
            .collect();
        anyhow::ensure!(commits.len() == size, "every reservation was made");
        apply(&mut conn, &commits)?;
        done += size as i64;
        let percent = done * 100 / cycles.max(1);
        if report && percent >= reported + 5 {
            reported = percent;
            eprintln!(
                "built {percent}% (worker 0: {done} cycles) in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// Disk of the ledger (table and indexes) per entry, and of the closings.
pub fn print_sizes(conn: &mut PgConnection) -> anyhow::Result<()> {
    #[derive(QueryableByName)]
    struct Size {
        #[diesel(sql_type = Text)]
        relation: String,
        #[diesel(sql_type = BigInt)]
        rows: i64,
        #[diesel(sql_type = BigInt)]
        table_bytes: i64,
        #[diesel(sql_type = BigInt)]
        total_bytes: i64,
    }
    let sizes: Vec<Size> = diesel::sql_query(
        "SELECT r AS relation, \
                (SELECT reltuples::bigint FROM pg_class WHERE oid = r::regclass) AS rows, \
                pg_relation_size(r::regclass) AS table_bytes, \
                pg_total_relation_size(r::regclass) AS total_bytes \
         FROM unnest(ARRAY['ledger_entries', 'reservations', 'ledger_daily_closings', 'events']) r",
    )
    .load(conn)?;
    for size in sizes {
        println!(
            "size {}: rows≈{} table={:.1} MiB with indexes={:.1} MiB per row={:.0} B",
            size.relation,
            size.rows,
            size.table_bytes as f64 / 1_048_576.0,
            size.total_bytes as f64 / 1_048_576.0,
            size.total_bytes as f64 / size.rows.max(1) as f64
        );
    }
    Ok(())
}

fn rfc3339(instant: DateTime<Utc>) -> String {
    instant
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        .replace('+', "%2B")
}

async fn timed_get(
    client: &reqwest::Client,
    url: &str,
    key: &str,
) -> anyhow::Result<(f64, serde_json::Value)> {
    let started = Instant::now();
    let response = client.get(url).bearer_auth(key).send().await?;
    let status = response.status();
    let body: serde_json::Value = response.json().await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(status.is_success(), "GET {url}: HTTP {status}: {body}");
    Ok((ms, body))
}

fn summary(name: &str, mut timings: Vec<f64>) {
    timings.sort_by(f64::total_cmp);
    println!(
        "{name}: n={} p50={:.1} ms p99={:.1} ms max={:.1} ms",
        timings.len(),
        percentile(&timings, 0.5),
        percentile(&timings, 0.99),
        timings.last().copied().unwrap_or(f64::NAN)
    );
}

/// Measures the history reads of the service at `url` (over this database).
pub async fn measure(database_url: &str, args: &HistoryBenchArgs) -> anyhow::Result<()> {
    let (Some(url), Some(key)) = (args.url.as_deref(), args.admin_key.as_deref()) else {
        return Ok(());
    };
    let (accounts, first_entry) = {
        let url = database_url.to_owned();
        tokio::task::spawn_blocking(move || -> anyhow::Result<(Vec<Uuid>, DateTime<Utc>)> {
            let mut conn = PgConnection::establish(&url)?;
            #[derive(QueryableByName)]
            struct Id {
                #[diesel(sql_type = diesel::sql_types::Uuid)]
                id: Uuid,
            }
            #[derive(QueryableByName)]
            struct First {
                #[diesel(sql_type = diesel::sql_types::Timestamptz)]
                at: DateTime<Utc>,
            }
            let ids = diesel::sql_query("SELECT id FROM accounts WHERE name LIKE 'history %'")
                .load::<Id>(&mut conn)?
                .into_iter()
                .map(|row| row.id)
                .collect();
            let first: First =
                diesel::sql_query("SELECT min(created_at) AS at FROM ledger_entries")
                    .get_result(&mut conn)?;
            print_sizes(&mut conn)?;
            Ok((ids, first.at))
        })
        .await??
    };
    anyhow::ensure!(!accounts.is_empty(), "no history accounts: build first");
    let client = reqwest::Client::new();
    let now = Utc::now();
    let span_micros = (now - first_entry).num_microseconds().unwrap_or(1).max(1);
    let mut as_of = Vec::new();
    let mut ledger = Vec::new();
    for _ in 0..args.samples {
        let (account, offset) = {
            let mut rng = rand::thread_rng();
            (
                accounts[rng.gen_range(0..accounts.len())],
                rng.gen_range(0..span_micros),
            )
        };
        let instant = first_entry + Duration::microseconds(offset);
        let (ms, _) = timed_get(
            &client,
            &format!("{url}/v1/accounts/{account}?as_of={}", rfc3339(instant)),
            key,
        )
        .await?;
        as_of.push(ms);
        let (ms, _) = timed_get(
            &client,
            &format!("{url}/v1/accounts/{account}/ledger?limit=100"),
            key,
        )
        .await?;
        ledger.push(ms);
    }
    summary("as_of one account (random instant in the span)", as_of);
    summary("ledger page of one account (limit 100)", ledger);
    for run in 0..3 {
        let instant = first_entry + Duration::microseconds(span_micros / 2 + run);
        let started = Instant::now();
        let mut after: Option<String> = None;
        let mut listed = 0;
        loop {
            let cursor = after
                .as_ref()
                .map(|a| format!("&after={a}"))
                .unwrap_or_default();
            let (_, page) = timed_get(
                &client,
                &format!(
                    "{url}/v1/accounts?limit=1000&as_of={}{cursor}",
                    rfc3339(instant)
                ),
                key,
            )
            .await?;
            listed += page["balances"].as_array().map_or(0, Vec::len);
            match page["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        println!(
            "list as_of (all {listed} accounts, pages of 1000): {:.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    let month_end = first_entry + Duration::microseconds(span_micros / 2);
    for (name, from, to) in [
        ("one month", month_end - Duration::days(30), month_end),
        (
            "whole span",
            now - Duration::days(365).min(now - first_entry),
            now,
        ),
    ] {
        for _ in 0..3 {
            let (ms, report) = timed_get(
                &client,
                &format!(
                    "{url}/v1/reconciliation?from={}&to={}",
                    rfc3339(from),
                    rfc3339(to)
                ),
                key,
            )
            .await?;
            println!(
                "reconciliation {name} ({} days): {ms:.0} ms status={} accounts={}",
                (to - from).num_days(),
                report["status"],
                report["accounts"].as_array().map_or(0, Vec::len)
            );
        }
    }
    Ok(())
}
