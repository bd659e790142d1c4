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
/// every 50 ms (alternating replicas) until one is accepted: the time from
/// the command's start to that acceptance is the recovery time.
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
    let started = Instant::now();
    let failover =
        tokio::task::spawn_blocking(move || Command::new("sh").arg("-c").arg(&command).status());
    let recovered = probe_until_accepted(&probe, &journal).await;
    let status = failover.await??;
    anyhow::ensure!(status.success(), "the failover command failed ({status})");
    if let Some(at) = recovered {
        lock(&journal).first_reserve_after_failover = Some(at.duration_since(started));
    }
    Ok(())
}

/// Reserves 1 token every 50 ms (and releases it) until one is accepted
/// after one has failed — an acceptance before the first failure may have
/// come from the old primary, before the kill — or 60 s pass; the moment
/// of that acceptance. Prints what the failures were.
async fn probe_until_accepted(probe: &Probe, journal: &Shared) -> Option<Instant> {
    let (account, key) = &probe.account;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut replica = 0;
    let mut failures: std::collections::BTreeMap<u16, u64> = std::collections::BTreeMap::new();
    while Instant::now() < deadline {
        replica = (replica + 1) % probe.cluster.replicas.len();
        let base = probe.cluster.url(replica);
        let body = json!({"request_id": Uuid::new_v4(), "amount": 1, "ttl_seconds": 60});
        let request = probe
            .client
            .post(format!("{base}/v1/accounts/{account}/reservations"))
            .bearer_auth(key)
            .json(&body);
        let (seen, status, answer) = send(request).await;
        if let (Seen::Ok, Some(id)) = (seen, uuid_of(&answer, "reservation_id")) {
            let at = Instant::now();
            lock(journal).reservations_seen.push(id);
            let release = probe
                .client
                .post(format!(
                    "{base}/v1/accounts/{account}/reservations/{id}/release"
                ))
                .bearer_auth(key)
                .json(&json!({}));
            let _ = send(release).await;
            if !failures.is_empty() {
                println!("failover: the probe's reservations during the switch: {failures:?} (status: count; 0 = no answer within 5 s)");
                return Some(at);
            }
        } else {
            *failures.entry(status).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// What only a failover run requires: no 500 answer, and the service took
/// reservations again after the kill.
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
