//! Fencing: a worker whose lease was taken over (it paused past its lease
//! and another worker reclaimed the job) can neither commit nor fail the
//! job, nor extend it; the new owner can.

use diesel::prelude::*;
use serde_json::json;

use token_billing::db::schema::{accounts, generation_jobs, reservations};
use token_billing::domain::job_leases::{self, Fenced, JobError};

use crate::helpers::{assert_account_invariants, create_job, funded, TestDatabase};

/// Sets the reservation's expiry `seconds` from now.
fn expires_in(conn: &mut PgConnection, reservation: uuid::Uuid, seconds: f64) {
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() + make_interval(secs => $2) WHERE id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(reservation)
    .bind::<diesel::sql_types::Double, _>(seconds)
    .execute(conn)
    .expect("expiry");
}

#[test]
fn a_worker_that_lost_its_lease_changes_nothing() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "fence", 2);
    create_job(&mut conn, account);

    let paused = job_leases::claim_next(&mut conn, "worker-a", 30, 3)
        .expect("claim")
        .expect("a job");
    assert_eq!((paused.status.as_str(), paused.attempts), ("running", 1));
    assert!(
        job_leases::claim_next(&mut conn, "worker-b", 30, 3)
            .expect("claim")
            .is_none(),
        "leased jobs are not claimable"
    );

    // Worker A pauses past its lease; worker B reclaims the job.
    diesel::update(generation_jobs::table.find(paused.id))
        .set(generation_jobs::lease_expires_at.eq(diesel::dsl::sql::<
            diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>,
        >("now() - interval '1 second'")))
        .execute(&mut conn)
        .expect("expire lease");
    let current = job_leases::claim_next(&mut conn, "worker-b", 30, 3)
        .expect("claim")
        .expect("reclaimed");
    assert_eq!(current.id, paused.id);
    assert_eq!(current.lease_token, paused.lease_token + 1);

    // Worker A wakes up: every write it tries is fenced off.
    let stale = paused.lease_token;
    assert_eq!(
        job_leases::finish_success(&mut conn, &paused, stale, &json!({"output": "x"}))
            .expect("db")
            .fenced,
        Fenced::LeaseLost
    );
    let error = JobError::new("provider_failed", "late failure");
    assert_eq!(
        job_leases::finish_failure(&mut conn, &paused, stale, &error)
            .expect("db")
            .fenced,
        Fenced::LeaseLost
    );
    assert_eq!(
        job_leases::retry_later(&mut conn, &paused, stale, &error, 10, 300).expect("db"),
        Fenced::LeaseLost
    );
    assert_eq!(
        job_leases::heartbeat(&mut conn, paused.id, stale, 30, 300).expect("db"),
        Fenced::LeaseLost
    );
    assert_eq!(
        job_leases::record_provider_job_id(&mut conn, paused.id, stale, "pred_a").expect("db"),
        Fenced::LeaseLost
    );

    let (status, owner, provider_id): (String, Option<String>, Option<String>) =
        generation_jobs::table
            .find(paused.id)
            .select((
                generation_jobs::status,
                generation_jobs::lease_owner,
                generation_jobs::provider_job_id,
            ))
            .first(&mut conn)
            .expect("job");
    assert_eq!(
        (status.as_str(), owner.as_deref(), provider_id),
        ("running", Some("worker-b"), None)
    );
    let state: String = reservations::table
        .find(paused.reservation_id)
        .select(reservations::state)
        .first(&mut conn)
        .expect("reservation");
    assert_eq!(state, "held");
    let balances = assert_account_invariants(&mut conn, account.0);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (1, 1, 0)
    );

    // The current owner finishes normally.
    assert_eq!(
        job_leases::heartbeat(&mut conn, current.id, current.lease_token, 30, 300).expect("db"),
        Fenced::Done
    );
    assert_eq!(
        job_leases::finish_success(
            &mut conn,
            &current,
            current.lease_token,
            &json!({"output": "y"})
        )
        .expect("db")
        .fenced,
        Fenced::Done
    );
    // And a second finish of the same lease is fenced too (exactly once).
    assert_eq!(
        job_leases::finish_failure(&mut conn, &current, current.lease_token, &error)
            .expect("db")
            .fenced,
        Fenced::LeaseLost
    );
    let balances = assert_account_invariants(&mut conn, account.0);
    assert_eq!(
        (balances.available, balances.reserved, balances.used),
        (1, 0, 1)
    );
}

