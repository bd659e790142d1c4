//! `token-billing-bench reconciliation`: seeds a scratch database with
//! consistent books and times full reconciliation reports over it.

use std::time::Instant;

use crate::{percentile, scratch_database};

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
