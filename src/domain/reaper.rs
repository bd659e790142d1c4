//! The reaper: recovery of what crashes and vanished kiosks leave behind,
//! and the consistency checks. Every step is a conditional update in
//! bounded batches (`REAPER_BATCH_MAX` rows per transaction), so a pass can
//! run on any replica, any number of times, even two at once, and a
//! backlog drains without one giant transaction. Checks only report.
//!
//! Lock order, as everywhere: reservation, then account, then job.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Jsonb, Text, Uuid as SqlUuid};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::db::models::ReservationRow;
use crate::domain::checks::{find_violations, Discrepancy};
use crate::domain::job_leases::SYSTEM_ACTOR;
use crate::domain::reservations::{settle, Resolution};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Rows handled per transaction.
pub const REAPER_BATCH_MAX: i64 = 500;
/// PostgreSQL advisory lock key: one reaper pass at a time across replicas.
pub const REAPER_LOCK_KEY: i64 = 7_243_003;

#[derive(Clone, Debug, Default, Serialize)]
pub struct PassReport {
    pub reservations_expired: u64,
    pub jobs_failed_reservation_expired: u64,
    pub jobs_requeued: u64,
    pub jobs_failed_attempts_exhausted: u64,
    pub fixup_commits: u64,
    pub fixup_releases: u64,
    pub fixup_jobs_failed: u64,
    pub batches: u64,
    pub violations: Vec<Discrepancy>,
}

pub struct ReaperSettings {
    pub batch: i64,
    pub job_max_attempts: i32,
}

/// Runs every step once, then the checks. `metrics` is optional so tests
/// and the CLI can run a pass without a registry.
pub fn run_pass(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
) -> Result<PassReport, ApiError> {
    let mut report = PassReport::default();
    expire_stale_reservations(conn, settings, metrics, &mut report)?;
    requeue_expired_leases(conn, settings, &mut report)?;
    fail_exhausted_leases(conn, settings, metrics, &mut report)?;
    fix_held_reservations_of_finished_jobs(conn, settings, metrics, &mut report)?;
    fail_jobs_without_held_reservation(conn, &mut report)?;
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
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        locked: bool,
    }
    let Locked { locked } = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<BigInt, _>(REAPER_LOCK_KEY)
        .get_result(conn)?;
    if !locked {
        return Ok(None);
    }
    let result = run_pass(conn, settings, metrics).and_then(|report| {
        record_success(conn, &report)?;
        Ok(report)
    });
    // Released even when the pass failed; a broken connection drops it too.
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(REAPER_LOCK_KEY)
        .execute(conn);
    let report = result?;
    unlocked?;
    Ok(Some(report))
}

/// Records the pass in `reaper_status`, which every replica exports.
fn record_success(conn: &mut PgConnection, report: &PassReport) -> Result<(), ApiError> {
    let violating = i32::try_from(crate::domain::checks::accounts_violating(
        &report.violations,
    ))
    .unwrap_or(i32::MAX);
    diesel::sql_query(
        "INSERT INTO reaper_status (singleton, last_success_at, invariant_violations) VALUES (true, now(), $1) \
         ON CONFLICT (singleton) DO UPDATE SET last_success_at = now(), invariant_violations = $1",
    )
    .bind::<Integer, _>(violating)
    .execute(conn)?;
    Ok(())
}

fn fail_job(
    conn: &mut PgConnection,
    job_id: Uuid,
    code: &str,
    message: &str,
) -> Result<bool, diesel::result::Error> {
    // Bumping lease_token fences off a worker that may still hold the job.
    let updated = diesel::sql_query(
        "UPDATE generation_jobs \
         SET status = 'failed', error = $2, finished_at = now(), updated_at = now(), \
             lease_expires_at = NULL, lease_token = lease_token + 1 \
         WHERE id = $1 AND status IN ('queued', 'running')",
    )
    .bind::<SqlUuid, _>(job_id)
    .bind::<Jsonb, _>(json!({"code": code, "message": message}))
    .execute(conn)?;
    Ok(updated == 1)
}

