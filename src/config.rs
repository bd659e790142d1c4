//! Every setting of the service, its default and its limits, in one place.
//!
//! Each environment variable has a `--flag` twin under `token-billing serve`
//! (clap reads both; the flag wins); `DATABASE_URL` and `LOG_FORMAT` are the
//! global options of every command (`cli::GlobalArgs`). docs/configuration.md
//! is the table of them all. `Config::validate` refuses a configuration that
//! would lose or freeze tokens at run time, with a message that names the
//! variable to fix.

use secrecy::{ExposeSecret, SecretString};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::rate_limit::{ForwardedHeader, GuardSettings};
use clap::{Args, ValueEnum};

/// Where `serve` and the management commands find PostgreSQL by default.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@localhost:5432/token_billing";
/// Bounds on `ttl_seconds` of a reservation, in seconds.
pub const TTL_SECONDS_MIN: i32 = 1;
pub const TTL_SECONDS_MAX: i32 = 86_400;
/// Bounds on the amount of a reservation, credit or adjustment, in tokens.
pub const AMOUNT_MAX: i64 = 1_000_000;
/// Largest request body accepted, in bytes.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;
/// Ledger page sizes.
pub const LEDGER_PAGE_DEFAULT: i64 = 100;
pub const LEDGER_PAGE_MAX: i64 = 1_000;
/// Longest accepted name, label or external reference, in characters.
pub const NAME_LENGTH_MAX: usize = 200;
pub const REASON_LENGTH_MAX: usize = 1_000;
/// How long a request waits for a pooled connection before answering 503.
pub const DB_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);
/// Every statement is cancelled after this long (set on each connection).
pub const DB_STATEMENT_TIMEOUT_MS: u64 = 10_000;
/// Longest period of one reconciliation report, and the default period
/// when `from` is omitted.
pub const RECONCILIATION_RANGE_MAX: Duration = Duration::from_secs(366 * 24 * 3600);
pub const RECONCILIATION_RANGE_DEFAULT: Duration = Duration::from_secs(30 * 24 * 3600);
/// The tables retention prunes (the metrics' `table` label).
pub const RETENTION_TABLES: [&str; 5] = [
    "idempotency_keys",
    "events",
    "webhook_deliveries",
    "webhook_attempts",
    "audit_events",
];
/// Rows one retention batch archives and deletes in one transaction.
pub const RETENTION_BATCH_MAX: i64 = 5_000;
/// Batches of one table in one retention pass (the rest waits for the next).
pub const RETENTION_BATCHES_PER_PASS_MAX: usize = 2_000;
/// The pause between two retention batches (`RETENTION_PAUSE`) by default,
/// and the longest one accepted.
pub const RETENTION_PAUSE_DEFAULT: &str = "100ms";
pub const RETENTION_PAUSE_MAX: Duration = Duration::from_secs(10);

/// A retention duration (humantime: `30d`, `12h`, `3s`; `0` keeps forever).
fn parse_retention(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|error| {
        format!("{text:?} is not a duration such as 30d, 12h or 3s (0 keeps forever): {error}")
    })
}

/// A pause between retention batches (humantime: `100ms`, `1s`; `0`: none),
/// at most [`RETENTION_PAUSE_MAX`].
pub fn parse_retention_pause(text: &str) -> Result<Duration, String> {
    let pause = humantime::parse_duration(text.trim()).map_err(|error| {
        format!("{text:?} is not a duration such as 100ms or 1s (0: no pause): {error}")
    })?;
    if pause > RETENTION_PAUSE_MAX {
        return Err(format!(
            "{text:?} is longer than {}, the longest pause between retention batches \
             (a pass of many batches would take hours)",
            humantime::format_duration(RETENTION_PAUSE_MAX)
        ));
    }
    Ok(pause)
}

/// Largest `params` object of a job, serialized, in bytes.
pub const JOB_PARAMS_MAX_BYTES: usize = 16 * 1024;
/// Deepest nesting of arrays and objects accepted in `params`.
pub const JOB_PARAMS_DEPTH_MAX: usize = 32;
/// Longest `wait_seconds` of `GET …/jobs/{request_id}`.
pub const JOB_WAIT_SECONDS_MAX: u64 = 30;
/// Job list page sizes.
pub const JOB_PAGE_DEFAULT: i64 = 50;
pub const JOB_PAGE_MAX: i64 = 500;
/// Reservation list page sizes.
pub const RESERVATION_PAGE_DEFAULT: i64 = 50;
pub const RESERVATION_PAGE_MAX: i64 = 500;
/// An idle worker looks for jobs queued by other replicas this often; jobs
/// queued by its own replica wake it at once.
pub const WORKER_IDLE_POLL: Duration = Duration::from_millis(500);
/// Waiting clients of this replica are checked against the database (one
/// query for all of them) this often, to see jobs other replicas finished.
pub const JOB_WATCH_POLL: Duration = Duration::from_millis(250);
/// Provider status polling starts at this interval and grows to the max.
pub const PROVIDER_POLL_INITIAL: Duration = Duration::from_millis(20);
pub const PROVIDER_POLL_MAX: Duration = Duration::from_millis(500);
/// Database-derived gauges (reserved tokens, jobs in flight…) are
/// refreshed this often by each replica.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(15);
/// Retry backoff never grows beyond this.
pub const JOB_RETRY_BACKOFF_MAX_MS: u64 = 60_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    Simulated,
    Http,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, Args)]
