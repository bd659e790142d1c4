//! The reaper: each repair made exactly once (also with two passes at the
//! same time), racing commits, the start-up pass, detection without repair,
//! and a large backlog drained in bounded batches.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::db::models::JobRow;
use token_billing::db::schema::{generation_jobs, ledger_entries, reservations};
use token_billing::domain::reaper::{run_pass, PassReport, ReaperSettings};
use token_billing::engine::types::AccountId;
use token_billing::scheduler::{reaper_pass, settings};

use crate::crash::start_service_with;
use crate::helpers::{
    assert_account_invariants, create_job, funded, reserve, FakeProvider, TestApp, TestDatabase,
    ADMIN_KEY,
};

const SETTINGS: ReaperSettings = ReaperSettings {
    batch: 500,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 72,
};

fn job(conn: &mut PgConnection, account: AccountId) -> JobRow {
    create_job(conn, account)
}

fn sql(conn: &mut PgConnection, statement: &str, id: Uuid) {
    diesel::sql_query(statement)
        .bind::<SqlUuid, _>(id)
        .execute(conn)
        .expect(statement);
}

/// Ledger entries of one reservation: (kind, reason).
fn entries(conn: &mut PgConnection, reservation: Uuid) -> Vec<(String, Option<String>)> {
    ledger_entries::table
        .filter(ledger_entries::reservation_id.eq(reservation))
        .order(ledger_entries::id.asc())
        .select((ledger_entries::kind, ledger_entries::reason))
        .load(conn)
        .expect("ledger")
}

fn entry(kind: &str, reason: Option<&str>) -> (String, Option<String>) {
    (kind.to_owned(), reason.map(str::to_owned))
}

fn job_state(conn: &mut PgConnection, id: Uuid) -> (String, Option<Value>, i64) {
    generation_jobs::table
        .find(id)
        .select((
            generation_jobs::status,
            generation_jobs::error,
            generation_jobs::lease_token,
        ))
        .first(conn)
        .expect("job")
}

fn reservation_state(conn: &mut PgConnection, id: Uuid) -> String {
    reservations::table
        .find(id)
        .select(reservations::state)
        .first(conn)
        .expect("reservation")
}

