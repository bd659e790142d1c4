//! The reaper on a schedule (tokio-cron-scheduler, `REAPER_SCHEDULE`) and
//! once at start-up; the daily closings and retention on
//! `RETENTION_SCHEDULE`. A pass runs under a PostgreSQL advisory lock, so one
//! replica works at a time; every step is conditional anyway. A failing
//! pass is logged and counted, and never takes the scheduler down.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio_cron_scheduler::{Job, JobScheduler};

use crate::config::Config;
use crate::db::DbPool;
use crate::domain::checks::accounts_violating;
use crate::domain::history::{close_days, last_closed_day};
use crate::domain::reaper::{run_pass_exclusive, PassReport, ReaperSettings, REAPER_BATCH_MAX};
use crate::domain::retention::{run_pass_exclusive as run_retention, RetentionSettings};
use crate::error::ApiError;

/// Days one scheduled pass closes at most (a backlog closes over passes).
const CLOSE_DAYS_PER_PASS_MAX: usize = 400;
use crate::metrics::Metrics;

pub fn settings(config: &Config) -> ReaperSettings {
    ReaperSettings {
        batch: REAPER_BATCH_MAX,
        job_max_attempts: config.job_max_attempts,
        grant_expiring_notice_hours: config.grant_expiring_notice_hours,
    }
}

/// One pass (if no other replica is running one), with its metrics and logs.
pub async fn reaper_pass(
    pool: DbPool,
    settings: ReaperSettings,
    metrics: Arc<Metrics>,
) -> Result<Option<PassReport>, ApiError> {
    let counted = Arc::clone(&metrics);
    let result = tokio::task::spawn_blocking(move || {
        let mut conn = pool.get()?;
        run_pass_exclusive(&mut conn, &settings, Some(&counted))
    })
    .await
    .map_err(|error| ApiError::Internal(format!("reaper task failed: {error}")))?;
    match &result {
        Ok(Some(report)) => {
            metrics.reaper_runs_total.with_label_values(&["ok"]).inc();
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64());
            metrics.reaper_last_success_timestamp_seconds.set(now);
            let violating = accounts_violating(&report.violations);
            metrics
                .invariant_violations
                .set(i64::try_from(violating).unwrap_or(i64::MAX));
            for discrepancy in &report.violations {
                tracing::error!(
                    account_id = %discrepancy.account_id,
                    check = %discrepancy.check,
                    expected = discrepancy.expected,
                    actual = discrepancy.actual,
                    "token invariant violated"
                );
            }
            let changed = report.reservations_expired
                + report.jobs_requeued
                + report.jobs_failed_attempts_exhausted
                + report.jobs_failed_reservation_expired
                + report.fixup_commits
                + report.fixup_releases
                + report.fixup_jobs_failed;
            if changed > 0 {
                tracing::info!(?report, "reaper pass repaired");
            }
        }
        Ok(None) => tracing::debug!("reaper pass skipped: another replica holds the lock"),
        Err(error) => {
            metrics
                .reaper_runs_total
                .with_label_values(&["error"])
                .inc();
            tracing::error!(?error, "reaper pass failed");
        }
    }
    result
}

/// Closes the days that have ended (daily closing balances), then runs a
/// retention pass (if no other replica is running one), with metrics and
/// logs. Never fails the schedule.
pub async fn history_pass(
    pool: DbPool,
    retention: RetentionSettings,
    metrics: Arc<Metrics>,
) -> Result<Option<crate::domain::retention::PassReport>, ApiError> {
    let counted = Arc::clone(&metrics);
    let result = tokio::task::spawn_blocking(move || {
        let mut conn = pool.get()?;
        let closed = close_days(&mut conn, chrono::Utc::now(), CLOSE_DAYS_PER_PASS_MAX)?;
        if !closed.days.is_empty() {
            tracing::info!(
                days = closed.days.len(),
                rows = closed.rows,
                "daily closings written"
            );
        }
        if let Some(day) = last_closed_day(&mut conn)? {
            let midnight = day.and_time(chrono::NaiveTime::MIN).and_utc();
            counted
                .ledger_last_closed_day_timestamp_seconds
                .set(midnight.timestamp() as f64);
        }
        run_retention(&mut conn, &retention, Some(&counted))
    })
    .await
    .map_err(|error| ApiError::Internal(format!("history task failed: {error}")))?;
    match &result {
        Ok(Some(report)) if report.pruned.values().any(|n| *n > 0) => {
            tracing::info!(?report, "retention pass pruned");
        }
        Ok(_) => {}
        Err(error) => tracing::error!(?error, "daily closing or retention pass failed"),
    }
    result
}

/// Starts the scheduled reaper; keep the returned scheduler alive.
pub async fn start(
    pool: DbPool,
    config: &Config,
    metrics: Arc<Metrics>,
) -> anyhow::Result<JobScheduler> {
    let scheduler = JobScheduler::new().await?;
    let (history_pool, history_metrics) = (pool.clone(), Arc::clone(&metrics));
    let job_max_attempts = config.job_max_attempts;
    let grant_expiring_notice_hours = config.grant_expiring_notice_hours;
    let job = Job::new_async(config.reaper_schedule.as_str(), move |_id, _scheduler| {
        let (pool, metrics) = (pool.clone(), Arc::clone(&metrics));
        Box::pin(async move {
            let settings = ReaperSettings {
                batch: REAPER_BATCH_MAX,
                job_max_attempts,
                grant_expiring_notice_hours,
            };
            // Errors are logged and counted inside; the schedule goes on.
            let _ = reaper_pass(pool, settings, metrics).await;
        })
    })
    .map_err(|error| anyhow::anyhow!("REAPER_SCHEDULE {:?}: {error}", config.reaper_schedule))?;
    scheduler.add(job).await?;
    let retention = RetentionSettings::from_config(config);
    let (pool, metrics) = (history_pool, history_metrics);
    let job = Job::new_async(
        config.retention_schedule.as_str(),
        move |_id, _scheduler| {
            let (pool, metrics, retention) =
                (pool.clone(), Arc::clone(&metrics), retention.clone());
            Box::pin(async move {
                // Errors are logged inside; the schedule goes on.
                let _ = history_pass(pool, retention, metrics).await;
            })
        },
    )
    .map_err(|error| {
        anyhow::anyhow!(
            "RETENTION_SCHEDULE {:?}: {error}",
            config.retention_schedule
        )
    })?;
    scheduler.add(job).await?;
    scheduler.start().await?;
    Ok(scheduler)
}