pub struct Config {
    /// PostgreSQL connection URL; `serve` creates the database when missing.
    /// Parsed once for every command, as a global option (`cli::GlobalArgs`).
    #[arg(skip = DEFAULT_DATABASE_URL.to_owned())]
    pub database_url: String,

    /// A streaming replica for the reads where staleness is harmless
    /// (reconciliation, admin and finance ledger pages); unset: they read
    /// from the primary. When it cannot answer, they read from the primary.
    #[arg(long, env = "DATABASE_READ_URL", hide_env_values = true)]
    pub database_read_url: Option<String>,

    /// Address the HTTP server listens on (port 0 picks a free port).
    #[arg(long, env = "BIND_ADDR", default_value = "127.0.0.1:8080")]
    pub bind_addr: String,

    /// Connections in the pool; bounds the service's database concurrency.
    #[arg(long, env = "DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,

    /// Most concurrent money operations (reservations, commits, releases,
    /// extensions, job creations, credits; of any accounts) joined into one
    /// engine transaction; 1 turns this group commit off.
    #[arg(long, env = "COALESCE_MAX_BATCH", default_value_t = 32)]
    pub coalesce_max_batch: u32,

    /// Engine batches each replica keeps in flight at once; a request that
    /// arrives while all are busy joins the next batch.
    #[arg(long, env = "COALESCE_MAX_IN_FLIGHT", default_value_t = 2)]
    pub coalesce_max_in_flight: u32,

    /// When set, this key has `admin` scope (bootstrap). Held as a secret:
    /// it never appears in `Debug` output or logs.
    #[arg(long, env = "ADMIN_API_KEY", hide_env_values = true, value_parser = parse_secret)]
    pub admin_api_key: Option<SecretString>,

    /// Job prices per kind, e.g. `standard=1,hd=2`.
    #[arg(long, env = "PRICE_LIST", default_value = "standard=1")]
    pub price_list: String,

    /// Default lifetime of a reservation, in seconds.
    #[arg(long, env = "RESERVATION_TTL_SECONDS", default_value_t = 300)]
    pub reservation_ttl_seconds: i32,

    /// Lease of a worker on a job, in seconds (heartbeat at half).
    #[arg(long, env = "JOB_LEASE_SECONDS", default_value_t = 30)]
    pub job_lease_seconds: i32,

    /// Attempts per job before it fails and its tokens are released.
    #[arg(long, env = "JOB_MAX_ATTEMPTS", default_value_t = 3)]
    pub job_max_attempts: i32,