fn two_passes_at_once(database: &TestDatabase) -> Vec<PassReport> {
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (barrier, url) = (Arc::clone(&barrier), database.url.clone());
            std::thread::spawn(move || {
                let mut conn = token_billing::db::connect_session(&url).expect("connect");
                barrier.wait();
                run_pass(&mut conn, &SETTINGS, None).expect("pass")
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().expect("thread"))
        .collect()
}

#[test]
fn every_fixup_is_made_exactly_once_even_by_two_passes_at_once() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "reaper", 20);

    // (a) job succeeded, reservation still held.
    let succeeded = job(&mut conn, account);
    sql(&mut conn, "UPDATE generation_jobs SET status = 'succeeded', finished_at = now(), result = '{}' WHERE id = $1", succeeded.id);
    // (b) job failed, reservation still held.
    let failed = job(&mut conn, account);
    sql(
        &mut conn,
        "UPDATE generation_jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        failed.id,
    );
    // (c) job still queued, reservation no longer held.
    let orphan = job(&mut conn, account);
    // Released behind the job's back, by the engine's settle rule itself.
    diesel::sql_query(
        "SELECT outcome FROM engine_apply(ARRAY[engine_settlement('release', $1, $2, NULL, NULL, $3, \
         'test', 'test')])",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<SqlUuid, _>(orphan.reservation_id)
    .bind::<SqlUuid, _>(orphan.id)
    .execute(&mut conn)
    .expect("release");
    // (d) an API reservation past its expiry, and a job's reservation too.
    let zombie = reserve(&mut conn, account, 2);
    sql(
        &mut conn,
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
        zombie.id,
    );
    let expiring = job(&mut conn, account);
    sql(
        &mut conn,
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
        expiring.reservation_id,
    );
    // (e) running job whose lease expired, attempts left → requeued.
    let abandoned = job(&mut conn, account);
    sql(&mut conn, "UPDATE generation_jobs SET status = 'running', attempts = 1, lease_token = 1, lease_owner = 'dead-worker', lease_expires_at = now() - interval '1 second' WHERE id = $1", abandoned.id);
    // (f) running job, lease expired, out of attempts, never submitted.
    let exhausted = job(&mut conn, account);
    sql(&mut conn, "UPDATE generation_jobs SET status = 'running', attempts = 3, lease_expires_at = now() - interval '1 second' WHERE id = $1", exhausted.id);
    let abandoned_token = job_state(&mut conn, abandoned.id).2;

    let reports = two_passes_at_once(&database);
    let total = |field: fn(&PassReport) -> u64| reports.iter().map(field).sum::<u64>();
    assert_eq!(total(|r| r.fixup_commits), 1);
    assert_eq!(total(|r| r.fixup_releases), 1);
    assert_eq!(total(|r| r.reservations_expired), 2);
    assert_eq!(total(|r| r.jobs_failed_reservation_expired), 1);
    assert_eq!(total(|r| r.jobs_requeued), 1);
    assert_eq!(total(|r| r.jobs_failed_attempts_exhausted), 1);
    assert!(
        reports.iter().all(|report| report.violations.is_empty()),
        "{reports:?}"
    );

    assert_eq!(
        reservation_state(&mut conn, succeeded.reservation_id),
        "committed"
    );
    assert_eq!(
        entries(&mut conn, succeeded.reservation_id),
        vec![entry("reserve", None), entry("commit", Some("fixup"))]
    );
    assert_eq!(
        reservation_state(&mut conn, failed.reservation_id),
        "released"
    );
    assert_eq!(
        entries(&mut conn, failed.reservation_id),
        vec![entry("reserve", None), entry("release", Some("fixup"))]
    );
    let (status, error, _) = job_state(&mut conn, orphan.id);
    assert_eq!(
        (status.as_str(), error.map(|e| e["code"].clone())),
        ("failed", Some(json!("reservation_expired")))
    );
    assert_eq!(
        entries(&mut conn, zombie.id),
        vec![entry("reserve", None), entry("expire", Some("expired"))]
    );
    let (status, error, _) = job_state(&mut conn, expiring.id);
    assert_eq!(
        (status.as_str(), error.map(|e| e["code"].clone())),
        ("failed", Some(json!("reservation_expired")))
    );
    assert_eq!(
        entries(&mut conn, expiring.reservation_id),
        vec![entry("reserve", None), entry("expire", Some("expired"))]
    );
    let (status, _, token) = job_state(&mut conn, abandoned.id);
    assert_eq!(status, "queued");
    assert_eq!(token, abandoned_token + 1, "the old holder is fenced off");
    assert_eq!(
        reservation_state(&mut conn, abandoned.reservation_id),
        "held",
        "a requeued job keeps its tokens"
    );
    let (status, error, _) = job_state(&mut conn, exhausted.id);
    assert_eq!(
        (status.as_str(), error.map(|e| e["code"].clone())),
        ("failed", Some(json!("attempts_exhausted")))
    );
    assert_eq!(
        entries(&mut conn, exhausted.reservation_id),
        vec![
            entry("reserve", None),
            entry("release", Some("attempts_exhausted"))
        ]
    );
    assert_account_invariants(&mut conn, account.0);

    // A further pass finds nothing left to do.
    let again = run_pass(&mut conn, &SETTINGS, None).expect("pass");
    assert_eq!(
        (
            again.fixup_commits,
            again.fixup_releases,
            again.reservations_expired,
            again.fixup_jobs_failed,
            again.jobs_failed_attempts_exhausted
        ),
        (0, 0, 0, 0, 0)
    );
}

