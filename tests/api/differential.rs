//! Differential test: random histories — credits, adjustments, reserves
//! (with refusals, replays and reuses), full and partial commits, releases,
//! extends, expiries, suspensions, limit changes, jobs succeeding and
//! failing, reaper passes, and bursts of concurrent requests on several
//! accounts (which the coalescer runs as cross-account batches) — go to the
//! real service (HTTP, the worker's fenced finish, the reaper) and to the
//! plain model (`model.rs`). Every answer (status and code), every
//! account's balances after every step, and at the end every reservation,
//! job and ledger entry must agree.

use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::db::schema::{accounts, generation_jobs, reservations};
use token_billing::domain::job_leases::{finish_failure, finish_success, JobError};
use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{ledger_of, property_config, TestApp, ADMIN_KEY};
use crate::model::{JobStatus, Model, Reply};

const ACCOUNTS: usize = 3;
/// Each account's low-balance threshold (0: off).
const THRESHOLDS: [i64; ACCOUNTS] = [0, 3, 20];

#[derive(Clone, Debug)]
enum Key {
    Admin,
    OwnKiosk,
    OtherKiosk,
}

#[derive(Clone, Debug)]
enum Step {
    /// `reuse`: the reference of an earlier credit (a replay, or a reuse
    /// with another amount or account).
    Credit(usize, i64, Option<usize>),
    Adjust(usize, i64, Option<usize>),
    /// `replay`: an earlier request_id of the account, with this amount.
    /// TTLs are long (≥ 10 min) so nothing expires by the clock during a
    /// history: expiry is the explicit `Age` step, which the model sees.
    Reserve(usize, i64, Option<i32>, Option<usize>, Key),
    /// Commit the n-th reservation through account `a` (maybe not its
    /// own), optionally partially.
    Commit(usize, usize, Option<i64>),
    Release(usize, usize),
    Extend(usize, usize),
    /// Push the n-th reservation past its expiry.
    Age(usize),
    /// Push the n-th job's reservation past its expiry.
    AgeJob(usize),
    Suspend(usize, bool),
    Limit(usize, i64),
    /// A job (`replay`: an earlier request of the account; `seed`: params).
    Job(usize, Option<usize>, u64),
    /// A worker finishes the n-th job.
    Finish(usize, bool),
    Reaper,
    /// One reserve on each listed account, all at once.
    Burst(Vec<(usize, i64)>),
}

fn step() -> impl Strategy<Value = Step> {
    let account = 0..ACCOUNTS;
    let key = prop_oneof![
        6 => Just(Key::Admin),
        3 => Just(Key::OwnKiosk),
        1 => Just(Key::OtherKiosk),
    ];
    prop_oneof![
        3 => (account.clone(), 1..8i64, prop::option::weighted(0.2, 0..20usize))
            .prop_map(|(a, n, r)| Step::Credit(a, n, r)),
        1 => (account.clone(), prop_oneof![-6..0i64, 1..4i64], prop::option::weighted(0.2, 0..20usize))
            .prop_map(|(a, n, r)| Step::Adjust(a, n, r)),
        6 => (account.clone(), 1..4i64, prop::option::weighted(0.2, 600..86_400i32),
              prop::option::weighted(0.2, 0..20usize), key)
            .prop_map(|(a, n, t, r, k)| Step::Reserve(a, n, t, r, k)),
        4 => (account.clone(), 0..40usize, prop::option::weighted(0.3, 1..4i64))
            .prop_map(|(a, n, m)| Step::Commit(a, n, m)),
        2 => (account.clone(), 0..40usize).prop_map(|(a, n)| Step::Release(a, n)),
        1 => (account.clone(), 0..40usize).prop_map(|(a, n)| Step::Extend(a, n)),
        2 => (0..40usize).prop_map(Step::Age),
        2 => (0..20usize).prop_map(Step::AgeJob),
        1 => (account.clone(), any::<bool>()).prop_map(|(a, s)| Step::Suspend(a, s)),
        1 => (account.clone(), 0..4i64).prop_map(|(a, l)| Step::Limit(a, l)),
        3 => (account.clone(), prop::option::weighted(0.2, 0..10usize), 0..2u64)
            .prop_map(|(a, r, s)| Step::Job(a, r, s)),
        2 => (0..20usize, any::<bool>()).prop_map(|(n, s)| Step::Finish(n, s)),
        1 => Just(Step::Reaper),
        2 => prop::collection::btree_map(account, 1..3i64, 2..=ACCOUNTS)
            .prop_map(|m| Step::Burst(m.into_iter().collect())),
    ]
}