    /// Job workers in this replica (0: an API-only replica).
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = 8)]
    pub worker_concurrency: u32,

    /// Reaper schedule: cron with a seconds field.
    #[arg(long, env = "REAPER_SCHEDULE", default_value = "*/30 * * * * *")]
    pub reaper_schedule: String,

    /// How long before a credit grant lapses its `grant.expiring` event is
    /// sent (once per grant), in hours.
    #[arg(long, env = "GRANT_EXPIRING_NOTICE_HOURS", default_value_t = 72)]
    pub grant_expiring_notice_hours: i32,

    /// How long idempotency keys are kept (humantime: `30d`, `12h`, `3s`; `0` keeps them forever).
    #[arg(long, env = "RETENTION_IDEMPOTENCY_KEYS", default_value = "30d", value_parser = parse_retention)]
    pub retention_idempotency_keys: Duration,

    /// How long events (the feed, webhooks' payloads) are kept; `0` keeps them forever.
    #[arg(long, env = "RETENTION_EVENTS", default_value = "90d", value_parser = parse_retention)]
    pub retention_events: Duration,

    /// How long finished webhook deliveries and their attempts are kept; `0` keeps them forever.
    #[arg(long, env = "RETENTION_WEBHOOK_ATTEMPTS", default_value = "30d", value_parser = parse_retention)]
    pub retention_webhook_attempts: Duration,

    /// How long audit events are kept; `0` (the default) keeps them forever.
    #[arg(long, env = "RETENTION_AUDIT_EVENTS", default_value = "0", value_parser = parse_retention)]
    pub retention_audit_events: Duration,

    /// When retention passes and the daily closings run: cron with a seconds field.
    #[arg(long, env = "RETENTION_SCHEDULE", default_value = "0 0 * * * *")]
    pub retention_schedule: String,

    /// The pause between two retention batches (humantime: `100ms`, `1s`; `0`: none), at most 10s:
    /// room for the kiosks' statements between the batches' deletes. No transaction or lock is held
    /// during it.
    #[arg(long, env = "RETENTION_PAUSE", default_value = RETENTION_PAUSE_DEFAULT, value_parser = parse_retention_pause)]
    pub retention_pause: Duration,

    /// Where pruned rows are archived first (gzip JSON Lines under `<dir>/<table>/`); unset: no archive.
    #[arg(long, env = "ARCHIVE_DIR")]
    pub archive_dir: Option<std::path::PathBuf>,

    /// Image generation provider.
    #[arg(long, env = "PROVIDER", value_enum, default_value_t = ProviderKind::Simulated)]
    pub provider: ProviderKind,

    /// Base URL of the `http` provider.
    #[arg(long, env = "PROVIDER_URL", hide_env_values = true)]
    pub provider_url: Option<String>,

    /// Timeout of one provider request, in seconds.
    #[arg(long, env = "PROVIDER_TIMEOUT_SECONDS", default_value_t = 60)]
    pub provider_timeout_seconds: i32,

    /// First retry delay of a job after a retryable provider error, in
    /// milliseconds; doubles with every attempt.
    #[arg(long, env = "JOB_RETRY_BACKOFF_MS", default_value_t = 1_000)]
    pub job_retry_backoff_ms: u64,

    /// Mean latency of the simulated provider, in milliseconds (±50 %).
    #[arg(long, env = "SIMULATED_LATENCY_MS", default_value_t = 500)]
    pub simulated_latency_ms: u64,

    /// Share of simulated generations that fail (0.0 … 1.0).
    #[arg(long, env = "SIMULATED_FAILURE_RATE", default_value_t = 0.0)]
    pub simulated_failure_rate: f64,

    /// On SIGTERM, how long running jobs may take to finish, in seconds.
    #[arg(long, env = "SHUTDOWN_GRACE_SECONDS", default_value_t = 30)]
    pub shutdown_grace_seconds: u64,

    /// Requests per second allowed per API key (0: no limit).
    #[arg(long, env = "RATE_LIMIT_PER_SECOND", default_value_t = 50)]
    pub rate_limit_per_second: u32,

    /// Requests a key may send at once above its rate.
    #[arg(long, env = "RATE_LIMIT_BURST", default_value_t = 100)]
    pub rate_limit_burst: u32,

    /// Authentication failures (401) a client address may cause at once
    /// before it is answered 429 without any lookup (0: no such limit).
    #[arg(long, env = "AUTH_FAILURE_BURST", default_value_t = 20)]
    pub auth_failure_burst: u32,

    /// Authentication failures per minute a client address regains.
    #[arg(long, env = "AUTH_FAILURES_PER_MINUTE", default_value_t = 10)]
    pub auth_failures_per_minute: u32,

    /// IPv6 clients are counted per network of this prefix length (one
    /// host usually holds a whole /64); 128 counts each address.
    #[arg(long, env = "AUTH_FAILURE_IPV6_PREFIX", default_value_t = 64,
          value_parser = clap::value_parser!(u8).range(1..=128))]
    pub auth_failure_ipv6_prefix: u8,

    /// Most client addresses (or IPv6 networks) whose failures are tracked
    /// at once; an entry is forgotten only once its failures have drained,
    /// and when full, the clients it does not hold share one count.
    #[arg(long, env = "AUTH_FAILURE_TRACKED_MAX", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub auth_failure_tracked_max: u64,

    /// Most verified keys a replica remembers at once (a remembered key
    /// passes a blocked address); when full, a new key is not remembered.
    #[arg(long, env = "AUTH_VERIFIED_KEYS_MAX", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub auth_verified_keys_max: u64,

    /// How long this replica remembers a verified key after its last
    /// authenticated request (it passes a blocked address meanwhile).
    #[arg(long, env = "AUTH_VERIFIED_KEY_MEMORY_SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub auth_verified_key_memory_seconds: u64,

    /// Proxies whose forwarding header is believed, as comma-separated CIDRs
    /// (e.g. `10.0.0.0/8,192.168.1.10/32`); empty: the peer is the client.
    #[arg(long, env = "TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: String,

    /// The header trusted proxies name the client in: `x-forwarded-for`,
    /// or `forwarded` (RFC 7239).
    #[arg(long, env = "FORWARDED_HEADER", value_enum, default_value_t = ForwardedHeader::XForwardedFor)]
    pub forwarded_header: ForwardedHeader,

    /// Send webhooks to loopback, private and link-local addresses too (for
    /// development and tests only; production keeps the default, false).
    #[arg(
        long,
        env = "WEBHOOK_ALLOW_PRIVATE_URLS",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolValueParser::new()
    )]
    pub webhook_allow_private_urls: bool,

    /// Seconds a receiver has to answer a webhook before the attempt counts
    /// as failed.
    #[arg(long, env = "WEBHOOK_TIMEOUT_SECONDS", default_value_t = 15)]
    pub webhook_timeout_seconds: u64,

    /// Delays before each delivery attempt, seconds, comma-separated; the
    /// first is the first attempt's (0: at once), their number the attempts.
    #[arg(
        long,
        env = "WEBHOOK_RETRY_SCHEDULE",
        default_value = "0,5,300,1800,7200,18000,36000,36000"
    )]
    pub webhook_retry_schedule: String,

    /// An endpoint failing without a success for this many hours is
    /// disabled (and `endpoint.disabled` is recorded).
    #[arg(long, env = "WEBHOOK_DISABLE_AFTER_HOURS", default_value_t = 120.0)]
    pub webhook_disable_after_hours: f64,

    /// Webhook deliveries in flight at once on this replica (0: this
    /// replica sends none).
    #[arg(long, env = "WEBHOOK_CONCURRENCY", default_value_t = 4)]
    pub webhook_concurrency: u32,

    /// Webhook delivery attempts this replica starts per second at most
    /// (0: no cap). Delivery is background work: the cap keeps a flood of
    /// events from slowing the kiosks' reservations.
    #[arg(long, env = "WEBHOOK_MAX_PER_SECOND", default_value_t = 100)]
    pub webhook_max_per_second: u32,

    /// An HTTP(S) proxy for webhook deliveries (e.g. `http://proxy:3128`).
    /// Empty (the default): deliveries connect directly, and `HTTP_PROXY`,
    /// `HTTPS_PROXY` and `ALL_PROXY` are ignored. Through a proxy, the
    /// proxy resolves the receiver's name, so the connection-time check of
    /// its address (DNS rebinding) is the proxy's job, not this service's.
    /// Held as a secret: a proxy URL may carry credentials.
    #[arg(long, env = "WEBHOOK_PROXY", hide_env_values = true, value_parser = parse_secret)]
    pub webhook_proxy: Option<SecretString>,

    /// Origins whose web pages may call the API from a browser (CORS), as
    /// comma-separated exact origins (`https://kiosk.example.com`); empty
    /// (the default): CORS is off and no response carries
    /// `Access-Control-Allow-Origin`. No wildcard.
    #[arg(long, env = "CORS_ALLOWED_ORIGINS", default_value = "")]
    pub cors_allowed_origins: String,

    /// Log format; a global option too (`cli::GlobalArgs`).
    #[arg(skip = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn parse_secret(value: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(value.to_owned()))
}