/// A job out of attempts that the provider already holds (its result may
/// still come) never has its tokens released: the exhausted step passes it
/// over, and the reaper queues it again for a worker to ask the provider.
#[test]
fn a_job_the_provider_holds_is_requeued_never_failed_when_out_of_attempts() {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "provider", 5);
    let submitted = job(&mut conn, account);
    sql(&mut conn, "UPDATE generation_jobs SET status = 'running', attempts = 3, lease_token = 1, lease_owner = 'dead-worker', provider_job_id = 'pred_1', lease_expires_at = now() - interval '1 second' WHERE id = $1", submitted.id);
    let failed = diesel::sql_query("SELECT count(*) AS n FROM engine_fail_exhausted_jobs(500, 3)")
        .get_result::<Count>(&mut conn)
        .expect("exhausted step")
        .n;
    assert_eq!(
        failed, 0,
        "the exhausted step failed a job the provider holds"
    );
    assert_eq!(job_state(&mut conn, submitted.id).0, "running");
    let report = run_pass(&mut conn, &SETTINGS, None).expect("pass");
    assert_eq!(
        (report.jobs_requeued, report.jobs_failed_attempts_exhausted),
        (1, 0)
    );
    let (status, _, token) = job_state(&mut conn, submitted.id);
    assert_eq!((status.as_str(), token), ("queued", 2));
    assert_eq!(
        entries(&mut conn, submitted.reservation_id),
        vec![entry("reserve", None)],
        "its tokens stay held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_racing_commit_exactly_one_wins() {
    const ROUNDS: usize = 50;
    let app = Arc::new(TestApp::spawn_with(|config| config.worker_concurrency = 0).await);
    let account = app
        .funded_account(i64::try_from(ROUNDS).expect("fits"))
        .await;
    let mut commits = 0;
    for round in 0..ROUNDS {
        let reservation: Value = app
            .reserve(account, ADMIN_KEY, Uuid::new_v4(), 1)
            .await
            .json()
            .await
            .expect("json");
        let id: Uuid = reservation["reservation_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("uuid");
        sql(&mut app.conn(), "UPDATE reservations SET expires_at = clock_timestamp() + interval '25 milliseconds' WHERE id = $1", id);
        let url = app.database.url.clone();
        let reaper = tokio::task::spawn_blocking(move || {
            let mut conn = token_billing::db::connect_session(&url).expect("connect");
            let deadline = Instant::now() + Duration::from_secs(2);
            while reservation_state(&mut conn, id) == "held" && Instant::now() < deadline {
                run_pass(&mut conn, &SETTINGS, None).expect("pass");
            }
        });
        // Commits land before, at and after the expiry instant.
        tokio::time::sleep(Duration::from_millis((round % 5 * 10) as u64)).await;
        let response = app
            .post(
                &format!("/v1/accounts/{account}/reservations/{id}/commit"),
                ADMIN_KEY,
                &json!({}),
            )
            .await;
        let status = response.status();
        reaper.await.expect("reaper");
        let state = reservation_state(&mut app.conn(), id);
        let kinds: Vec<String> = entries(&mut app.conn(), id)
            .into_iter()
            .map(|(kind, _)| kind)
            .collect();
        if status == StatusCode::OK {
            commits += 1;
            assert_eq!(
                (state.as_str(), kinds),
                ("committed", vec!["reserve".to_owned(), "commit".to_owned()])
            );
        } else {
            assert_eq!(status, StatusCode::CONFLICT);
            assert_eq!(
                (state.as_str(), kinds),
                ("expired", vec!["reserve".to_owned(), "expire".to_owned()])
            );
        }
    }
    let balances = app.assert_invariants(account);
    assert_eq!((balances.used, balances.reserved), (commits, 0));
    assert_eq!(
        balances.available,
        i64::try_from(ROUNDS).expect("fits") - commits
    );
    eprintln!(
        "reaper racing commit: {commits} commits won, {} expiries won",
        ROUNDS as i64 - commits
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_pass_runs_before_readyz_first_answers() {
    let provider = FakeProvider::start(0).await;
    let database = TestDatabase::create();
    let account;
    {
        let mut conn = database.connect();
        account = funded(&mut conn, "reaper", 10);
        let zombie = reserve(&mut conn, account, 3);
        sql(
            &mut conn,
            "UPDATE reservations SET expires_at = now() - interval '1 minute' WHERE id = $1",
            zombie.id,
        );
        let done = job(&mut conn, account);
        sql(
            &mut conn,
            "UPDATE generation_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1",
            done.id,
        );
        let dead = job(&mut conn, account);
        sql(&mut conn, "UPDATE generation_jobs SET status = 'running', attempts = 3, lease_expires_at = now() - interval '1 minute' WHERE id = $1", dead.id);
    }
    // No workers: whatever is repaired, the start-up pass repaired.
    let service =
        start_service_with(&database.url, &provider.url, &[("WORKER_CONCURRENCY", "0")]).await;
    assert!(service.base.starts_with("http://"));
    let mut conn = database.connect();
    let held: i64 = reservations::table
        .filter(reservations::state.eq("held"))
        .count()
        .get_result(&mut conn)
        .expect("count");
    let open: i64 = generation_jobs::table
        .filter(generation_jobs::status.eq_any(["queued", "running"]))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(
        (held, open),
        (0, 0),
        "consistent before the first 200 from /readyz"
    );
    let balances = assert_account_invariants(&mut conn, account.0);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (9, 0, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_balance_is_detected_counted_and_not_fixed() {
    let app = TestApp::spawn_with(|config| config.worker_concurrency = 0).await;
    let account = app.funded_account(10).await;
    let healthy = app.funded_account(4).await;
    app.allow_broken_books();
    sql(
        &mut app.conn(),
        "UPDATE accounts SET available = available + 5 WHERE id = $1",
        account,
    );

    let report = reaper_pass(
        app.state.pool.clone(),
        settings(&app.state.config),
        Arc::clone(&app.state.metrics),
    )
    .await
    .expect("pass")
    .expect("lock free");
    let checks: Vec<(Uuid, &str, i64, i64)> = report
        .violations
        .iter()
        .map(|d| (d.account_id, d.check.as_str(), d.expected, d.actual))
        .collect();
    assert_eq!(
        checks,
        vec![
            (account, "balance_invariant", 10, 15),
            (account, "ledger_replay_available", 10, 15),
            // Its grants hold 10: the grants check names it too.
            (account, "grants_remaining_equals_available", 10, 15),
        ],
        "the corrupted account and nothing else"
    );
    assert!(!checks.iter().any(|(id, ..)| *id == healthy));
    assert_eq!(app.state.metrics.invariant_violations.get(), 1);
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("token_billing_invariant_violations 1"),
        "{metrics}"
    );
    assert_eq!(
        app.account(account).await["available"],
        15,
        "detected, not repaired"
    );
    // Any replica exports the last pass's outcome, not only the one that ran it.
    let other_replica = token_billing::metrics::Metrics::new().expect("metrics");
    other_replica
        .refresh_database_gauges(&mut app.conn())
        .expect("refresh");
    assert_eq!(other_replica.invariant_violations.get(), 1);
    assert!(other_replica.reaper_last_success_timestamp_seconds.get() > 1.0e9);
    // One invariant.violated event for the account, on the transition from
    // balancing to not; a second pass that finds the same adds none.
    reaper_pass(
        app.state.pool.clone(),
        settings(&app.state.config),
        Arc::clone(&app.state.metrics),
    )
    .await
    .expect("pass")
    .expect("lock free");
    #[derive(QueryableByName)]
    struct Violated {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        account_id: Uuid,
        #[diesel(sql_type = diesel::sql_types::Text)]
        checks: String,
    }
    let events: Vec<Violated> = diesel::sql_query(
        "SELECT account_id, (SELECT string_agg(d->>'check', ',' ORDER BY d->>'check') \
                              FROM jsonb_array_elements(data->'discrepancies') d) AS checks \
         FROM events WHERE type = 'invariant.violated'",
    )
    .load(&mut app.conn())
    .expect("events");
    let events: Vec<(Uuid, String)> = events
        .into_iter()
        .map(|event| (event.account_id, event.checks))
        .collect();
    assert_eq!(
        events,
        vec![(
            account,
            "balance_invariant,grants_remaining_equals_available,ledger_replay_available"
                .to_owned()
        )]
    );
    let violated = crate::helpers::events_of(&mut app.conn(), account, "invariant.violated");
    crate::openapi_types::assert_data_conforms(&app, "invariant.violated", &violated[0]).await;
}

/// Builds `count` held, expired reservations of 1 token on one account,
/// with a consistent account row and ledger (set-based SQL).
fn zombies(conn: &mut PgConnection, count: i64) -> Uuid {
    let account = funded(conn, "reaper", count).0;
    diesel::sql_query(
        "WITH made AS ( \
             INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at, created_at) \
             SELECT gen_random_uuid(), $1, gen_random_uuid(), 1, 'held', now() - interval '1 hour', now() - interval '2 hours' \
             FROM generate_series(1, $2) RETURNING id) \
         INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, actor) \
         SELECT $1, 'reserve', 1, $2 - n, n, 0, id, 'test' \
         FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM made) numbered",
    )
    .bind::<SqlUuid, _>(account)
    .bind::<BigInt, _>(count)
    .execute(conn)
    .expect("zombies");
    diesel::sql_query(
        "UPDATE accounts SET available = 0, reserved = $2, active_reservations = $2::int WHERE id = $1",
    )
    .bind::<SqlUuid, _>(account)
    .bind::<BigInt, _>(count)
    .execute(conn)
    .expect("account");
    account
}

#[test]
fn ten_thousand_zombies_drain_in_bounded_batches() {
    const ZOMBIES: i64 = 10_000;
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = zombies(&mut conn, ZOMBIES);
    assert_account_invariants(&mut conn, account);
    let started = Instant::now();
    let report = run_pass(&mut conn, &SETTINGS, None).expect("pass");
    let elapsed = started.elapsed();
    assert_eq!(report.reservations_expired, 10_000);
    assert!(
        report.batches >= 20,
        "drained in batches of at most {}: {report:?}",
        SETTINGS.batch
    );
    assert!(report.violations.is_empty(), "{report:?}");
    let balances = assert_account_invariants(&mut conn, account);
    assert_eq!((balances.available, balances.reserved), (ZOMBIES, 0));
    eprintln!(
        "drained {ZOMBIES} expired reservations in {:.2} s ({} batches)",
        elapsed.as_secs_f64(),
        report.batches
    );
}
