//! The reaper: recovery of what crashes and vanished kiosks leave behind,
//! and the consistency checks. Every step is a conditional update in
//! bounded batches (`REAPER_BATCH_MAX` rows per transaction), so a pass can
//! run on any replica, any number of times, even two at once, and a
//! backlog drains without one giant transaction. Checks only report.
//!
//! Every step that moves tokens is an entry point of the money engine
//! (`engine_expire_due`, `engine_finish_job`, `engine_fixup`): account rows
//! locked first, in id order, then reservations, then jobs, as everywhere.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, Text, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::ReservationRow;
use crate::db::schema::{generation_jobs, reservations};
use crate::db::states::{JobStatus, ReservationState};
use crate::domain::checks::{find_violations, Discrepancy};
use crate::engine::Outcome;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Rows handled per transaction.
pub const REAPER_BATCH_MAX: i64 = 500;
/// PostgreSQL advisory lock key: one reaper pass at a time across replicas.
pub const REAPER_LOCK_KEY: i64 = crate::db::lock_keys::REAPER;

#[derive(Clone, Debug, Default, Serialize)]
pub struct PassReport {
    pub reservations_expired: u64,
    pub jobs_failed_reservation_expired: u64,
    pub jobs_requeued: u64,
    pub jobs_failed_attempts_exhausted: u64,
    pub fixup_commits: u64,
    pub fixup_releases: u64,
    pub fixup_jobs_failed: u64,
    /// Grants whose lapse this pass wrote, and the tokens that left.
    pub grants_expired: u64,
    pub grant_tokens_expired: i64,
    /// `grant.expiring` notices sent.
    pub grants_noticed: u64,
    /// Schedule top-up rules looked at (each fired for its period unless it
    /// had), and top-up requests that expired unanswered.
    pub topup_schedules: u64,
    pub topup_requests_expired: u64,
    pub batches: u64,
    pub violations: Vec<Discrepancy>,
}

pub struct ReaperSettings {
    pub batch: i64,
    pub job_max_attempts: i32,
    /// `GRANT_EXPIRING_NOTICE_HOURS` (0: no notice).
    pub grant_expiring_notice_hours: i32,
}

/// Runs every step once, then the checks. `metrics` is optional so tests
/// and the CLI can run a pass without a registry.
pub fn run_pass(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
) -> Result<PassReport, ApiError> {
    let mut report = PassReport::default();
    lapse_grants(conn, settings, metrics, &mut report)?;
    notice_expiring_grants(conn, settings, &mut report)?;
    expire_stale_reservations(conn, settings, metrics, &mut report)?;
    requeue_expired_leases(conn, settings, &mut report)?;
    fail_exhausted_leases(conn, settings, metrics, &mut report)?;
    fix_held_reservations_of_finished_jobs(conn, settings, metrics, &mut report)?;
    fail_jobs_without_held_reservation(conn, settings, &mut report)?;
    // Last: the recovery steps above never wait for a top-up.
    run_topup_schedules(conn, settings, metrics, &mut report)?;
    report.violations = find_violations(conn)?;
    if let Some(metrics) = metrics {
        let repairs = [
            (
                "job_failed_reservation_expired",
                report.jobs_failed_reservation_expired,
            ),
            ("job_requeued", report.jobs_requeued),
            (
                "job_failed_attempts_exhausted",
                report.jobs_failed_attempts_exhausted,
            ),
            ("fixup_commit", report.fixup_commits),
            ("fixup_release", report.fixup_releases),
            ("fixup_job_failed", report.fixup_jobs_failed),
        ];
        for (kind, count) in repairs {
            if count > 0 {
                metrics
                    .consistency_repairs_total
                    .with_label_values(&[kind])
                    .inc_by(count);
            }
        }
    }
    Ok(report)
}

/// Runs a pass only if no other replica is running one (advisory lock).
/// `None` when another replica holds the lock.
pub fn run_pass_exclusive(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
) -> Result<Option<PassReport>, ApiError> {
    crate::db::with_advisory_lock(conn, REAPER_LOCK_KEY, |conn| {
        let report = run_pass(conn, settings, metrics)?;
        record_success(conn, &report)?;
        Ok(report)
    })
}