/// A parsed `PRICE_LIST`: job kind → cost in tokens.
pub type PriceList = BTreeMap<String, i64>;

impl Config {
    /// The address throttle's settings.
    pub fn guard_settings(&self) -> Result<GuardSettings, String> {
        Ok(GuardSettings {
            burst: self.auth_failure_burst,
            per_minute: self.auth_failures_per_minute,
            trusted_proxies: self.trusted_proxy_networks()?,
            forwarded_header: self.forwarded_header,
            ipv6_prefix: self.auth_failure_ipv6_prefix,
            tracked_max: usize::try_from(self.auth_failure_tracked_max).unwrap_or(usize::MAX),
            verified_keys_max: usize::try_from(self.auth_verified_keys_max).unwrap_or(usize::MAX),
            verified_key_memory: std::time::Duration::from_secs(
                self.auth_verified_key_memory_seconds,
            ),
        })
    }

    /// `TRUSTED_PROXIES` parsed.
    pub fn trusted_proxy_networks(&self) -> Result<Vec<ipnet::IpNet>, String> {
        self.trusted_proxies
            .split(',')
            .map(str::trim)
            .filter(|cidr| !cidr.is_empty())
            .map(|cidr| {
                cidr.parse::<ipnet::IpNet>()
                    .or_else(|_| cidr.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| format!("TRUSTED_PROXIES: {cidr:?} is not a CIDR or an address"))
            })
            .collect()
    }