/// The service side of the test: ids the model's indices stand for.
struct Real {
    app: TestApp,
    accounts: Vec<Uuid>,
    kiosks: Vec<String>,
    reservations: Vec<Uuid>,
    jobs: Vec<(Uuid, Uuid)>,
    credit_refs: Vec<String>,
    adjustment_refs: Vec<String>,
    requests: Vec<Vec<(u64, i64, Option<i32>)>>,
    job_requests: Vec<Vec<(u64, u64)>>,
    next_request: u64,
}

fn request_uuid(n: u64) -> Uuid {
    Uuid::from_u64_pair(0x0d1f_f000_0000_0000, n)
}

async fn reply(response: reqwest::Response) -> (Reply, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let code = body["code"]
        .as_str()
        .map(|code| -> &'static str { Box::leak(code.to_owned().into_boxed_str()) });
    let code = if status < 300 { None } else { code };
    (Reply { status, code }, body)
}

impl Real {
    async fn reserve_request(
        &mut self,
        account: usize,
        n: u64,
        amount: i64,
        ttl: Option<i32>,
        key: &Key,
    ) -> (Reply, Value) {
        let key = match key {
            Key::Admin => ADMIN_KEY.to_owned(),
            Key::OwnKiosk => self.kiosks[account].clone(),
            Key::OtherKiosk => self.kiosks[(account + 1) % ACCOUNTS].clone(),
        };
        let mut body = json!({"request_id": request_uuid(n), "amount": amount});
        if let Some(ttl) = ttl {
            body["ttl_seconds"] = json!(ttl);
        }
        let path = format!("/v1/accounts/{}/reservations", self.accounts[account]);
        reply(self.app.post(&path, &key, &body).await).await
    }
}

fn remember(list: &mut Vec<Uuid>, index: Option<usize>, id: Option<Uuid>) {
    if let (Some(index), Some(id)) = (index, id) {
        if index == list.len() {
            list.push(id);
        }
    }
}

fn uuid_of(value: &Value) -> Option<Uuid> {
    value.as_str().and_then(|text| text.parse().ok())
}

async fn resolve_request(
    real: &Real,
    account: usize,
    index: usize,
    verb: &str,
    body: &Value,
) -> Reply {
    let url = format!(
        "/v1/accounts/{}/reservations/{}/{verb}",
        real.accounts[account], real.reservations[index]
    );
    reply(real.app.post(&url, ADMIN_KEY, body).await).await.0
}

async fn run_step(real: &mut Real, model: &mut Model, step: &Step, conn: &mut PgConnection) {
    let path = |real: &Real, account: usize| format!("/v1/accounts/{}", real.accounts[account]);
    let (expected, actual) = match step.clone() {
        Step::Credit(account, amount, reuse) => {
            let reference = reuse
                .and_then(|n| real.credit_refs.get(n).cloned())
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            real.credit_refs.push(reference.clone());
            let body = json!({"amount": amount, "external_ref": reference});
            let actual = reply(
                real.app
                    .post(
                        &format!("{}/credits", path(real, account)),
                        ADMIN_KEY,
                        &body,
                    )
                    .await,
            )
            .await
            .0;
            (model.credit(account, amount, &reference), actual)
        }
        Step::Adjust(account, amount, reuse) => {
            let reference = reuse
                .and_then(|n| real.adjustment_refs.get(n).cloned())
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            real.adjustment_refs.push(reference.clone());
            let body = json!({"amount": amount, "reason": "correction", "external_ref": reference});
            let actual = reply(
                real.app
                    .post(
                        &format!("{}/adjustments", path(real, account)),
                        ADMIN_KEY,
                        &body,
                    )
                    .await,
            )
            .await
            .0;
            (model.adjust(account, amount, &reference), actual)
        }
        Step::Reserve(account, amount, ttl, replay, key) => {
            let earlier = replay.and_then(|n| {
                let list = &real.requests[account];
                list.get(n % list.len().max(1)).copied()
            });
            let n = match earlier {
                Some((n, _, _)) => n,
                None => {
                    real.next_request += 1;
                    real.next_request
                }
            };
            let (actual, body) = real.reserve_request(account, n, amount, ttl, &key).await;
            if matches!(key, Key::OtherKiosk) {
                (
                    Reply {
                        status: 404,
                        code: Some("not_found"),
                    },
                    actual,
                )
            } else {
                let (expected, index) = model.reserve(account, n, amount, ttl);
                if expected.status == 201 {
                    real.requests[account].push((n, amount, ttl));
                }
                remember(
                    &mut real.reservations,
                    index,
                    uuid_of(&body["reservation_id"]),
                );
                (expected, actual)
            }
        }
        Step::Commit(account, n, amount) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            let body = amount.map_or(json!({}), |amount| json!({"amount": amount}));
            let actual = resolve_request(real, account, index, "commit", &body).await;
            (model.resolve(account, index, Some(amount)), actual)
        }
        Step::Release(account, n) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            let actual = resolve_request(real, account, index, "release", &json!({})).await;
            (model.resolve(account, index, None), actual)
        }
        Step::Extend(account, n) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            let url = format!(
                "{}/reservations/{}/extend",
                path(real, account),
                real.reservations[index]
            );
            let actual = reply(
                real.app
                    .post(&url, ADMIN_KEY, &json!({"ttl_seconds": 300}))
                    .await,
            )
            .await
            .0;
            (model.extend(account, index), actual)
        }
        Step::AgeJob(n) if !model.jobs.is_empty() => {
            let reservation = model.jobs[n % model.jobs.len()].reservation;
            let step = Step::Age(reservation);
            return Box::pin(run_step(real, model, &step, conn)).await;
        }
        Step::Age(n) if !model.reservations.is_empty() => {
            let index = n % model.reservations.len();
            diesel::sql_query("UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1 AND state = 'held'")
                .bind::<SqlUuid, _>(real.reservations[index])
                .execute(conn)
                .expect("age");
            if model.reservations[index].state == crate::model::State::Held {
                model.reservations[index].past_expiry = true;
            }
            return;
        }
        Step::Suspend(account, suspended) => {
            let status = if suspended { "suspended" } else { "active" };
            let body = json!({"status": status});
            let response = real.app.patch(&path(real, account), ADMIN_KEY, &body).await;
            (
                model.set_status(account, suspended),
                reply(response).await.0,
            )
        }
        Step::Limit(account, limit) => {
            let body = json!({"max_active_reservations": limit});
            let response = real.app.patch(&path(real, account), ADMIN_KEY, &body).await;
            (model.set_limit(account, limit), reply(response).await.0)
        }
        Step::Job(account, replay, seed) => {
            let earlier = replay.and_then(|n| {
                let list = &real.job_requests[account];
                list.get(n % list.len().max(1)).copied()
            });
            let n = match earlier {
                Some((n, _)) => n,
                None => {
                    real.next_request += 1;
                    real.next_request
                }
            };
            let body = json!({"request_id": request_uuid(n), "kind": "standard", "params": {"seed": seed}});
            let (actual, body) = reply(
                real.app
                    .post(&format!("{}/jobs", path(real, account)), ADMIN_KEY, &body)
                    .await,
            )
            .await;
            let (expected, _) = model.create_job(account, n, seed, 1);
            if expected.status == 201 {
                real.job_requests[account].push((n, seed));
                real.reservations
                    .push(uuid_of(&body["reservation"]["reservation_id"]).expect("reservation id"));
                real.jobs
                    .push((uuid_of(&body["job_id"]).expect("job id"), request_uuid(n)));
            }
            (expected, actual)
        }
        Step::Finish(n, success) if !model.jobs.is_empty() => {
            let index = n % model.jobs.len();
            let job_id = real.jobs[index].0;
            // The worker's claim (no money moves), then its fenced finish.
            let claimed: Option<token_billing::db::models::JobRow> = diesel::sql_query(
                "UPDATE generation_jobs SET status = 'running', lease_token = lease_token + 1, \
                 lease_expires_at = now() + interval '30 seconds', attempts = attempts + 1 \
                 WHERE id = $1 AND status = 'queued' RETURNING *",
            )
            .bind::<SqlUuid, _>(job_id)
            .get_result(conn)
            .optional()
            .expect("claim");
            assert_eq!(
                claimed.is_some(),
                model.jobs[index].status == JobStatus::Queued,
                "job {index} claimable"
            );
            if let Some(job) = claimed {
                if success {
                    finish_success(conn, &job, job.lease_token, &json!({"output": "x"}))
                        .expect("finish");
                } else {
                    finish_failure(
                        conn,
                        &job,
                        job.lease_token,
                        &JobError::new("provider_failed", "no"),
                    )
                    .expect("finish");
                }
            }
            model.finish_job(index, success);
            return;
        }
        Step::Reaper => {
            let mut order: Vec<usize> = (0..model.reservations.len()).collect();
            order.sort_by_key(|&i| {
                (
                    real.accounts[model.reservations[i].account],
                    real.reservations[i],
                )
            });
            run_pass(
                conn,
                &ReaperSettings {
                    batch: 500,
                    job_max_attempts: 3,
                },
                None,
            )
            .expect("reaper");
            model.reaper_pass(&order);
            return;
        }
        Step::Burst(ops) => {
            let mut requests = Vec::new();
            for (account, amount) in &ops {
                real.next_request += 1;
                requests.push((*account, real.next_request, *amount));
            }
            let app = &real.app;
            let futures = requests.iter().map(|&(account, n, amount)| {
                let path = format!("/v1/accounts/{}/reservations", real.accounts[account]);
                async move {
                    reply(
                        app.post(
                            &path,
                            ADMIN_KEY,
                            &json!({"request_id": request_uuid(n), "amount": amount}),
                        )
                        .await,
                    )
                    .await
                }
            });
            let answers = futures_util::future::join_all(futures).await;
            for ((account, n, amount), (actual, body)) in requests.into_iter().zip(answers) {
                let (expected, index) = model.reserve(account, n, amount, None);
                if expected.status == 201 {
                    real.requests[account].push((n, amount, None));
                }
                remember(
                    &mut real.reservations,
                    index,
                    uuid_of(&body["reservation_id"]),
                );
                assert_eq!(actual, expected, "burst reserve on account {account}");
            }
            return;
        }
        _ => return,
    };
    assert_eq!(actual, expected, "{step:?}");
}