/// Records the pass in `reaper_status`, which every replica exports. When
/// the books go from balancing to not balancing, one `invariant.violated`
/// event per violating account reports it (once per such transition, not
/// on every pass; the alert `TokenInvariantViolated` keeps firing).
fn record_success(conn: &mut PgConnection, report: &PassReport) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Previous {
        #[diesel(sql_type = Integer)]
        invariant_violations: i32,
    }
    let violating = i32::try_from(crate::domain::checks::accounts_violating(
        &report.violations,
    ))
    .unwrap_or(i32::MAX);
    conn.transaction(|conn| {
        let previous: Option<Previous> = diesel::sql_query(
            "SELECT invariant_violations FROM reaper_status WHERE singleton FOR UPDATE",
        )
        .get_result(conn)
        .optional()?;
        diesel::sql_query(
            "INSERT INTO reaper_status (singleton, last_success_at, invariant_violations) VALUES (true, now(), $1) \
             ON CONFLICT (singleton) DO UPDATE SET last_success_at = now(), invariant_violations = $1",
        )
        .bind::<Integer, _>(violating)
        .execute(conn)?;
        if violating > 0 && previous.map_or(0, |row| row.invariant_violations) == 0 {
            let mut by_account: std::collections::BTreeMap<Uuid, Vec<&Discrepancy>> =
                std::collections::BTreeMap::new();
            for discrepancy in &report.violations {
                by_account
                    .entry(discrepancy.account_id)
                    .or_default()
                    .push(discrepancy);
            }
            for (account, discrepancies) in by_account {
                crate::domain::events::emit(
                    conn,
                    "invariant.violated",
                    Some(account),
                    &serde_json::json!({
                        "account_id": account,
                        "discrepancies": discrepancies,
                    }),
                )?;
            }
        }
        Ok(())
    })
}

/// Runs a bounded step until a batch comes back short, so a backlog drains
/// in transactions of at most `settings.batch` rows: `step` gets the batch
/// limit and answers how many rows it handled; each run counts a batch.
fn until_short(
    settings: &ReaperSettings,
    report: &mut PassReport,
    mut step: impl FnMut(i32, &mut PassReport) -> Result<i64, ApiError>,
) -> Result<(), ApiError> {
    let limit = i32::try_from(settings.batch).unwrap_or(i32::MAX);
    loop {
        let handled = step(limit, report)?;
        report.batches += 1;
        if handled < settings.batch {
            return Ok(());
        }
    }
}

/// One reaper transaction, with the tokens of lapsed grants it expired
/// (a reservation's rest going back to a lapsed grant) counted in
/// `token_billing_tokens_total{movement="grant_expired"}` once it commits.
fn counting_lapses<T>(
    conn: &mut PgConnection,
    metrics: Option<&Metrics>,
    step: impl FnOnce(&mut PgConnection) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    #[derive(QueryableByName)]
    struct Taken {
        #[diesel(sql_type = BigInt)]
        tokens: i64,
        #[diesel(sql_type = BigInt)]
        credited: i64,
    }
    let (result, taken) = conn.transaction(|conn| {
        let result = step(conn)?;
        // (A lapse may cross a top-up rule's threshold: its grant.)
        let taken: Taken = diesel::sql_query(
            "SELECT engine_tally_take('grant_expired') AS tokens, \
             engine_tally_take('topup_credited') AS credited",
        )
        .get_result(conn)?;
        Ok::<_, ApiError>((result, taken))
    })?;
    if let Some(metrics) = metrics {
        metrics.tokens("grant_expired", taken.tokens);
        metrics.tokens("credited", taken.credited);
    }
    Ok(result)
}