    /// `CORS_ALLOWED_ORIGINS` parsed: each an exact origin as a browser
    /// sends it in `Origin` (`scheme://host[:port]`, lower case, no path,
    /// no default port); empty: CORS is off.
    pub fn cors_origins(&self) -> Result<Vec<String>, String> {
        self.cors_allowed_origins
            .split(',')
            .map(str::trim)
            .filter(|origin| !origin.is_empty())
            .map(|origin| {
                check_origin(origin).map_err(|why| {
                    format!(
                        "CORS_ALLOWED_ORIGINS: {origin:?} is not an origin such as \
                         https://kiosk.example.com ({why})"
                    )
                })?;
                Ok(origin.to_owned())
            })
            .collect()
    }

    /// Every setting that turns a guard off or weakens it, with what that
    /// means: `serve` warns of each at start (one line each), so a setting
    /// meant for development does not reach production unnoticed.
    pub fn weakened_guards(&self) -> Vec<String> {
        let mut weakened = Vec::new();
        if self.webhook_allow_private_urls {
            weakened.push(
                "WEBHOOK_ALLOW_PRIVATE_URLS=true: webhooks may be sent to loopback, private and \
                 link-local addresses (the guard against requests into your own network is \
                 off; for development and tests only)"
                    .to_owned(),
            );
        }
        if self.rate_limit_per_second == 0 {
            weakened.push(
                "RATE_LIMIT_PER_SECOND=0: API keys are not rate-limited (one key can take the \
                 whole service)"
                    .to_owned(),
            );
        }
        if self.auth_failure_burst == 0 {
            weakened.push(
                "AUTH_FAILURE_BURST=0: authentication failures are not throttled per address \
                 (keys can be guessed as fast as the service answers)"
                    .to_owned(),
            );
        }
        if let Ok(networks) = self.trusted_proxy_networks() {
            if networks.iter().any(|network| network.prefix_len() == 0) {
                weakened.push(
                    "TRUSTED_PROXIES contains a /0: every peer's X-Forwarded-For is believed, so \
                     any client can choose the address its limits are counted by"
                        .to_owned(),
                );
            }
        }
        weakened
    }

    /// Checks every cross-field rule; the error names the variable to fix.
    pub fn validate(&self) -> Result<(), String> {
        self.trusted_proxy_networks()?;
        self.cors_origins()?;
        check_multi_host(&self.database_url)?;
        if !(1..=1000).contains(&self.coalesce_max_batch) {
            return Err("COALESCE_MAX_BATCH must be between 1 and 1000".into());
        }
        if !(1..=64).contains(&self.coalesce_max_in_flight) {
            return Err("COALESCE_MAX_IN_FLIGHT must be between 1 and 64".into());
        }
        if self.db_pool_size < 1 {
            return Err("DB_POOL_SIZE must be at least 1".into());
        }
        if !(TTL_SECONDS_MIN..=TTL_SECONDS_MAX).contains(&self.reservation_ttl_seconds) {
            return Err(format!(
                "RESERVATION_TTL_SECONDS must be between {TTL_SECONDS_MIN} and {TTL_SECONDS_MAX}"
            ));
        }
        if self.provider_timeout_seconds < 1 {
            return Err("PROVIDER_TIMEOUT_SECONDS must be at least 1".into());
        }
        // The seed's outage: a 15 s client timeout on an 18 s operation.
        // A reservation must outlive several provider calls.
        if i64::from(self.reservation_ttl_seconds) < 3 * i64::from(self.provider_timeout_seconds) {
            return Err(format!(
                "RESERVATION_TTL_SECONDS ({}) must be at least 3 × PROVIDER_TIMEOUT_SECONDS ({})",
                self.reservation_ttl_seconds, self.provider_timeout_seconds
            ));
        }
        if self.job_lease_seconds < 2 {
            return Err("JOB_LEASE_SECONDS must be at least 2".into());
        }
        if self.job_lease_seconds >= self.reservation_ttl_seconds {
            return Err(format!(
                "JOB_LEASE_SECONDS ({}) must be shorter than RESERVATION_TTL_SECONDS ({})",
                self.job_lease_seconds, self.reservation_ttl_seconds
            ));
        }
        if !(1..=100).contains(&self.job_max_attempts) {
            return Err("JOB_MAX_ATTEMPTS must be between 1 and 100".into());
        }
        if !(0..=8784).contains(&self.grant_expiring_notice_hours) {
            return Err(
                "GRANT_EXPIRING_NOTICE_HOURS must be between 0 (no notice) and 8784 (a year)"
                    .into(),
            );
        }
        if self.worker_concurrency > 1024 {
            return Err(
                "WORKER_CONCURRENCY must be between 0 (an API-only replica) and 1024".into(),
            );
        }
        if !(0.0..=1.0).contains(&self.simulated_failure_rate) {
            return Err("SIMULATED_FAILURE_RATE must be between 0.0 and 1.0".into());
        }
        if self.job_retry_backoff_ms > JOB_RETRY_BACKOFF_MAX_MS {
            return Err(format!(
                "JOB_RETRY_BACKOFF_MS must be at most {JOB_RETRY_BACKOFF_MAX_MS}"
            ));
        }
        if self.shutdown_grace_seconds > 3_600 {
            return Err("SHUTDOWN_GRACE_SECONDS must be at most 3600".into());
        }
        if self.provider == ProviderKind::Http && self.provider_url.is_none() {
            return Err("PROVIDER=http needs PROVIDER_URL".into());
        }
        if self.reaper_schedule.split_whitespace().count() != 6 {
            return Err(format!(
                "REAPER_SCHEDULE ({:?}) must be a cron expression with 6 fields, seconds first, \
                 e.g. \"*/30 * * * * *\"",
                self.reaper_schedule
            ));
        }
        if self.retention_schedule.split_whitespace().count() != 6 {
            return Err(format!(
                "RETENTION_SCHEDULE ({:?}) must be a cron expression with 6 fields, seconds first, \
                 e.g. \"0 0 * * * *\" (hourly)",
                self.retention_schedule
            ));
        }
        if let Some(key) = &self.admin_api_key {
            if key.expose_secret().len() < 16 {
                return Err("ADMIN_API_KEY must be at least 16 characters".into());
            }
        }
        self.webhook_settings()?;
        self.prices().map(|_| ())
    }