#[test]
fn a_job_whose_reservation_expired_fails_instead_of_succeeding_for_free() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "expiry", 2);
    let failed_job = |conn: &mut PgConnection, id| {
        let (status, error): (String, Option<serde_json::Value>) = generation_jobs::table
            .find(id)
            .select((generation_jobs::status, generation_jobs::error))
            .first(conn)
            .expect("job");
        (status, error.map(|error| error["code"].clone()))
    };
    // The reservation expires (the reaper's transition, done by hand here).
    let expire = |conn: &mut PgConnection, reservation| {
        diesel::sql_query(
            "WITH r AS (UPDATE reservations SET state = 'expired', resolved_at = now() WHERE id = $1 RETURNING amount, account_id) \
             UPDATE accounts a SET reserved = a.reserved - r.amount, available = a.available + r.amount, \
                    active_reservations = active_reservations - 1 FROM r WHERE a.id = r.account_id",
        )
        .bind::<diesel::sql_types::Uuid, _>(reservation)
        .execute(conn)
        .expect("expire");
    };

    // A heartbeat that finds the reservation gone fails the job at once
    // (it is never queued again); the worker's later finish changes nothing.
    create_job(&mut conn, account);
    let job = job_leases::claim_next(&mut conn, "worker", 30, 3)
        .expect("claim")
        .expect("job");
    expire(&mut conn, job.reservation_id);
    assert_eq!(
        job_leases::heartbeat(&mut conn, job.id, job.lease_token, 30, 300).expect("db"),
        Fenced::ReservationLost
    );
    assert_eq!(
        failed_job(&mut conn, job.id),
        ("failed".to_owned(), Some(json!("reservation_expired")))
    );
    let outcome = job_leases::finish_success(
        &mut conn,
        &job,
        job.lease_token,
        &json!({"output": "free?"}),
    )
    .expect("db");
    assert_eq!(outcome.fenced, Fenced::LeaseLost);

    // A finish that finds the reservation gone fails the job instead of
    // succeeding without a charge.
    create_job(&mut conn, account);
    let job = job_leases::claim_next(&mut conn, "worker", 30, 3)
        .expect("claim")
        .expect("job");
    expire(&mut conn, job.reservation_id);
    let outcome = job_leases::finish_success(
        &mut conn,
        &job,
        job.lease_token,
        &json!({"output": "free?"}),
    )
    .expect("db");
    assert_eq!(outcome.fenced, Fenced::ReservationLost);
    assert_eq!(
        failed_job(&mut conn, job.id),
        ("failed".to_owned(), Some(json!("reservation_expired")))
    );
    let used: i64 = accounts::table
        .find(account.0)
        .select(accounts::used)
        .first(&mut conn)
        .expect("account");
    assert_eq!(used, 0, "no job was charged");
}

