//! The chaos run's failover mode: one loss of the primary at a moment drawn
//! from the seed, and the checks that nothing acknowledged was lost.

use std::process::Command;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Array, Uuid as SqlUuid};
use rand::rngs::StdRng;
use rand::Rng;
use uuid::Uuid;

use std::sync::Arc;

use serde_json::json;

use super::{lock, send, uuid_of, Cluster, Count, Journal, Seen, Shared};

/// Who probes: the replicas, an account and its kiosk key, a client.
pub(super) struct Probe {
    pub cluster: Arc<Cluster>,
    pub account: (Uuid, String),
    pub client: reqwest::Client,
}

/// Runs `command` (kill the primary, promote the standby) once, between a
/// quarter and three fifths of the run, while a probe tries a reservation
/// every 50 ms (alternating replicas). The longest time between two
/// accepted probes is the unavailability a kiosk saw.
pub(super) async fn fail_over_once(
    command: String,
    journal: Shared,
    mut rng: StdRng,
    seconds: u64,
    probe: Probe,
) -> anyhow::Result<()> {
    let run_ms = seconds.saturating_mul(1000);
    let at_ms = rng.gen_range(run_ms / 4..=(run_ms * 3 / 5).max(run_ms / 4 + 1));
    tokio::time::sleep(Duration::from_millis(at_ms)).await;
    println!("failover: killing the primary {at_ms} ms into the run");
    {
        let mut journal = lock(&journal);
        journal.failover_at = Some(Instant::now());
        *journal.faults.entry("primary_failover").or_insert(0) += 1;
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing = tokio::spawn(probe_during(probe, Arc::clone(&journal), Arc::clone(&done)));
    let status =
        tokio::task::spawn_blocking(move || Command::new("sh").arg("-c").arg(&command).status())
            .await??;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let gap = probing.await?;
    anyhow::ensure!(status.success(), "the failover command failed ({status})");
    lock(&journal).first_reserve_after_failover = gap;
    Ok(())
}

/// Reserves 1 token every 50 ms (releasing each) until `done` and one more
/// is accepted (60 s at most). The longest time between two accepted
/// reservations, counted from the probe's start; `None` when none was
/// accepted after `done`. Prints how the others were answered.
async fn probe_during(
    probe: Probe,
    journal: Shared,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> Option<Duration> {
    let (account, key) = &probe.account;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let mut last_accepted = started;
    let mut longest = Duration::ZERO;
    let mut replica = 0;
    let mut refused: std::collections::BTreeMap<u16, u64> = std::collections::BTreeMap::new();
    let mut accepted = 0u64;
    while Instant::now() < deadline {
        let finishing = done.load(std::sync::atomic::Ordering::Relaxed);
        replica = (replica + 1) % probe.cluster.replicas.len();
        let base = probe.cluster.url(replica);
        let body = json!({"request_id": Uuid::new_v4(), "amount": 1, "ttl_seconds": 5});
        let request = probe
            .client
            .post(format!("{base}/v1/accounts/{account}/reservations"))
            .bearer_auth(key)
            .json(&body);
        let (seen, status, answer) = send(request).await;
        if let (Seen::Ok, Some(id)) = (seen, uuid_of(&answer, "reservation_id")) {
            let now = Instant::now();
            longest = longest.max(now.duration_since(last_accepted));
            last_accepted = now;
            accepted += 1;
            lock(&journal).reservations_seen.push(id);
            let release = probe
                .client
                .post(format!(
                    "{base}/v1/accounts/{account}/reservations/{id}/release"
                ))
                .bearer_auth(key)
                .json(&json!({}));
            let _ = send(release).await;
            if finishing {
                println!(
                    "failover: probe reservations: {accepted} accepted, others {refused:?} \
                     (status: count; 0 = no answer within 5 s)"
                );
                return Some(longest);
            }
        } else {
            *refused.entry(status).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("failover: no probe reservation accepted after the switch: {refused:?}");
    None
}

/// Acknowledged work absent from the books (the database the run ends on:
/// after a failover, the new primary), one line per kind. Reservations and
/// credits are violations here; job creations, job successes and commits
/// are counted here and checked one by one by `check_books`.
pub(super) fn acknowledged_missing(
    conn: &mut PgConnection,
    journal: &Journal,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let jobs: Vec<Uuid> = journal.job_answers.iter().map(|(_, _, job)| *job).collect();
    let commits: Vec<Uuid> = journal.commits_seen.iter().map(|(id, _)| *id).collect();
    let counted: [(&str, &[Uuid], &str); 3] = [
        (
            "job creations",
            &jobs,
            "SELECT count(*) AS count FROM generation_jobs WHERE id = ANY($1)",
        ),
        (
            "job successes",
            &journal.jobs_seen_succeeded,
            "SELECT count(*) AS count FROM generation_jobs WHERE id = ANY($1) AND status = 'succeeded'",
        ),
        (
            "commits",
            &commits,
            "SELECT count(*) AS count FROM reservations WHERE id = ANY($1) AND state = 'committed'",
        ),
    ];
    for (name, seen, sql) in counted {
        let missing = missing(conn, sql, seen)?;
        println!("acknowledged {name}: {}, missing {missing}", seen.len());
    }
    let checks: [(&str, &[Uuid], &str); 2] = [
        (
            "reservations",
            &journal.reservations_seen,
            "SELECT count(*) AS count FROM reservations WHERE id = ANY($1)",
        ),
        (
            "credits",
            &journal.credits_seen,
            "SELECT count(*) AS count FROM credits WHERE id = ANY($1)",
        ),
    ];
    for (name, seen, sql) in checks {
        let missing = missing(conn, sql, seen)?;
        println!("acknowledged {name}: {}, missing {missing}", seen.len());
        if missing != 0 {
            violations.push(format!(
                "{missing} of {} acknowledged {name} are not in the books",
                seen.len()
            ));
        }
    }
    Ok(violations)
}

/// How many of `seen` (distinct ids) the count query `sql` does not find.
fn missing(conn: &mut PgConnection, sql: &str, seen: &[Uuid]) -> anyhow::Result<i64> {
    let mut distinct = seen.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let found = diesel::sql_query(sql)
        .bind::<Array<SqlUuid>, _>(&distinct)
        .get_result::<Count>(conn)?
        .count;
    Ok(i64::try_from(distinct.len())? - found)
}

/// What every run requires of the answers: no 500 (a database that is
/// away, restarting, failing over or full is a 503); and, after a
/// failover run's kill, that the service took reservations again.
pub(super) fn failover_violations(journal: &Journal, server_errors: u64) -> Vec<String> {
    let mut violations = Vec::new();
    if server_errors > 0 {
        violations.push(format!(
            "{server_errors} answers 500 (a database away must be a 503)"
        ));
    }
    if journal.failover_at.is_some() && journal.first_reserve_after_failover.is_none() {
        violations.push("no reservation was accepted after the failover".into());
    }
    violations
}
