//! What every handler can reach: the application's shared state, built
//! once at start-up (`startup` builds the server around it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::coalesce::Coalescer;
use crate::config::{Config, PriceList};
use crate::db::read_replica::ReadReplica;
use crate::db::DbPool;
use crate::domain::api_keys::sha256;
use crate::job_watch::JobSignals;
use crate::metrics::Metrics;
use crate::rate_limit::{AuthFailureGuard, KeyRateLimiter};

/// What every handler can reach.
pub struct AppState {
    pub pool: DbPool,
    /// `DATABASE_READ_URL`'s pool, for reads where staleness is harmless.
    pub read_replica: Option<Arc<ReadReplica>>,
    pub config: Config,
    pub prices: PriceList,
    /// SHA-256 of `ADMIN_API_KEY`, compared in constant time.
    pub admin_key_hash: Option<[u8; 32]>,
    /// False once shutdown began: `/readyz` answers 503.
    pub accepting: AtomicBool,
    /// Wake-ups for workers and for clients waiting on jobs.
    pub signals: Arc<JobSignals>,
    pub metrics: Arc<Metrics>,
    pub rate_limiter: Arc<KeyRateLimiter>,
    /// Authentication failures per client address.
    pub auth_guard: Arc<AuthFailureGuard>,
    /// Group commit of each account's concurrent spending requests.
    pub coalescer: Arc<Coalescer>,
}

impl AppState {
    pub fn new(config: Config, pool: DbPool) -> Result<Arc<AppState>, String> {
        let prices = config.prices()?;
        let rate_limiter = Arc::new(KeyRateLimiter::new(
            config.rate_limit_per_second,
            config.rate_limit_burst,
        ));
        let auth_guard = Arc::new(AuthFailureGuard::new(config.guard_settings()?));
        let admin_key_hash = config
            .admin_api_key
            .as_ref()
            .map(|key| sha256(secrecy::ExposeSecret::expose_secret(key).as_bytes()));
        let metrics = Arc::new(Metrics::new().map_err(|error| error.to_string())?);
        let coalescer = Arc::new(Coalescer::new(
            pool.clone(),
            Arc::clone(&metrics),
            usize::try_from(config.coalesce_max_batch).unwrap_or(1),
            usize::try_from(config.coalesce_max_in_flight).unwrap_or(1),
        ));
        let read_replica = config
            .database_read_url
            .as_deref()
            .map(|url| Arc::new(ReadReplica::new(url)));
        Ok(Arc::new(AppState {
            pool,
            read_replica,
            config,
            prices,
            admin_key_hash,
            accepting: AtomicBool::new(true),
            signals: Arc::new(JobSignals::default()),
            metrics,
            rate_limiter,
            auth_guard,
            coalescer,
        }))
    }

    /// Whether `presented` is `ADMIN_API_KEY` (compared in constant time).
    pub fn is_bootstrap_key(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.admin_key_hash
            .is_some_and(|hash| bool::from(sha256(presented.as_bytes()).ct_eq(&hash)))
    }

    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::SeqCst)
    }

    /// Shutdown began: answer `/readyz` with 503 so load balancers drain us.
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::SeqCst);
    }
}