    /// The `WEBHOOK_*` settings, checked.
    pub fn webhook_settings(&self) -> Result<WebhookSettings, String> {
        if !(1..=300).contains(&self.webhook_timeout_seconds) {
            return Err("WEBHOOK_TIMEOUT_SECONDS must be between 1 and 300".into());
        }
        if !(self.webhook_disable_after_hours.is_finite()
            && self.webhook_disable_after_hours > 0.0
            && self.webhook_disable_after_hours <= 24.0 * 365.0)
        {
            return Err("WEBHOOK_DISABLE_AFTER_HOURS must be above 0 and at most 8760".into());
        }
        if self.webhook_concurrency > 256 {
            return Err("WEBHOOK_CONCURRENCY must be between 0 and 256".into());
        }
        if self.webhook_max_per_second > 100_000 {
            return Err("WEBHOOK_MAX_PER_SECOND must be between 0 (no cap) and 100000".into());
        }
        Ok(WebhookSettings {
            timeout: Duration::from_secs(self.webhook_timeout_seconds),
            schedule: parse_schedule(&self.webhook_retry_schedule)?,
            disable_after: Duration::from_secs_f64(self.webhook_disable_after_hours * 3_600.0),
            allow_private: self.webhook_allow_private_urls,
            concurrency: self.webhook_concurrency,
            max_per_second: self.webhook_max_per_second,
            proxy: parse_proxy(self.webhook_proxy.as_ref())?,
        })
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.job_lease_seconds).unwrap_or(30))
    }

    pub fn provider_timeout(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.provider_timeout_seconds).unwrap_or(60))
    }

    /// Parses `PRICE_LIST` (`kind=cost,kind=cost`).
    pub fn prices(&self) -> Result<PriceList, String> {
        parse_price_list(&self.price_list)
    }
}

/// An origin exactly as a browser writes it in the `Origin` header: the
/// CORS check compares bytes, so `https://Kiosk.example.com/` or
/// `https://kiosk.example.com:443` would never match and are refused here
/// rather than silently ignored.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    if origin.contains('*') {
        return Err("no wildcard: list each origin");
    }
    let (scheme, authority) = origin.split_once("://").ok_or("it has no scheme://")?;
    if scheme != "http" && scheme != "https" {
        return Err("the scheme must be http or https");
    }
    if authority.is_empty() {
        return Err("it has no host");
    }
    if authority.contains(['/', '?', '#']) {
        return Err("an origin has no path, not even a trailing /");
    }
    if authority.contains('@') {
        return Err("an origin has no user name or password");
    }
    if authority.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("browsers send the host in lower case");
    }
    if !authority
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
    {
        return Err("the host has characters an origin cannot have");
    }
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    if authority.ends_with(default_port) {
        return Err("browsers omit the scheme's default port");
    }
    Ok(())
}

