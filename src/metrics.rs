//! Prometheus metrics (prefix `token_billing_`), one `Metrics` owning its
//! registry. No label carries an account, key or request id. Counters are
//! bumped inside the blocking closures that commit, so a client that
//! disconnects cannot make a committed change go uncounted. Gauges derived
//! from the database are refreshed in one place (`refresh_database_gauges`,
//! on a timer), never per scrape; they include the last reaper pass's
//! outcome (`reaper_status`), so every replica exports the same values.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::engine::{Answer, Op, Operation, Outcome as EngineOutcome};
use crate::error::ApiError;

const PREFIX: &str = "token_billing";

pub struct Metrics {
    registry: Registry,
    pub reservations_total: IntCounterVec,
    pub reservation_resolutions_total: IntCounterVec,
    pub tokens_total: IntCounterVec,
    pub active_reservations: IntGauge,
    pub reserved_tokens: IntGauge,
    pub oldest_reservation_age_seconds: Gauge,
    /// Replay lag of `DATABASE_READ_URL`'s replica; -1 when it cannot be
    /// asked, 0 without one.
    pub read_replica_lag_seconds: Gauge,
    pub jobs_total: IntCounterVec,
    pub jobs_in_flight: IntGaugeVec,
    pub job_duration_seconds: Histogram,
    pub provider_requests_total: IntCounterVec,
    pub provider_request_duration_seconds: Histogram,
    pub reaper_runs_total: IntCounterVec,
    pub auth_failures_total: IntCounterVec,
    pub reaper_last_success_timestamp_seconds: Gauge,
    pub consistency_repairs_total: IntCounterVec,
    pub invariant_violations: IntGauge,
    pub http_requests_total: IntCounterVec,
    pub http_request_duration_seconds: HistogramVec,
    pub build_info: IntGaugeVec,
    pub coalesced_batch_size: Histogram,
    pub webhook_deliveries_total: IntCounterVec,
    pub webhook_delivery_seconds: Histogram,
    pub webhook_pending: IntGauge,
    pub webhook_oldest_pending_seconds: Gauge,
    /// Rows deleted by retention, by table.
    pub retention_pruned_rows_total: IntCounterVec,
    /// Rows written to ARCHIVE_DIR by retention before their delete, by table.
    pub retention_archived_rows_total: IntCounterVec,
    /// Age of the oldest row of each table retention prunes, after a pass.
    pub retention_oldest_row_age_seconds: GaugeVec,
    /// The last UTC day whose daily closing balances are written (Unix time
    /// of its midnight; 0 before the first).
    pub ledger_last_closed_day_timestamp_seconds: Gauge,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(PREFIX)
}