#[test]
fn one_heartbeat_for_many_jobs_answers_each_and_changes_only_what_it_should() {
    use diesel::sql_types::{Double, Text, Uuid as SqlUuid};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        row: String,
    }
    #[derive(QueryableByName)]
    struct Seconds {
        #[diesel(sql_type = Double)]
        seconds: f64,
    }
    // The whole job and reservation rows, as text.
    let rows = |conn: &mut PgConnection, job: uuid::Uuid| -> (String, String) {
        let mut row = |sql: &'static str| {
            diesel::sql_query(sql)
                .bind::<SqlUuid, _>(job)
                .get_result::<Row>(conn)
                .expect("row")
                .row
        };
        let job_row = row("SELECT to_jsonb(j)::text AS row FROM generation_jobs j WHERE id = $1");
        let reservation = row("SELECT to_jsonb(r)::text AS row FROM reservations r \
             JOIN generation_jobs j ON j.reservation_id = r.id WHERE j.id = $1");
        (job_row, reservation)
    };
    // Seconds from now to the job's lease end and its reservation's expiry.
    let ahead = |conn: &mut PgConnection, job: uuid::Uuid| -> (f64, f64) {
        let mut seconds = |sql: &'static str| {
            diesel::sql_query(sql)
                .bind::<SqlUuid, _>(job)
                .get_result::<Seconds>(conn)
                .expect("seconds")
                .seconds
        };
        (
            seconds(
                "SELECT extract(epoch FROM lease_expires_at - now())::float8 AS seconds \
                 FROM generation_jobs WHERE id = $1",
            ),
            seconds(
                "SELECT extract(epoch FROM r.expires_at - now())::float8 AS seconds \
                 FROM reservations r JOIN generation_jobs j ON j.reservation_id = r.id \
                 WHERE j.id = $1",
            ),
        )
    };
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let (first, second) = (
        funded(&mut conn, "beats-1", 10),
        funded(&mut conn, "beats-2", 10),
    );
    let claim = |conn: &mut PgConnection, account| {
        create_job(conn, account);
        job_leases::claim_next(conn, "worker", 30, 3)
            .expect("claim")
            .expect("a job")
    };
    let fine = claim(&mut conn, first);
    let stale = claim(&mut conn, first);
    let steady = claim(&mut conn, first);
    let expired = claim(&mut conn, second);
    let far = claim(&mut conn, second);
    // `fine`: its reservation's expiry is near (100 s, within half the
    // 300 s TTL), so the heartbeat extends it. `steady`: its reservation
    // runs 250 s yet, so only its lease moves. `stale`: another worker
    // holds it now. `expired`: its reservation is past its expiry, still
    // held (the reaper has not come by). `far`: lease and reservation
    // already run beyond what a heartbeat asks for.
    diesel::sql_query("UPDATE generation_jobs SET lease_token = lease_token + 1 WHERE id = $1")
        .bind::<SqlUuid, _>(stale.id)
        .execute(&mut conn)
        .expect("reclaim");
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<SqlUuid, _>(expired.reservation_id)
    .execute(&mut conn)
    .expect("past expiry");
    diesel::sql_query(
        "WITH j AS (UPDATE generation_jobs SET lease_expires_at = now() + interval '1 hour' \
                    WHERE id = $1 RETURNING reservation_id) \
         UPDATE reservations SET expires_at = now() + interval '2 hours' \
         WHERE id = (SELECT reservation_id FROM j)",
    )
    .bind::<SqlUuid, _>(far.id)
    .execute(&mut conn)
    .expect("far");
    for (job, seconds) in [(&fine, 100.0), (&steady, 250.0)] {
        expires_in(&mut conn, job.reservation_id, seconds);
    }
    let steady_reservation_before = rows(&mut conn, steady.id).1;
    let stale_before = rows(&mut conn, stale.id);
    let far_reservation_before = rows(&mut conn, far.id).1;
    let ledger = |conn: &mut PgConnection| -> i64 {
        token_billing::db::schema::ledger_entries::table
            .count()
            .get_result(conn)
            .expect("ledger")
    };
    let ledger_before = ledger(&mut conn);

    let answers = job_leases::heartbeat_many(
        &mut conn,
        &[
            (far.id, far.lease_token),
            (fine.id, fine.lease_token),
            (expired.id, expired.lease_token),
            (stale.id, stale.lease_token),
            (steady.id, steady.lease_token),
            (fine.id, fine.lease_token),
        ],
        30,
        300,
    )
    .expect("heartbeat");
    let mut expected = vec![
        (fine.id, fine.lease_token, Fenced::Done),
        (stale.id, stale.lease_token, Fenced::LeaseLost),
        (expired.id, expired.lease_token, Fenced::ReservationLost),
        (far.id, far.lease_token, Fenced::Done),
        (steady.id, steady.lease_token, Fenced::Done),
    ];
    expected.sort_by_key(|(id, token, _)| (*id, *token));
    assert_eq!(answers, expected, "one answer per job, in id order");

    // Fine: lease and reservation extended.
    let (lease, reservation) = ahead(&mut conn, fine.id);
    assert!((25.0..=30.0).contains(&lease), "lease {lease} s ahead");
    assert!(
        (295.0..=300.0).contains(&reservation),
        "reservation {reservation} s ahead"
    );
    // Steady: the lease extended, the reservation row untouched (one row
    // version per heartbeat: the job's).
    let (lease, _) = ahead(&mut conn, steady.id);
    assert!((25.0..=30.0).contains(&lease), "lease {lease} s ahead");
    assert_eq!(rows(&mut conn, steady.id).1, steady_reservation_before);
    // Far: never shortened; the reservation row untouched.
    let (lease, _) = ahead(&mut conn, far.id);
    assert!(lease > 3_500.0, "lease {lease} s ahead: not shortened");
    assert_eq!(rows(&mut conn, far.id).1, far_reservation_before);
    // Stale: nothing changed.
    assert_eq!(rows(&mut conn, stale.id), stale_before);
    // Past expiry: expired now (its tokens back), the job failed and fenced.
    let failed: (String, Option<serde_json::Value>, i64) = generation_jobs::table
        .find(expired.id)
        .select((
            generation_jobs::status,
            generation_jobs::error,
            generation_jobs::lease_token,
        ))
        .first(&mut conn)
        .expect("job");
    assert_eq!(
        (
            failed.0.as_str(),
            failed.1.map(|error| error["code"].clone())
        ),
        ("failed", Some(json!("reservation_expired")))
    );
    assert_eq!(failed.2, expired.lease_token + 1);
    let state: String = reservations::table
        .find(expired.reservation_id)
        .select(reservations::state)
        .first(&mut conn)
        .expect("reservation");
    assert_eq!(state, "expired");
    assert_eq!(
        ledger(&mut conn),
        ledger_before + 1,
        "one expire entry, nothing else"
    );
    let balances = assert_account_invariants(&mut conn, first.0);
    assert_eq!((balances.available, balances.reserved), (7, 3));
    let balances = assert_account_invariants(&mut conn, second.0);
    assert_eq!((balances.available, balances.reserved), (9, 1));
}