/// Step 1: held reservations past `expires_at` → expired, tokens back to
/// available (ledger `expire`), their unfinished jobs → failed.
fn expire_stale_reservations(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    loop {
        // Counted only once the batch has committed.
        let (expired, jobs_failed) =
            conn.transaction(|conn| -> Result<(Vec<ReservationRow>, u64), ApiError> {
                let mut expired: Vec<ReservationRow> = diesel::sql_query(
                    "UPDATE reservations SET state = 'expired', resolved_at = now() \
                 WHERE id IN (SELECT id FROM reservations \
                              WHERE state = 'held' AND expires_at <= now() \
                              ORDER BY account_id, id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   AND state = 'held' AND expires_at <= now() \
                 RETURNING *",
                )
                .bind::<BigInt, _>(settings.batch)
                .load(conn)?;
                // Accounts locked in id order: concurrent batches cannot deadlock.
                expired.sort_by_key(|row| (row.account_id, row.id));
                let mut jobs_failed = 0;
                for reservation in &expired {
                    settle(
                        conn,
                        reservation,
                        Resolution::Expire,
                        Some("expired"),
                        SYSTEM_ACTOR,
                    )?;
                    if let Some(job_id) = reservation.job_id {
                        if fail_job(
                            conn,
                            job_id,
                            "reservation_expired",
                            "the job's reservation expired",
                        )? {
                            jobs_failed += 1;
                        }
                    }
                }
                Ok((expired, jobs_failed))
            })?;
        if let Some(metrics) = metrics {
            for reservation in &expired {
                metrics.resolution("expired", 0, reservation.amount);
            }
        }
        let handled = expired.len();
        report.batches += 1;
        report.reservations_expired += handled as u64;
        report.jobs_failed_reservation_expired += jobs_failed;
        if (handled as i64) < settings.batch {
            return Ok(());
        }
    }
}

/// Step 2a: running jobs whose lease expired go back to the queue (the
/// fencing token is bumped, so their old worker is shut out). A job out of
/// attempts stays for step 2b unless the provider may hold its result.
fn requeue_expired_leases(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    loop {
        let requeued = diesel::sql_query(
            "UPDATE generation_jobs \
             SET status = 'queued', lease_expires_at = NULL, lease_token = lease_token + 1, \
                 next_attempt_at = now(), updated_at = now() \
             WHERE id IN (SELECT id FROM generation_jobs \
                          WHERE status = 'running' AND lease_expires_at < now() \
                            AND (attempts < $2 OR provider_job_id IS NOT NULL) \
                          LIMIT $1 FOR UPDATE SKIP LOCKED) \
               AND status = 'running' AND lease_expires_at < now()",
        )
        .bind::<BigInt, _>(settings.batch)
        .bind::<Integer, _>(settings.job_max_attempts)
        .execute(conn)?;
        report.batches += 1;
        report.jobs_requeued += requeued as u64;
        if (requeued as i64) < settings.batch {
            return Ok(());
        }
    }
}

#[derive(QueryableByName)]
struct Candidate {
    #[diesel(sql_type = SqlUuid)]
    job_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    reservation_id: Uuid,
}

/// Resolves the reservation of a job (held → `state`) when the job still
/// matches `job_condition`; reservation row locked first.
fn resolve_for_job(
    conn: &mut PgConnection,
    candidate: &Candidate,
    state: &str,
    job_condition: &str,
) -> Result<Option<ReservationRow>, diesel::result::Error> {
    diesel::sql_query(format!(
        "UPDATE reservations \
         SET state = $3, committed_amount = CASE WHEN $3 = 'committed' THEN amount ELSE 0 END, \
             resolved_at = now() \
         WHERE id = $1 AND state = 'held' \
           AND EXISTS (SELECT 1 FROM generation_jobs j WHERE j.id = $2 AND {job_condition}) \
         RETURNING *"
    ))
    .bind::<SqlUuid, _>(candidate.reservation_id)
    .bind::<SqlUuid, _>(candidate.job_id)
    .bind::<Text, _>(state)
    .get_result(conn)
    .optional()
}