/// Step 0a: credit grants past their expiry whose lapse is not written yet
/// (no spend on their account has written it) → what they hold leaves
/// the account (ledger `grant_expire`, event `grant.expired`) — the
/// engine's `engine_expire_grants`, a bounded batch per transaction.
fn lapse_grants(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Lapsed {
        #[diesel(sql_type = Integer)]
        grants: i32,
        #[diesel(sql_type = BigInt)]
        tokens: i64,
    }
    until_short(settings, report, |limit, report| {
        let lapsed: Lapsed = counting_lapses(conn, metrics, |conn| {
            Ok(
                diesel::sql_query("SELECT grants, tokens FROM engine_expire_grants($1)")
                    .bind::<Integer, _>(limit)
                    .get_result(conn)?,
            )
        })?;
        report.grants_expired += u64::try_from(lapsed.grants).unwrap_or(0);
        report.grant_tokens_expired += lapsed.tokens;
        Ok(i64::from(lapsed.grants))
    })
}

/// Step 0b: one `grant.expiring` event per grant that lapses within
/// `GRANT_EXPIRING_NOTICE_HOURS` and still holds tokens — the engine's
/// `engine_notice_expiring_grants`.
fn notice_expiring_grants(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Noticed {
        #[diesel(sql_type = Integer)]
        noticed: i32,
    }
    if settings.grant_expiring_notice_hours == 0 {
        return Ok(());
    }
    until_short(settings, report, |limit, report| {
        let noticed = diesel::sql_query("SELECT engine_notice_expiring_grants($1, $2) AS noticed")
            .bind::<Integer, _>(settings.grant_expiring_notice_hours)
            .bind::<Integer, _>(limit)
            .get_result::<Noticed>(conn)?
            .noticed;
        report.grants_noticed += u64::try_from(noticed).unwrap_or(0);
        Ok(i64::from(noticed))
    })
}

/// Step 7: schedule top-up rules fire for their current period (once: a
/// unique key of rule and period), and top-up requests past their expiry
/// expire — the engine's `engine_topup_schedule` and
/// `engine_topup_expire_requests`, with the service's clock.
fn run_topup_schedules(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    until_short(settings, report, |limit, report| {
        let (scheduled, expired, credited) =
            crate::domain::topups::run_schedules(conn, chrono::Utc::now(), limit)?;
        if let Some(metrics) = metrics {
            metrics.tokens("credited", credited);
        }
        report.topup_schedules += u64::try_from(scheduled).unwrap_or(0);
        report.topup_requests_expired += u64::try_from(expired).unwrap_or(0);
        Ok(scheduled.max(expired))
    })
}

/// Step 1: held reservations past `expires_at` → expired, tokens back to
/// available (ledger `expire`; the part going back to a lapsed grant
/// `grant_expire`), their unfinished jobs → failed — the engine's
/// `engine_expire_due`, a bounded batch per transaction.
fn expire_stale_reservations(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Expired {
        #[diesel(sql_type = BigInt)]
        amount: i64,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        job_failed: bool,
    }
    until_short(settings, report, |limit, report| {
        let expired: Vec<Expired> = counting_lapses(conn, metrics, |conn| {
            Ok(
                diesel::sql_query("SELECT amount, job_failed FROM engine_expire_due($1)")
                    .bind::<Integer, _>(limit)
                    .load(conn)?,
            )
        })?;
        // Counted once the batch's statement has committed.
        if let Some(metrics) = metrics {
            for reservation in &expired {
                metrics.resolution("expired", 0, reservation.amount);
            }
        }
        let handled = expired.len();
        report.reservations_expired += handled as u64;
        report.jobs_failed_reservation_expired +=
            expired.iter().filter(|row| row.job_failed).count() as u64;
        Ok(handled as i64)
    })
}

/// Step 2a: running jobs whose lease expired go back to the queue (the
/// fencing token is bumped, so their old worker is shut out). A job out of
/// attempts stays for step 2b unless the provider may hold its result —
/// the engine's `engine_requeue_expired_leases`.
fn requeue_expired_leases(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Requeued {
        #[diesel(sql_type = Integer)]
        requeued: i32,
    }
    until_short(settings, report, |limit, report| {
        let requeued =
            diesel::sql_query("SELECT engine_requeue_expired_leases($1, $2) AS requeued")
                .bind::<Integer, _>(limit)
                .bind::<Integer, _>(settings.job_max_attempts)
                .get_result::<Requeued>(conn)?
                .requeued;
        report.jobs_requeued += u64::try_from(requeued).unwrap_or(0);
        Ok(i64::from(requeued))
    })
}