/// Buckets of provider and job durations: around the 15–25 s generations,
/// up to the 60 s default timeout and beyond.
const SLOW_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0,
];
/// Buckets of HTTP durations: 1 ms … 10 s (long-polls end at ≤ 30 s).
const HTTP_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let metric = IntCounterVec::new(opts(name, help), labels)?;
                registry.register(Box::new(metric.clone()))?;
                Ok(metric)
            };
        let reservations_total = counter(
            "reservations_total",
            "Reservation attempts by outcome.",
            &["outcome"],
        )?;
        let reservation_resolutions_total = counter(
            "reservation_resolutions_total",
            "Reservations resolved, by outcome.",
            &["outcome"],
        )?;
        let tokens_total = counter("tokens_total", "Tokens moved, by movement.", &["movement"])?;
        let jobs_total = counter(
            "jobs_total",
            "Jobs finished, by terminal status.",
            &["status"],
        )?;
        let provider_requests_total = counter(
            "provider_requests_total",
            "Provider requests, by outcome.",
            &["outcome"],
        )?;
        let reaper_runs_total = counter(
            "reaper_runs_total",
            "Reaper passes, by result.",
            &["result"],
        )?;
        let auth_failures_total = counter(
            "auth_failures_total",
            "Requests refused for their key (unauthorized), and those refused \
             before any lookup because their address kept failing (throttled).",
            &["outcome"],
        )?;
        let consistency_repairs_total = counter(
            "consistency_repairs_total",
            "Repairs made by the reaper, by kind.",
            &["kind"],
        )?;
        let http_requests_total = counter(
            "http_requests_total",
            "HTTP requests by method, route pattern and status.",
            &["method", "route", "status"],
        )?;
        let webhook_deliveries_total = counter(
            "webhook_deliveries_total",
            "Webhook delivery attempts, by outcome: delivered, retrying, exhausted \
             (no attempt left), endpoint_gone (410).",
            &["outcome"],
        )?;
        let int_gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let metric = IntGauge::with_opts(opts(name, help))?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let gauge = |name: &str, help: &str| -> Result<Gauge, prometheus::Error> {
            let metric = Gauge::with_opts(opts(name, help))?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let active_reservations = int_gauge(
            "active_reservations",
            "Reservations currently held (database).",
        )?;
        let reserved_tokens =
            int_gauge("reserved_tokens", "Tokens currently reserved (database).")?;
        let oldest_reservation_age_seconds = gauge(
            "oldest_reservation_age_seconds",
            "Age of the oldest held reservation (database).",
        )?;
        let read_replica_lag_seconds = gauge(
            "read_replica_lag_seconds",
            "Replay lag of the read replica (DATABASE_READ_URL), seconds; -1 when it cannot be reached, 0 without one.",
        )?;
        let reaper_last_success_timestamp_seconds = gauge(
            "reaper_last_success_timestamp_seconds",
            "Unix time of the last successful reaper pass.",
        )?;
        let webhook_pending = int_gauge(
            "webhook_pending",
            "Webhook deliveries not yet delivered to enabled endpoints (database).",
        )?;
        let webhook_oldest_pending_seconds = gauge(
            "webhook_oldest_pending_seconds",
            "Age of the oldest event not yet delivered to an enabled endpoint (database).",
        )?;
        let retention_pruned_rows_total = counter(
            "retention_pruned_rows_total",
            "Rows deleted by retention (RETENTION_*), by table.",
            &["table"],
        )?;
        let retention_archived_rows_total = counter(
            "retention_archived_rows_total",
            "Rows written to ARCHIVE_DIR (gzip JSON Lines, fsynced) before retention deleted them, by table.",
            &["table"],
        )?;
        let retention_oldest_row_age_seconds = GaugeVec::new(
            opts(
                "retention_oldest_row_age_seconds",
                "Age of the oldest row of each table retention prunes, after the last pass.",
            ),
            &["table"],
        )?;
        registry.register(Box::new(retention_oldest_row_age_seconds.clone()))?;
        let ledger_last_closed_day_timestamp_seconds = gauge(
            "ledger_last_closed_day_timestamp_seconds",
            "Midnight (Unix time) starting the last UTC day whose daily closing balances are written.",
        )?;
        let invariant_violations = int_gauge(
            "invariant_violations",
            "Accounts currently violating a token invariant.",
        )?;
        let jobs_in_flight = IntGaugeVec::new(
            opts("jobs_in_flight", "Jobs not finished (database), by status."),
            &["status"],
        )?;
        registry.register(Box::new(jobs_in_flight.clone()))?;
        let histogram = |name: &str, help: &str| -> Result<Histogram, prometheus::Error> {
            let metric = Histogram::with_opts(
                HistogramOpts::new(name, help)
                    .namespace(PREFIX)
                    .buckets(SLOW_BUCKETS.to_vec()),
            )?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let job_duration_seconds =
            histogram("job_duration_seconds", "Job creation to terminal status.")?;
        let webhook_delivery_seconds = histogram(
            "webhook_delivery_seconds",
            "Duration of one webhook delivery attempt.",
        )?;
        let provider_request_duration_seconds = histogram(
            "provider_request_duration_seconds",
            "Duration of one provider request.",
        )?;
        let http_request_duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request duration by route pattern.",
            )
            .namespace(PREFIX)
            .buckets(HTTP_BUCKETS.to_vec()),
            &["route"],
        )?;
        registry.register(Box::new(http_request_duration_seconds.clone()))?;
        let coalesced_batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "coalesced_batch_size",
                "Money operations (of any accounts) run together in one engine \
                 transaction; 1 is an uncontended request.",
            )
            .namespace(PREFIX)
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]),
        )?;
        registry.register(Box::new(coalesced_batch_size.clone()))?;
        let build_info = IntGaugeVec::new(opts("build_info", "Build information."), &["version"])?;
        registry.register(Box::new(build_info.clone()))?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Every fixed label value exists from the start (at 0), so rates and
        // alerts see a series before the first event.
        let known: [(&IntCounterVec, &[&str]); 11] = [
            (
                &retention_pruned_rows_total,
                &crate::config::RETENTION_TABLES,
            ),
            (
                &retention_archived_rows_total,
                &crate::config::RETENTION_TABLES,
            ),
            (
                &webhook_deliveries_total,
                &["delivered", "retrying", "exhausted", "endpoint_gone"],
            ),
            (
                &reservations_total,
                &["created", "insufficient", "key_budget", "limited"],
            ),
            (
                &reservation_resolutions_total,
                &["committed", "released", "expired"],
            ),
            (
                &tokens_total,
                &[
                    "credited",
                    "adjusted",
                    "reserved",
                    "committed",
                    "released",
                    "expired",
                    "grant_expired",
                ],
            ),
            (&jobs_total, &["succeeded", "failed"]),
            (
                &provider_requests_total,
                &[
                    "ok",
                    "provider_timeout",
                    "provider_unavailable",
                    "rejected",
                    "not_found",
                ],
            ),
            (&reaper_runs_total, &["ok", "error"]),
            (&auth_failures_total, &["unauthorized", "throttled"]),
            (
                &consistency_repairs_total,
                &[
                    "job_failed_reservation_expired",
                    "job_requeued",
                    "job_failed_attempts_exhausted",
                    "fixup_commit",
                    "fixup_release",
                    "fixup_job_failed",
                ],
            ),
        ];
        for (counter, values) in known {
            for value in values {
                counter.with_label_values(&[value]);
            }
        }
        for status in ["queued", "running"] {
            jobs_in_flight.with_label_values(&[status]);
        }
        // Process metrics register only in the default registry on their own.
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Metrics {
            registry,
            reservations_total,
            reservation_resolutions_total,
            tokens_total,
            active_reservations,
            reserved_tokens,
            oldest_reservation_age_seconds,
            read_replica_lag_seconds,
            jobs_total,
            jobs_in_flight,
            job_duration_seconds,
            provider_requests_total,
            provider_request_duration_seconds,
            reaper_runs_total,
            auth_failures_total,
            reaper_last_success_timestamp_seconds,
            consistency_repairs_total,
            invariant_violations,
            http_requests_total,
            http_request_duration_seconds,
            build_info,
            coalesced_batch_size,
            webhook_deliveries_total,
            webhook_delivery_seconds,
            webhook_pending,
            webhook_oldest_pending_seconds,
            retention_pruned_rows_total,
            retention_archived_rows_total,
            retention_oldest_row_age_seconds,
            ledger_last_closed_day_timestamp_seconds,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(error) = encoder.encode(&self.registry.gather(), &mut buffer) {
            tracing::error!(?error, "encoding metrics failed");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }

    pub fn tokens(&self, movement: &str, amount: i64) {
        if let Ok(amount) = u64::try_from(amount) {
            self.tokens_total
                .with_label_values(&[movement])
                .inc_by(amount);
        }
    }

    /// A reservation resolved: `committed` tokens spent, `returned` back.
    pub fn resolution(&self, outcome: &str, committed: i64, returned: i64) {
        self.reservation_resolutions_total
            .with_label_values(&[outcome])
            .inc();
        self.tokens("committed", committed);
        let movement = if outcome == "expired" {
            "expired"
        } else {
            "released"
        };
        self.tokens(movement, returned);
    }

    /// A reservation this process just moved out of `held`.
    pub fn resolved(&self, reservation: &crate::db::models::ReservationRow) {
        self.resolution(
            reservation.state.as_str(),
            reservation.committed_amount,
            reservation.amount - reservation.committed_amount,
        );
    }

    /// Counts what one engine operation did (after its commit): a
    /// reservation attempt (a job creation reserves too), a resolution
    /// (also an expiry on access), a credit or an adjustment.
    pub fn engine_answer(&self, operation: &Operation, answer: &Answer) {
        let reservation = || {
            answer.object.as_ref().and_then(|object| {
                serde_json::from_value::<crate::db::models::ReservationRow>(object.clone()).ok()
            })
        };
        if let Some(amount) = operation.reserve_amount() {
            let outcome = match answer.outcome {
                EngineOutcome::Created => {
                    self.tokens("reserved", amount);
                    "created"
                }
                EngineOutcome::InsufficientTokens => "insufficient",
                EngineOutcome::KeyBudgetExhausted => "key_budget",
                EngineOutcome::TooManyActiveReservations => "limited",
                _ => return,
            };
            self.reservations_total.with_label_values(&[outcome]).inc();
            return;
        }
        match (&operation.op, answer.outcome) {
            (Op::Credit { amount, .. }, EngineOutcome::Created) => {
                self.tokens("credited", amount.get());
            }
            (Op::Adjust { amount, .. }, EngineOutcome::Created) => {
                self.tokens("adjusted", amount.get().abs());
            }
            (_, EngineOutcome::Committed | EngineOutcome::Released) => {
                if let Some(reservation) = reservation() {
                    self.resolved(&reservation);
                }
            }
            // An expiry on access: the tokens went back by this request.
            (_, EngineOutcome::NotHeld) if answer.detail.get("resolved").is_some() => {
                if let Some(reservation) = reservation() {
                    self.resolved(&reservation);
                }
            }
            _ => {}
        }
    }

    /// The values of a counter with one label, by label value (for the
    /// system summary; the same numbers as `/metrics`).
    pub fn counts_by_label(
        &self,
        counter: &IntCounterVec,
    ) -> std::collections::BTreeMap<String, u64> {
        use prometheus::core::Collector;
        counter
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter_map(|metric| {
                let label = metric.get_label().first()?.value().to_owned();
                Some((label, metric.get_counter().get_value() as u64))
            })
            .collect()
    }

    /// Refreshes the gauges that come from the database, in one query.
    pub fn refresh_database_gauges(&self, conn: &mut PgConnection) -> Result<(), ApiError> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = BigInt)]
            held: i64,
            #[diesel(sql_type = BigInt)]
            reserved: i64,
            #[diesel(sql_type = Double)]
            oldest_age: f64,
            #[diesel(sql_type = BigInt)]
            queued: i64,
            #[diesel(sql_type = BigInt)]
            running: i64,
            #[diesel(sql_type = diesel::sql_types::Nullable<Double>)]
            reaper_last_success: Option<f64>,
            #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
            invariant_violations: Option<i64>,
            #[diesel(sql_type = BigInt)]
            webhook_pending: i64,
            #[diesel(sql_type = Double)]
            webhook_oldest_pending: f64,
        }
        let row: Row = diesel::sql_query(
            "SELECT \
               (SELECT count(*) FROM reservations WHERE state = 'held') AS held, \
               (SELECT COALESCE(sum(amount), 0)::bigint FROM reservations WHERE state = 'held') AS reserved, \
               (SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 \
                  FROM reservations WHERE state = 'held') AS oldest_age, \
               (SELECT count(*) FROM generation_jobs WHERE status = 'queued') AS queued, \
               (SELECT count(*) FROM generation_jobs WHERE status = 'running') AS running, \
               (SELECT EXTRACT(EPOCH FROM last_success_at)::float8 FROM reaper_status) AS reaper_last_success, \
               (SELECT invariant_violations::bigint FROM reaper_status) AS invariant_violations, \
               pending.count AS webhook_pending, pending.oldest AS webhook_oldest_pending \
             FROM (SELECT count(*) AS count, \
                          COALESCE(EXTRACT(EPOCH FROM now() - min(e.created_at)), 0)::float8 AS oldest \
                   FROM webhook_deliveries d \
                   JOIN webhook_endpoints w ON w.id = d.endpoint_id \
                   JOIN events e ON e.id = d.event_id \
                   WHERE d.status = 'pending' AND w.enabled AND w.deleted_at IS NULL) pending",
        )
        .get_result(conn)?;
        self.active_reservations.set(row.held);
        self.webhook_pending.set(row.webhook_pending);
        self.webhook_oldest_pending_seconds
            .set(row.webhook_oldest_pending);
        self.reserved_tokens.set(row.reserved);
        self.oldest_reservation_age_seconds.set(row.oldest_age);
        self.jobs_in_flight
            .with_label_values(&["queued"])
            .set(row.queued);
        self.jobs_in_flight
            .with_label_values(&["running"])
            .set(row.running);
        // The last pass of whichever replica ran it.
        if let Some(last_success) = row.reaper_last_success {
            self.reaper_last_success_timestamp_seconds.set(last_success);
        }
        if let Some(violations) = row.invariant_violations {
            self.invariant_violations.set(violations);
        }
        Ok(())
    }
}