/// Step 2b: running jobs with an expired lease, out of attempts and never
/// submitted to the provider → failed, tokens released.
fn fail_exhausted_leases(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    let candidates: Vec<Candidate> = diesel::sql_query(
        "SELECT id AS job_id, reservation_id FROM generation_jobs \
         WHERE status = 'running' AND lease_expires_at < now() AND attempts >= $2 \
           AND provider_job_id IS NULL \
         ORDER BY id LIMIT $1",
    )
    .bind::<BigInt, _>(settings.batch)
    .bind::<Integer, _>(settings.job_max_attempts)
    .load(conn)?;
    let condition = "j.status = 'running' AND j.lease_expires_at < now()";
    for candidate in &candidates {
        // Some(tokens released) once committed; None when nothing was done.
        let done = conn.transaction(|conn| -> Result<Option<i64>, ApiError> {
            let reservation = resolve_for_job(conn, candidate, "released", condition)?;
            if !fail_job(
                conn,
                candidate.job_id,
                "attempts_exhausted",
                "the job's workers kept losing their lease",
            )? {
                return Ok(None);
            }
            if let Some(reservation) = &reservation {
                settle(
                    conn,
                    reservation,
                    Resolution::Release,
                    Some("attempts_exhausted"),
                    SYSTEM_ACTOR,
                )?;
            }
            Ok(Some(
                reservation.map_or(0, |reservation| reservation.amount),
            ))
        })?;
        if let Some(released) = done {
            report.jobs_failed_attempts_exhausted += 1;
            if let (Some(metrics), true) = (metrics, released > 0) {
                metrics.resolution("released", 0, released);
            }
        }
    }
    report.batches += 1;
    Ok(())
}

/// Step 3a/3b: a finished job whose reservation is still held — succeeded
/// → commit, failed → release — with ledger reason `fixup`.
fn fix_held_reservations_of_finished_jobs(
    conn: &mut PgConnection,
    settings: &ReaperSettings,
    metrics: Option<&Metrics>,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    for (status, state) in [("succeeded", "committed"), ("failed", "released")] {
        let candidates: Vec<Candidate> = diesel::sql_query(
            "SELECT j.id AS job_id, j.reservation_id FROM generation_jobs j \
             JOIN reservations r ON r.id = j.reservation_id \
             WHERE j.status = $2 AND r.state = 'held' ORDER BY j.id LIMIT $1",
        )
        .bind::<BigInt, _>(settings.batch)
        .bind::<Text, _>(status)
        .load(conn)?;
        let condition = format!("j.status = '{status}'");
        for candidate in &candidates {
            let fixed = conn.transaction(|conn| -> Result<Option<i64>, ApiError> {
                let Some(reservation) = resolve_for_job(conn, candidate, state, &condition)? else {
                    return Ok(None);
                };
                let resolution = if state == "committed" {
                    Resolution::Commit(reservation.amount)
                } else {
                    Resolution::Release
                };
                settle(conn, &reservation, resolution, Some("fixup"), SYSTEM_ACTOR)?;
                Ok(Some(reservation.amount))
            })?;
            if let Some(amount) = fixed {
                tracing::warn!(job_id = %candidate.job_id, status, "fix-up: settled the held reservation of a finished job");
                if let Some(metrics) = metrics {
                    let committed = if state == "committed" { amount } else { 0 };
                    metrics.resolution(state, committed, amount - committed);
                }
                if state == "committed" {
                    report.fixup_commits += 1;
                } else {
                    report.fixup_releases += 1;
                }
            }
        }
        report.batches += 1;
    }
    Ok(())
}

/// Step 3c: a job still queued or running whose reservation is no longer
/// held can never be charged: it fails (its tokens are already back).
fn fail_jobs_without_held_reservation(
    conn: &mut PgConnection,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    let failed = diesel::sql_query(
        "UPDATE generation_jobs j \
         SET status = 'failed', finished_at = now(), updated_at = now(), lease_expires_at = NULL, \
             lease_token = j.lease_token + 1, \
             error = jsonb_build_object('code', 'reservation_expired', \
                                        'message', 'the job''s reservation is no longer held') \
         FROM reservations r \
         WHERE r.id = j.reservation_id AND j.status IN ('queued', 'running') AND r.state <> 'held'",
    )
    .execute(conn)?;
    report.fixup_jobs_failed += failed as u64;
    Ok(())
}
