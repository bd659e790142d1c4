//! token-billing-bench: the load generators of token-billing's benchmarks,
//! a crate of their own beside the scripts and fixed references that run
//! them (`bench/*.sh`, `bench/reference_*`; BENCHMARKS.md). They use the
//! service's library and drive a running service over real HTTP (or build
//! books on a scratch database); the service never uses them, and they are
//! never in its image. Their binary is `token-billing-bench`:
//!
//! - [`load`]: kiosk fleets, reserve → commit cycles or jobs (`load`, what
//!   `bench/compare.sh` runs);
//! - [`jobs`]: the job pipeline's overhead beyond provider time (`jobs`);
//! - [`flood`]: made-up keys from new addresses, the service's RSS
//!   (`auth-flood`);
//! - [`throttle`]: the address throttle as an attacker meets it
//!   (`throttle-probe`);
//! - [`reconciliation`]: reconciliation reports over seeded books
//!   (`reconciliation`);
//! - [`history`]: a long history built through the engine, then the
//!   service's history reads over it (`history`);
//! - [`sink`]: a webhook receiver that only counts (`webhook-sink`).

pub mod flood;
pub mod history;
pub mod jobs;
pub mod load;
pub mod reconciliation;
pub mod sink;
pub mod throttle;

/// Latency percentiles of a sample, in milliseconds.
pub fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (quantile * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
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