pub fn parse_price_list(text: &str) -> Result<PriceList, String> {
    let mut prices = PriceList::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (kind, cost) = item
            .split_once('=')
            .ok_or_else(|| format!("PRICE_LIST item {item:?} is not kind=cost"))?;
        let kind = kind.trim();
        let valid_kind = !kind.is_empty()
            && kind.len() <= 64
            && kind
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_kind {
            return Err(format!(
                "PRICE_LIST kind {kind:?} must be 1-64 of [A-Za-z0-9_-]"
            ));
        }
        let cost: i64 = cost
            .trim()
            .parse()
            .map_err(|_| format!("PRICE_LIST cost of {kind:?} is not an integer"))?;
        if !(1..=AMOUNT_MAX).contains(&cost) {
            return Err(format!(
                "PRICE_LIST cost of {kind:?} must be between 1 and {AMOUNT_MAX}"
            ));
        }
        if prices.insert(kind.to_owned(), cost).is_some() {
            return Err(format!("PRICE_LIST names {kind:?} twice"));
        }
    }
    if prices.is_empty() {
        return Err("PRICE_LIST must name at least one kind".into());
    }
    Ok(prices)
}

/// A connection string in libpq's key=value form (`host=h port=5432
/// dbname=token_billing user=postgres`) as its pairs, in order: values may
/// be single-quoted (`password='a b'`, with `\'` and `\\` inside), spaces
/// around `=` are allowed. `None` for a URL (`postgres://…`,
/// `postgresql://…`) or a string that is not well-formed (libpq refuses it
/// with its own message).
pub fn conninfo_pairs(conninfo: &str) -> Option<Vec<(String, String)>> {
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        return None;
    }
    let mut pairs = Vec::new();
    let mut chars = conninfo.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if key.is_empty() || chars.next() != Some('=') {
            return None;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\'' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next()?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
    Some(pairs)
}

/// The hosts a `DATABASE_URL` names: several in libpq's multi-host form
/// (`postgres://u@h1:5432,h2:5433/db`, or `host=h1,h2` in the key=value
/// form), one otherwise.
pub fn database_hosts(database_url: &str) -> Vec<String> {
    let authority = match database_url.split_once("://") {
        Some((_, rest)) => {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let authority = &rest[..end];
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, hosts)| hosts)
        }
        None => {
            let host = conninfo_pairs(database_url)
                .and_then(|pairs| pairs.into_iter().rfind(|(key, _)| key == "host"))
                .map(|(_, host)| host)
                .unwrap_or_default();
            return host.split(',').map(str::to_owned).collect();
        }
    };
    authority.split(',').map(str::to_owned).collect()
}

/// A `DATABASE_URL` listing several hosts must ask libpq for the one that
/// takes writes (`target_session_attrs=read-write` or `primary`): without
/// it, libpq takes the first host that answers, which after a failover may
/// be a standby.
pub fn check_multi_host(database_url: &str) -> Result<(), String> {
    if database_hosts(database_url).len() < 2 {
        return Ok(());
    }
    let asks_for_primary = [
        "target_session_attrs=read-write",
        "target_session_attrs=primary",
    ]
    .iter()
    .any(|setting| database_url.contains(setting));
    if asks_for_primary {
        Ok(())
    } else {
        Err(format!(
            "DATABASE_URL lists several hosts but not target_session_attrs=read-write, so \
             writes could go to a standby: add ?target_session_attrs=read-write ({})",
            redact_database_url(database_url)
        ))
    }
}

/// `database_url` fit to print: the password of a URL's user
/// (`postgres://user:secret@…`, also in a malformed URL) and any `password=`
/// parameter replaced by `***` (see `secrets`).
pub fn redact_database_url(database_url: &str) -> String {
    crate::secrets::redact_connection_strings(database_url)
}

/// The delivery settings (`WEBHOOK_*`).
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    pub timeout: Duration,
    /// Delay before attempt n (0-based); its length is the attempts.
    pub schedule: Vec<Duration>,
    pub disable_after: Duration,
    pub allow_private: bool,
    pub concurrency: u32,
    /// Attempts per second this replica starts at most (0: no cap).
    pub max_per_second: u32,
    /// `WEBHOOK_PROXY`: the only proxy deliveries use (none by default;
    /// the `*_PROXY` environment variables are ignored).
    pub proxy: Option<SecretString>,
}

/// Checks `WEBHOOK_PROXY` (empty: none). The error never repeats the value,
/// which may carry credentials.
pub fn parse_proxy(text: Option<&SecretString>) -> Result<Option<SecretString>, String> {
    let Some(text) = text.filter(|text| !text.expose_secret().trim().is_empty()) else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(text.expose_secret().trim())
        .map_err(|_| "WEBHOOK_PROXY must be a URL such as http://proxy:3128".to_owned())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("WEBHOOK_PROXY must be an http:// or https:// URL with a host".into());
    }
    Ok(Some(text.clone()))
}