fn compare_balances(model: &Model, real: &Real, conn: &mut PgConnection, step: &Step) {
    for (index, expected) in model.accounts.iter().enumerate() {
        let row: (String, i64, i64, i64, i64, i64, i32, i32) = accounts::table
            .find(real.accounts[index])
            .select((
                accounts::status,
                accounts::available,
                accounts::reserved,
                accounts::used,
                accounts::credited,
                accounts::adjusted,
                accounts::active_reservations,
                accounts::max_active_reservations,
            ))
            .first(conn)
            .expect("account");
        let status = if expected.suspended {
            "suspended"
        } else {
            "active"
        };
        assert_eq!(
            row,
            (
                status.to_owned(),
                expected.available,
                expected.reserved,
                expected.used,
                expected.credited,
                expected.adjusted,
                i32::try_from(expected.active).expect("count"),
                i32::try_from(expected.limit).expect("limit"),
            ),
            "account {index} after {step:?}"
        );
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    count: i64,
}

fn compare_final(model: &Model, real: &Real, conn: &mut PgConnection) {
    for (index, expected) in model.reservations.iter().enumerate() {
        let (state, committed): (String, i64) = reservations::table
            .find(real.reservations[index])
            .select((reservations::state, reservations::committed_amount))
            .first(conn)
            .expect("reservation");
        assert_eq!(
            (state.as_str(), committed),
            (expected.state.as_str(), expected.committed),
            "reservation {index}"
        );
    }
    for (index, expected) in model.jobs.iter().enumerate() {
        let status: String = generation_jobs::table
            .find(real.jobs[index].0)
            .select(generation_jobs::status)
            .first(conn)
            .expect("job");
        let expected = match expected.status {
            JobStatus::Queued => "queued",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
        };
        assert_eq!(status, expected, "job {index}");
    }
    // One movement, one timestamp: a finished job's finished_at is the
    // created_at of the ledger entries its finish wrote.
    let mismatched: i64 = diesel::sql_query(
        "SELECT count(*) AS count FROM generation_jobs j JOIN ledger_entries e \
         ON e.job_id = j.id AND e.kind IN ('commit', 'release') \
         WHERE j.finished_at IS DISTINCT FROM e.created_at",
    )
    .get_result::<Count>(conn)
    .expect("timestamps")
    .count;
    assert_eq!(
        mismatched, 0,
        "job finishes stamped apart from their entries"
    );
    for (index, expected) in model.ledger.iter().enumerate() {
        let entries = ledger_of(conn, real.accounts[index]);
        let expected: Vec<(String, i64, i64, i64, i64)> = expected
            .iter()
            .map(|&(kind, amount, a, r, u)| (kind.to_owned(), amount, a, r, u))
            .collect();
        assert_eq!(entries, expected, "ledger of account {index}");
    }
    compare_events(model, real, conn);
}

/// The events the model's ledger implies — at creation, a low balance when
/// a threshold is set; per entry: credit.created,
/// adjustment.created or reservation.expired; then a low-balance crossing
/// (the threshold is fixed per account) and a depletion — against the
/// account's events in entry order; and every event against the books.
fn compare_events(model: &Model, real: &Real, conn: &mut PgConnection) {
    #[derive(QueryableByName)]
    struct Event {
        #[diesel(sql_type = diesel::sql_types::Text)]
        r#type: String,
    }
    for (index, ledger) in model.ledger.iter().enumerate() {
        let threshold = THRESHOLDS[index];
        // Every account starts empty: one created with a threshold is low
        // from the start (reported at creation, before any entry).
        let (mut low, mut before) = (threshold > 0, 0);
        let mut expected = Vec::new();
        if low {
            expected.push("account.balance_low");
        }
        for &(kind, _, available, _, _) in ledger {
            match kind {
                "credit" => expected.push("credit.created"),
                "adjustment" => expected.push("adjustment.created"),
                "expire" => expected.push("reservation.expired"),
                _ => {}
            }
            let below = threshold > 0 && available < threshold;
            if below != low {
                low = below;
                expected.push(if below {
                    "account.balance_low"
                } else {
                    "account.balance_recovered"
                });
            }
            if available == 0 && before > 0 {
                expected.push("account.balance_depleted");
            }
            before = available;
        }
        let actual: Vec<String> = diesel::sql_query(
            "SELECT type FROM events WHERE account_id = $1 AND type NOT LIKE 'job.%' \
             ORDER BY (data->'entry'->>'id')::bigint NULLS FIRST, seq",
        )
        .bind::<SqlUuid, _>(real.accounts[index])
        .load::<Event>(conn)
        .expect("events")
        .into_iter()
        .map(|event| event.r#type)
        .collect();
        assert_eq!(actual, expected, "events of account {index}");
    }
    let disagreements =
        token_billing::domain::checks::events_disagreeing_with_books(conn).expect("events check");
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

async fn run_history(steps: Vec<Step>) {
    let app = TestApp::spawn_with(|config| {
        // Workers and the reaper act only as the history's own steps
        // (Finish, Reaper): a background pass (every 30 s by default) would
        // expire aged reservations behind the model's back on a slow run.
        config.worker_concurrency = 0;
        config.reaper_schedule = "0 0 0 1 1 *".into();
    })
    .await;
    let mut model = Model::default();
    let limits = [0, 2, 3];
    let mut accounts = Vec::new();
    let mut kiosks = Vec::new();
    for (limit, threshold) in limits.into_iter().zip(THRESHOLDS) {
        let account = app
            .create_account_from(&json!({
                "name": "differential",
                "max_active_reservations": limit,
                "low_balance_threshold": threshold,
            }))
            .await;
        model.create_account(limit);
        kiosks.push(app.kiosk_key(account).await);
        accounts.push(account);
    }
    let mut conn = app.database.connect();
    let mut real = Real {
        app,
        accounts,
        kiosks,
        reservations: Vec::new(),
        jobs: Vec::new(),
        credit_refs: Vec::new(),
        adjustment_refs: Vec::new(),
        requests: vec![Vec::new(); ACCOUNTS],
        job_requests: vec![Vec::new(); ACCOUNTS],
        next_request: 0,
    };
    for step in &steps {
        run_step(&mut real, &mut model, step, &mut conn).await;
        compare_balances(&model, &real, &mut conn, step);
    }
    compare_final(&model, &real, &mut conn);
}

#[test]
fn the_service_answers_every_history_as_the_model_does() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cases = std::env::var("DIFFERENTIAL_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(property_config(cases));
    runner
        .run(&prop::collection::vec(step(), 10..60), |steps| {
            runtime.block_on(run_history(steps));
            Ok(())
        })
        .expect("the service and the model agree");
}
