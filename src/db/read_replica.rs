//! The optional read replica (`DATABASE_READ_URL`): a streaming standby
//! that takes the reads where a few seconds of staleness are harmless —
//! finance's reconciliation and the ledger pages of admin and finance
//! callers. Everything a kiosk reads after writing (balances, its
//! reservations, its jobs, its own ledger) stays on the primary.
//!
//! When the replica cannot answer (down, unreachable, a query cancelled by
//! a conflict with recovery), the read goes to the primary, and the
//! replica is left alone for `READ_REPLICA_RETRY` so that no request waits
//! on it meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::Double;

use super::{build_pool_with, run_blocking, DbPool};
use crate::error::ApiError;

/// How long a failed replica is skipped before it is tried again.
pub const READ_REPLICA_RETRY: Duration = Duration::from_secs(30);
/// A checkout from the replica's pool waits at most this long.
const READ_REPLICA_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections to the replica (reports are few and long).
const READ_REPLICA_POOL_SIZE: u32 = 4;

pub struct ReadReplica {
    pool: DbPool,
    started: Instant,
    /// Milliseconds since `started` before which the replica is skipped.
    skip_until_ms: AtomicU64,
}

impl ReadReplica {
    /// Connects lazily, as the primary's pool does.
    pub fn new(database_read_url: &str) -> ReadReplica {
        ReadReplica {
            pool: build_pool_with(
                database_read_url,
                READ_REPLICA_POOL_SIZE,
                READ_REPLICA_CHECKOUT_TIMEOUT,
            ),
            started: Instant::now(),
            skip_until_ms: AtomicU64::new(0),
        }
    }

    pub fn pool(&self) -> &DbPool {
        &self.pool
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn usable(&self) -> bool {
        self.now_ms() >= self.skip_until_ms.load(Ordering::Relaxed)
    }

    fn failed(&self) {
        let until = self.now_ms() + READ_REPLICA_RETRY.as_millis() as u64;
        self.skip_until_ms.store(until, Ordering::Relaxed);
    }
}

/// Seconds the replica's replay is behind its primary: 0 when it has
/// replayed all the WAL it received (an idle primary sends none, so the age
/// of the last replayed transaction alone would grow without any lag), and
/// 0 for a server that is not a standby at all.
pub fn replay_lag_seconds(conn: &mut PgConnection) -> Result<f64, ApiError> {
    #[derive(QueryableByName)]
    struct Lag {
        #[diesel(sql_type = Double)]
        lag: f64,
    }
    let row: Lag = diesel::sql_query(
        "SELECT CASE \
           WHEN NOT pg_is_in_recovery() THEN 0 \
           WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
           ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0) \
         END::float8 AS lag",
    )
    .get_result(conn)?;
    Ok(row.lag.max(0.0))
}

/// Runs the read `work` on the replica when there is one and it answers,
/// else on the primary.
pub async fn run_read_blocking<T, F>(
    primary: &DbPool,
    replica: Option<&ReadReplica>,
    work: F,
) -> Result<T, ApiError>
where
    F: Fn(&mut PgConnection) -> Result<T, ApiError> + Send + Sync + 'static,
    T: Send + 'static,
{
    let work = Arc::new(work);
    if let Some(replica) = replica.filter(|replica| replica.usable()) {
        let on_replica = Arc::clone(&work);
        match run_blocking(&replica.pool, move |conn| on_replica(conn)).await {
            Err(ApiError::Unavailable(reason)) => {
                replica.failed();
                tracing::warn!(
                    %reason,
                    "the read replica cannot answer; reading from the primary for {} s",
                    READ_REPLICA_RETRY.as_secs()
                );
            }
            answered => return answered,
        }
    }
    run_blocking(primary, move |conn| work(conn)).await
}