/// Step 2b: running jobs with an expired lease, out of attempts and never
/// submitted to the provider → failed `attempts_exhausted`, tokens
/// released — the engine's `engine_fail_exhausted_jobs` (its fenced job
/// finish, with the reaper's fence).
fn fail_exhausted_leases(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Failed {
        #[diesel(sql_type = Nullable<Jsonb>)]
        reservation: Option<serde_json::Value>,
        #[diesel(sql_type = Nullable<Bool>)]
        resolved: Option<bool>,
    }
    let limit = i32::try_from(settings.batch).unwrap_or(i32::MAX);
    let failed: Vec<Failed> = counting_lapses(conn, metrics, |conn| {
        Ok(diesel::sql_query(
            "SELECT to_jsonb(reservation) AS reservation, resolved FROM engine_fail_exhausted_jobs($1, $2)",
        )
        .bind::<Integer, _>(limit)
        .bind::<Integer, _>(settings.job_max_attempts)
        .load(conn)?)
    })?;
    for job in failed {
        report.jobs_failed_attempts_exhausted += 1;
        if let (Some(metrics), Some(true), Some(reservation)) =
            (metrics, job.resolved, job.reservation)
        {
            let reservation: ReservationRow = serde_json::from_value(reservation)
                .map_err(|error| ApiError::Internal(format!("engine reservation: {error}")))?;
            metrics.resolved(&reservation);
        }
    }
    report.batches += 1;
    Ok(())
}

/// Step 3a/3b: a finished job whose reservation is still held — succeeded
/// → commit, failed → release — with ledger reason `fixup` (the engine's
/// `engine_fixup`).
fn fix_held_reservations_of_finished_jobs(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Fixed {
        #[diesel(sql_type = Text)]
        outcome: String,
        #[diesel(sql_type = BigInt)]
        amount: i64,
    }
    let candidates: Vec<Uuid> = generation_jobs::table
        .inner_join(reservations::table.on(reservations::id.eq(generation_jobs::reservation_id)))
        .filter(generation_jobs::status.eq_any(JobStatus::TERMINAL))
        .filter(reservations::state.eq(ReservationState::Held))
        .order(generation_jobs::id)
        .limit(settings.batch)
        .select(generation_jobs::id)
        .load(conn)?;
    for job_id in candidates {
        let fixed: Fixed = counting_lapses(conn, metrics, |conn| {
            Ok(
                diesel::sql_query("SELECT outcome, amount FROM engine_fixup($1)")
                    .bind::<SqlUuid, _>(job_id)
                    .get_result(conn)?,
            )
        })?;
        let committed = match Outcome::parse(&fixed.outcome)? {
            Outcome::Committed => {
                report.fixup_commits += 1;
                fixed.amount
            }
            Outcome::Released => {
                report.fixup_releases += 1;
                0
            }
            _ => continue,
        };
        tracing::warn!(%job_id, outcome = %fixed.outcome, "fix-up: settled the held reservation of a finished job");
        if let Some(metrics) = metrics {
            metrics.resolution(&fixed.outcome, committed, fixed.amount - committed);
        }
    }
    report.batches += 1;
    Ok(())
}

/// Step 3c: a job still queued or running whose reservation is no longer
/// held can never be charged: it fails (its tokens are already back) — the
/// engine's `engine_fail_orphaned_jobs`, a bounded batch per transaction.
fn fail_jobs_without_held_reservation(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    #[derive(QueryableByName)]
    struct Failed {
        #[diesel(sql_type = Integer)]
        failed: i32,
    }
    until_short(settings, report, |limit, report| {
        let failed = diesel::sql_query("SELECT engine_fail_orphaned_jobs($1) AS failed")
            .bind::<Integer, _>(limit)
            .get_result::<Failed>(conn)?
            .failed;
        report.fixup_jobs_failed += u64::try_from(failed).unwrap_or(0);
        Ok(i64::from(failed))
    })
}