/// Parses `WEBHOOK_RETRY_SCHEDULE`: seconds, comma-separated, ≥ 1 entry.
pub fn parse_schedule(text: &str) -> Result<Vec<Duration>, String> {
    let schedule: Vec<Duration> = text
        .split(',')
        .map(str::trim)
        .map(|item| {
            item.parse::<f64>()
                .ok()
                .filter(|seconds| seconds.is_finite() && (0.0..=604_800.0).contains(seconds))
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    format!(
                        "WEBHOOK_RETRY_SCHEDULE: {item:?} is not a number of seconds \
                         between 0 and 604800"
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    if schedule.is_empty() || schedule.len() > 50 {
        return Err("WEBHOOK_RETRY_SCHEDULE must list 1 to 50 delays".into());
    }
    Ok(schedule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        config: Config,
    }

    fn config(args: &[&str]) -> Config {
        let mut argv = vec!["token-billing"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv)
            .expect("arguments parse")
            .config
    }

    #[test]
    fn cors_origins_are_exact() {
        assert_eq!(config(&[]).cors_origins(), Ok(vec![]));
        let two = config(&[
            "--cors-allowed-origins",
            "https://kiosk.example.com, http://127.0.0.1:5173",
        ]);
        assert_eq!(
            two.cors_origins(),
            Ok(vec![
                "https://kiosk.example.com".to_owned(),
                "http://127.0.0.1:5173".to_owned()
            ])
        );
        for bad in [
            "*",
            "https://*.example.com",
            "kiosk.example.com",
            "ftp://kiosk.example.com",
            "https://kiosk.example.com/",
            "https://Kiosk.example.com",
            "https://kiosk.example.com:443",
            "https://user@kiosk.example.com",
            "https://",
        ] {
            let error = config(&["--cors-allowed-origins", bad])
                .validate()
                .expect_err(bad);
            assert!(error.starts_with("CORS_ALLOWED_ORIGINS"), "{bad}: {error}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let defaults = config(&[]);
        assert_eq!(defaults.validate(), Ok(()));
        assert_eq!(defaults.prices().expect("valid").get("standard"), Some(&1));
    }

    #[test]
    fn ttl_must_cover_three_provider_timeouts() {
        let error = config(&[
            "--reservation-ttl-seconds",
            "45",
            "--provider-timeout-seconds",
            "18",
        ])
        .validate()
        .expect_err("45 < 54");
        assert!(error.contains("3 × PROVIDER_TIMEOUT_SECONDS"), "{error}");
    }

    #[test]
    fn lease_must_be_shorter_than_ttl() {
        let error = config(&[
            "--reservation-ttl-seconds",
            "200",
            "--provider-timeout-seconds",
            "10",
            "--job-lease-seconds",
            "200",
        ])
        .validate()
        .expect_err("lease == ttl");
        assert!(error.contains("JOB_LEASE_SECONDS"), "{error}");
    }

    #[test]
    fn http_provider_needs_url_and_pool_needs_a_connection() {
        assert!(config(&["--provider", "http"]).validate().is_err());
        assert!(config(&["--db-pool-size", "0"]).validate().is_err());
        assert!(config(&["--reaper-schedule", "*/30 * * * *"])
            .validate()
            .is_err());
    }

    #[test]
    fn retention_pause_defaults_to_100ms_and_0_turns_it_off() {
        assert_eq!(config(&[]).retention_pause, Duration::from_millis(100));
        assert_eq!(
            config(&["--retention-pause", "0"]).retention_pause,
            Duration::ZERO
        );
        assert_eq!(
            config(&["--retention-pause", "250ms"]).retention_pause,
            Duration::from_millis(250)
        );
        assert_eq!(parse_retention_pause("10s"), Ok(RETENTION_PAUSE_MAX));
        for bad in ["10001ms", "1m", "fast", "-1s", ""] {
            assert!(
                parse_retention_pause(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        let refused = Wrapper::try_parse_from(["token-billing", "--retention-pause", "1h"])
            .err()
            .expect("1h is refused")
            .to_string();
        assert!(refused.contains("longest pause"), "{refused}");
    }

    #[test]
    fn price_list_syntax() {
        let prices = parse_price_list("standard=1, hd=2").expect("valid");
        assert_eq!(prices.get("hd"), Some(&2));
        for bad in [
            "",
            "standard",
            "standard=0",
            "standard=x",
            "a=1,a=2",
            "b c=1",
            "x=1000001",
        ] {
            assert!(parse_price_list(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