/// The heartbeat's window: a reservation is extended once its expiry comes
/// within half its TTL *or two leases*, whichever is longer, so it always
/// outlives the lease by more than a heartbeat's interval (half a lease).
/// With a 30 s lease and a 100 s TTL, a reservation 55 s from its expiry is
/// past half its TTL (50 s) but within two leases (60 s): it is extended;
/// one 65 s away is not. A retry always extends it, to outlive its backoff.
#[test]
fn a_reservation_within_two_leases_of_its_expiry_is_extended() {
    use diesel::dsl::sql;
    use diesel::sql_types::Double;
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "window", 10);
    let mut claimed = Vec::new();
    for seconds in [55.0, 65.0, 250.0] {
        create_job(&mut conn, account);
        let job = job_leases::claim_next(&mut conn, "worker", 30, 3)
            .expect("claim")
            .expect("a job");
        expires_in(&mut conn, job.reservation_id, seconds);
        claimed.push(job);
    }
    let jobs: Vec<_> = claimed[..2]
        .iter()
        .map(|job| (job.id, job.lease_token))
        .collect();
    let answers = job_leases::heartbeat_many(&mut conn, &jobs, 30, 100).expect("heartbeat");
    assert!(answers.iter().all(|(_, _, fenced)| *fenced == Fenced::Done));
    let ahead = |conn: &mut PgConnection, reservation: uuid::Uuid| -> f64 {
        reservations::table
            .find(reservation)
            .select(sql::<Double>(
                "extract(epoch FROM expires_at - now())::float8",
            ))
            .first(conn)
            .expect("reservation")
    };
    let within = ahead(&mut conn, claimed[0].reservation_id);
    assert!(
        (95.0..=100.0).contains(&within),
        "55 s from its expiry, within two leases: extended to {within} s"
    );
    let beyond = ahead(&mut conn, claimed[1].reservation_id);
    assert!(
        (60.0..=65.0).contains(&beyond),
        "65 s from its expiry: left at {beyond} s"
    );
    let retried = &claimed[2];
    let error = JobError::new("provider_unavailable", "try again");
    let fenced =
        job_leases::retry_later(&mut conn, retried, retried.lease_token, &error, 10_000, 300)
            .expect("retry");
    assert_eq!(fenced, Fenced::Done);
    let retried = ahead(&mut conn, retried.reservation_id);
    assert!(
        (305.0..=310.0).contains(&retried),
        "a retry 10 s later extends by 310 s: {retried} s"
    );
}

/// A retry puts the job back for its backoff: no worker claims it before
/// then; after it, the next claim takes it (a new token, a second attempt).
#[test]
fn a_retried_job_is_claimed_again_only_after_its_backoff() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let account = funded(&mut conn, "backoff", 2);
    create_job(&mut conn, account);
    let job = job_leases::claim_next(&mut conn, "worker-a", 30, 3)
        .expect("claim")
        .expect("a job");
    let error = JobError::new("provider_unavailable", "try again");
    let fenced = job_leases::retry_later(&mut conn, &job, job.lease_token, &error, 60_000, 300)
        .expect("retry");
    assert_eq!(fenced, Fenced::Done);
    let early = job_leases::claim_next(&mut conn, "worker-b", 30, 3).expect("claim");
    assert!(early.is_none(), "claimed during its backoff: {early:?}");
    diesel::sql_query(
        "UPDATE generation_jobs SET next_attempt_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind::<diesel::sql_types::Uuid, _>(job.id)
    .execute(&mut conn)
    .expect("backoff over");
    let again = job_leases::claim_next(&mut conn, "worker-b", 30, 3)
        .expect("claim")
        .expect("the job, its backoff over");
    assert_eq!(again.id, job.id);
    assert_eq!(again.attempts, 2);
    assert!(again.lease_token > job.lease_token);
}
