//! The engine's lean path (`src/engine/sql/68_lean.sql`): which batches it
//! takes, and that a batch it leaves part-way ends exactly as on the full
//! machinery. (The differential test runs every history both ways against
//! the model; these tests pin down the path each kind of case takes.)

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use serde_json::Value;
use uuid::Uuid;

use token_billing::domain::api_keys::Credentials;
use token_billing::domain::types::{AccountId, RequestId, ReservationId, Tokens};
use token_billing::engine::{self, Answer, Authority, CommitAmount, Op, Operation, Outcome};

use crate::helpers::{json_rows, ledger_of, TestApp};

#[derive(QueryableByName)]
struct Calls {
    #[diesel(sql_type = Text)]
    function: String,
    #[diesel(sql_type = BigInt)]
    calls: i64,
}

/// Applies `operations` in a transaction of its own that counts its calls
/// of the engine's functions: the answers, and how often the batch
/// statement (one call for a batch's plain prefix), the lone path (once
/// per operation of a batch of one or two) and the full machinery were called, in that order.
fn apply_counted(conn: &mut PgConnection, operations: &[Operation]) -> (Vec<Answer>, [i64; 3]) {
    // The session's counts not yet reported (pg_stat_xact_user_functions
    // may still hold earlier transactions' calls): compare before and after.
    fn counts(conn: &mut PgConnection) -> Result<[i64; 3], diesel::result::Error> {
        let calls: Vec<Calls> = diesel::sql_query(
            "SELECT funcname::text AS function, calls FROM pg_stat_xact_user_functions \
             WHERE funcname IN ('engine_lean_batch', 'engine_lean_one', 'engine_apply_full')",
        )
        .load(conn)?;
        let count = |name: &str| {
            calls
                .iter()
                .filter(|call| call.function == name)
                .map(|call| call.calls)
                .sum::<i64>()
        };
        Ok([
            count("engine_lean_batch"),
            count("engine_lean_one"),
            count("engine_apply_full"),
        ])
    }
    conn.transaction(|conn| {
        diesel::sql_query("SET LOCAL track_functions = 'pl'").execute(conn)?;
        let before = counts(conn)?;
        let answers = engine::apply(conn, operations).expect("engine answers");
        let after = counts(conn)?;
        Ok::<_, diesel::result::Error>((answers, std::array::from_fn(|i| after[i] - before[i])))
    })
    .expect("transaction")
}

fn reserve(account: Uuid, key: &str, request: Uuid, amount: i64) -> Operation {
    Operation {
        account: AccountId(account),
        authority: Authority::from(Credentials::parse(key).expect("a kiosk key")),
        op: Op::Reserve {
            request_id: RequestId(request),
            amount: Tokens::parse(amount).expect("tokens"),
            ttl_seconds: None,
            effective_ttl_seconds: 300,
        },
    }
}

fn commit_all(account: Uuid, key: &str, reservation: Uuid) -> Operation {
    Operation {
        account: AccountId(account),
        authority: Authority::from(Credentials::parse(key).expect("a kiosk key")),
        op: Op::Commit {
            reservation: ReservationId(reservation),
            amount: CommitAmount::All,
        },
    }
}

fn outcomes(answers: &[Answer]) -> Vec<Outcome> {
    answers.iter().map(|answer| answer.outcome).collect()
}

fn reservation_id(answer: &Answer) -> Uuid {
    answer
        .object
        .as_ref()
        .and_then(|object| object["id"].as_str())
        .and_then(|id| id.parse().ok())
        .expect("the answer's reservation id")
}

#[actix_web::test]
async fn plain_reserves_and_commits_take_the_lean_path_refusals_and_events_the_full_one() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let key = app.kiosk_key(account).await;
    let mut conn = app.database.connect();

    // The key is new: its first use writes last_used_at on the lean path.
    let (answers, calls) = apply_counted(&mut conn, &[reserve(account, &key, Uuid::new_v4(), 2)]);
    assert_eq!(outcomes(&answers), [Outcome::Created]);
    assert_eq!(calls, [0, 1, 0], "a plain reserve: the lone path only");
    let used: Option<chrono::DateTime<chrono::Utc>> = token_billing::db::schema::api_keys::table
        .select(token_billing::db::schema::api_keys::last_used_at)
        .filter(token_billing::db::schema::api_keys::account_id.eq(Some(account)))
        .first(&mut conn)
        .expect("the key");
    assert!(used.is_some(), "the lean path writes a key's first use");

    let held = reservation_id(&answers[0]);
    let (answers, calls) = apply_counted(&mut conn, &[commit_all(account, &key, held)]);
    assert_eq!(outcomes(&answers), [Outcome::Committed]);
    assert_eq!(calls, [0, 1, 0], "a plain commit: the lone path only");

    // 3 tokens left: reserving all of them empties the account (its
    // balance_depleted event), reserving 4 is refused: both on the full
    // machinery, after the lean path declined them.
    let (answers, calls) = apply_counted(&mut conn, &[reserve(account, &key, Uuid::new_v4(), 4)]);
    assert_eq!(outcomes(&answers), [Outcome::InsufficientTokens]);
    assert_eq!(calls, [0, 1, 1]);
    let (answers, calls) = apply_counted(&mut conn, &[reserve(account, &key, Uuid::new_v4(), 3)]);
    assert_eq!(outcomes(&answers), [Outcome::Created]);
    assert_eq!(calls, [0, 1, 1]);
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    let depleted: Count = diesel::sql_query(
        "SELECT count(*) AS count FROM events WHERE type = 'account.balance_depleted'",
    )
    .get_result(&mut conn)
    .expect("events");
    assert_eq!(depleted.count, 1);

    // A wrong secret: the full machinery answers unauthorized.
    let wrong = format!("{}x", &key[..key.len() - 1]);
    let (answers, calls) = apply_counted(&mut conn, &[reserve(account, &wrong, Uuid::new_v4(), 1)]);
    assert_eq!(outcomes(&answers), [Outcome::Unauthorized]);
    assert_eq!(calls, [0, 1, 1]);
}

/// An account's books as comparable rows: every ledger entry (kind,
/// amount, balances after) and the account's balances, held count and
/// version.
type Books = (Vec<(String, i64, i64, i64, i64)>, Value);

fn books(conn: &mut PgConnection, account: Uuid) -> Books {
    use token_billing::db::schema::accounts;
    let entries = ledger_of(conn, account);
    let (available, reserved, used, active, version): (i64, i64, i64, i32, i64) = accounts::table
        .find(account)
        .select((
            accounts::available,
            accounts::reserved,
            accounts::used,
            accounts::active_reservations,
            accounts::version,
        ))
        .first(conn)
        .expect("account");
    (
        entries,
        serde_json::json!([available, reserved, used, active, version]),
    )
}

/// One batch: a plain reserve, its replay, its commit, a reserve the
/// account cannot pay, another plain reserve. The lean path takes the
/// first, the full machinery everything from the replay on; the answers
/// and the books are those of the full machinery alone.
async fn mixed_batch(lean: bool) -> (Vec<Outcome>, Books, [i64; 3]) {
    let app = if lean {
        TestApp::spawn().await
    } else {
        TestApp::spawn_full_engine_with(|_| {}).await
    };
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let mut conn = app.database.connect();
    let request = Uuid::new_v4();
    // The reservation's id is chosen by the service: find it from the
    // first answer, then send the rest of the batch's operations.
    let first = reserve(account, &key, request, 2);
    let (answers, _) = apply_counted(&mut conn, std::slice::from_ref(&first));
    let held = reservation_id(&answers[0]);
    let batch = [
        reserve(account, &key, Uuid::new_v4(), 1),
        reserve(account, &key, request, 2),
        commit_all(account, &key, held),
        reserve(account, &key, Uuid::new_v4(), 9),
        reserve(account, &key, Uuid::new_v4(), 3),
    ];
    let (answers, calls) = apply_counted(&mut conn, &batch);
    (outcomes(&answers), books(&mut conn, account), calls)
}

#[actix_web::test]
async fn a_batch_leaves_the_lean_path_at_its_first_case_that_is_not_plain() {
    let (lean_outcomes, lean_books, lean_calls) = mixed_batch(true).await;
    let (full_outcomes, full_books, full_calls) = mixed_batch(false).await;
    assert_eq!(
        lean_outcomes,
        [
            Outcome::Created,
            Outcome::Replayed,
            Outcome::Committed,
            Outcome::InsufficientTokens,
            Outcome::Created
        ]
    );
    assert_eq!(lean_outcomes, full_outcomes);
    assert_eq!(lean_books, full_books);
    assert_eq!(
        lean_calls,
        [1, 0, 1],
        "lean for the first, then the full machinery once"
    );
    assert_eq!(
        full_calls,
        [0, 0, 1],
        "token_billing.lean = off: the full machinery only"
    );
}

fn commit(account: Uuid, key: &str, reservation: Uuid, amount: i64) -> Operation {
    Operation {
        account: AccountId(account),
        authority: Authority::from(Credentials::parse(key).expect("a kiosk key")),
        op: Op::Commit {
            reservation: ReservationId(reservation),
            amount: CommitAmount::Exactly(Tokens::parse(amount).expect("tokens")),
        },
    }
}

fn release(account: Uuid, key: &str, reservation: Uuid) -> Operation {
    Operation {
        account: AccountId(account),
        authority: Authority::from(Credentials::parse(key).expect("a kiosk key")),
        op: Op::Release {
            reservation: ReservationId(reservation),
        },
    }
}

/// An account's grants (remaining, reserved, consumed, drawable, in draw
/// order) and its reservations' draws (amounts, in reservation order).
fn grants_and_draws(conn: &mut PgConnection, account: Uuid) -> Value {
    let grants = json_rows(
        conn,
        "SELECT jsonb_build_array(remaining, reserved, consumed, drawable) AS row \
         FROM credit_grants WHERE account_id = $1 ORDER BY priority, expires_at, seq",
        account,
    );
    let draws = json_rows(
        conn,
        "SELECT jsonb_build_array(amount, state, committed_amount, \
                (SELECT jsonb_agg(d->'amount') FROM jsonb_array_elements(draws) d)) AS row \
         FROM reservations WHERE account_id = $1 ORDER BY created_at, amount",
        account,
    );
    serde_json::json!([grants, draws])
}

/// Two batches on two accounts, one with two grants (the first expiring,
/// drawn first): five reserves (one spanning both grants), then a partial
/// commit, a release, two full commits and a reserve after the partial
/// commit's return. The lean path takes the whole first batch in one call
/// and the second up to the reserve after the return; the answers, books,
/// grants and draws are those of the full machinery alone.
async fn two_batches(lean: bool) -> (Vec<Outcome>, Value, [i64; 3], [i64; 3]) {
    two_batches_on(if lean { "on" } else { "off" }, None).await
}

/// [`two_batches`] on the engine's paths `path` (`token_billing.lean`),
/// in batches of `size` operations when given (the calls then summed).
async fn two_batches_on(
    path: &str,
    size: Option<usize>,
) -> (Vec<Outcome>, Value, [i64; 3], [i64; 3]) {
    let app = TestApp::spawn_engine_path(path).await;
    let apply = |conn: &mut PgConnection, operations: &[Operation]| {
        let Some(size) = size else {
            return apply_counted(conn, operations);
        };
        let (mut answers, mut calls) = (Vec::new(), [0, 0, 0]);
        for batch in operations.chunks(size) {
            let (answer, counted) = apply_counted(conn, batch);
            answers.extend(answer);
            calls = std::array::from_fn(|i| calls[i] + counted[i]);
        }
        (answers, calls)
    };
    let a = app.create_account(0).await;
    let b = app.funded_account(10).await;
    let expires = (chrono::Utc::now() + chrono::Duration::days(10)).to_rfc3339();
    for body in [
        serde_json::json!({"amount": 3, "external_ref": "A-1", "priority": 0, "expires_at": expires}),
        serde_json::json!({"amount": 4, "external_ref": "A-2", "priority": 5}),
    ] {
        let response = app
            .post(
                &format!("/v1/accounts/{a}/credits"),
                crate::helpers::ADMIN_KEY,
                &body,
            )
            .await;
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    }
    let key_a = app.kiosk_key(a).await;
    let key_b = app.kiosk_key(b).await;
    let mut conn = app.database.connect();
    let first = [
        reserve(a, &key_a, Uuid::new_v4(), 2),
        reserve(b, &key_b, Uuid::new_v4(), 1),
        reserve(a, &key_a, Uuid::new_v4(), 3),
        reserve(b, &key_b, Uuid::new_v4(), 2),
        reserve(a, &key_a, Uuid::new_v4(), 1),
    ];
    let (answers, first_calls) = apply(&mut conn, &first);
    let mut seen = outcomes(&answers);
    let held: Vec<Uuid> = answers.iter().map(reservation_id).collect();
    let second = [
        commit(a, &key_a, held[0], 1),
        release(b, &key_b, held[1]),
        commit_all(a, &key_a, held[2]),
        commit_all(b, &key_b, held[3]),
        reserve(a, &key_a, Uuid::new_v4(), 1),
        commit_all(a, &key_a, held[4]),
    ];
    let (answers, second_calls) = apply(&mut conn, &second);
    seen.extend(outcomes(&answers));
    let state = serde_json::json!([
        books(&mut conn, a).0,
        books(&mut conn, a).1,
        books(&mut conn, b).0,
        books(&mut conn, b).1,
        grants_and_draws(&mut conn, a),
        grants_and_draws(&mut conn, b),
    ]);
    (seen, state, first_calls, second_calls)
}

#[actix_web::test]
async fn a_batch_of_plain_operations_on_several_accounts_is_one_lean_call() {
    let (lean_outcomes, lean_state, lean_first, lean_second) = two_batches(true).await;
    let (full_outcomes, full_state, full_first, full_second) = two_batches(false).await;
    assert_eq!(
        lean_outcomes,
        [
            [Outcome::Created; 5].as_slice(),
            &[
                Outcome::Committed,
                Outcome::Released,
                Outcome::Committed,
                Outcome::Committed,
                Outcome::Created,
                Outcome::Committed
            ]
        ]
        .concat()
    );
    assert_eq!(lean_outcomes, full_outcomes);
    assert_eq!(lean_state, full_state);
    assert_eq!(lean_first, [1, 0, 0], "five plain reserves: one lean call");
    assert_eq!(
        lean_second,
        [1, 0, 1],
        "the reserve after a return leaves the lean path"
    );
    assert_eq!((full_first, full_second), ([0, 0, 1], [0, 0, 1]));
}

/// The same operations one at a time: each plain one on the lone path
/// (`engine_lean_one`, `src/engine/sql/66_lone.sql`), on the batch
/// statement when the lone path is off (`token_billing.lean = batch`), and
/// on the full machinery alone. The two grants make a reserve span both
/// and a partial commit return tokens to both; the answers, books, grants
/// and draws must be the same on all three.
#[actix_web::test]
async fn a_lone_operation_ends_as_on_the_batch_statement_and_the_full_machinery() {
    let (lone_outcomes, lone_state, lone_first, lone_second) = two_batches_on("on", Some(1)).await;
    let (batch_outcomes, batch_state, batch_first, batch_second) =
        two_batches_on("batch", Some(1)).await;
    let (full_outcomes, full_state, _, _) = two_batches_on("off", Some(1)).await;
    assert_eq!(lone_outcomes, full_outcomes);
    assert_eq!(batch_outcomes, full_outcomes);
    assert_eq!(lone_state, full_state);
    assert_eq!(batch_state, full_state);
    assert_eq!(
        (lone_first, lone_second),
        ([0, 5, 0], [0, 6, 0]),
        "one at a time every operation is plain, and takes the lone path"
    );
    assert_eq!(
        (batch_first, batch_second),
        ([5, 0, 0], [6, 0, 0]),
        "token_billing.lean = batch: the batch statement"
    );
}

/// The same operations two at a time: each of a batch of two plain
/// operations on the lone path, one after the other in the batch's
/// transaction (`engine_apply`: for two, the lone path costs less than the
/// batch statement's start-up), on the batch statement when the lone path is
/// off, and on the full machinery alone — the same answers, books, grants
/// and draws on all three.
#[actix_web::test]
async fn a_batch_of_two_takes_the_lone_path_for_each_and_ends_as_on_the_others() {
    let (pair_outcomes, pair_state, pair_first, pair_second) = two_batches_on("on", Some(2)).await;
    let (batch_outcomes, batch_state, batch_first, batch_second) =
        two_batches_on("batch", Some(2)).await;
    let (full_outcomes, full_state, _, _) = two_batches_on("off", Some(2)).await;
    assert_eq!(pair_outcomes, full_outcomes);
    assert_eq!(batch_outcomes, full_outcomes);
    assert_eq!(pair_state, full_state);
    assert_eq!(batch_state, full_state);
    assert_eq!(
        (pair_first, pair_second),
        ([0, 5, 0], [0, 6, 0]),
        "two at a time (and the last alone) every operation takes the lone path"
    );
    assert_eq!(
        (batch_first, batch_second),
        ([3, 0, 0], [3, 0, 0]),
        "token_billing.lean = batch: one batch statement per batch"
    );
}

/// Batches of two whose second or first operation is not plain: the lone
/// path applies what comes before it, and the full machinery decides the
/// rest in the same transaction — the answers and books of the full
/// machinery alone.
async fn pairs_not_plain(path: &str) -> (Vec<Outcome>, Books, Vec<[i64; 3]>) {
    let app = TestApp::spawn_engine_path(path).await;
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let mut conn = app.database.connect();
    let request = Uuid::new_v4();
    let (mut seen, mut calls) = (Vec::new(), Vec::new());
    for pair in [
        // A reserve and its replay in one batch.
        [
            reserve(account, &key, request, 2),
            reserve(account, &key, request, 2),
        ],
        // A reserve the account cannot pay, then a plain one.
        [
            reserve(account, &key, Uuid::new_v4(), 9),
            reserve(account, &key, Uuid::new_v4(), 1),
        ],
    ] {
        let (answers, counted) = apply_counted(&mut conn, &pair);
        seen.extend(outcomes(&answers));
        calls.push(counted);
    }
    (seen, books(&mut conn, account), calls)
}

#[actix_web::test]
async fn a_batch_of_two_leaves_the_lone_path_at_its_first_case_that_is_not_plain() {
    let (pair_outcomes, pair_books, pair_calls) = pairs_not_plain("on").await;
    let (full_outcomes, full_books, _) = pairs_not_plain("off").await;
    assert_eq!(
        pair_outcomes,
        [
            Outcome::Created,
            Outcome::Replayed,
            Outcome::InsufficientTokens,
            Outcome::Created
        ]
    );
    assert_eq!(pair_outcomes, full_outcomes);
    assert_eq!(pair_books, full_books);
    assert_eq!(
        pair_calls,
        [[0, 2, 1], [0, 1, 1]],
        "the lone path up to the case that is not plain, the full machinery from it"
    );
}

fn create_job(account: Uuid, key: &str, request: Uuid) -> Operation {
    let prices = [("standard".to_owned(), 2)].into_iter().collect();
    let request = token_billing::engine::jobs::JobRequest::parse(
        RequestId(request),
        "standard".into(),
        serde_json::json!({"prompt": "a cat"}),
        &prices,
    )
    .expect("a job request");
    Operation {
        account: AccountId(account),
        authority: Authority::from(Credentials::parse(key).expect("a kiosk key")),
        op: Op::CreateJob {
            request,
            ttl_seconds: 300,
        },
    }
}

/// A job's view without what differs between two runs (ids, times).
fn job_shape(answer: &Answer) -> Value {
    let mut view = answer.object.clone().expect("the job");
    for field in [
        "job_id",
        "request_id",
        "account_id",
        "created_at",
        "updated_at",
    ] {
        view[field] = Value::Null;
    }
    view["reservation"]["reservation_id"] = Value::Null;
    view["reservation"]["expires_at"] = Value::Null;
    for draw in view["reservation"]["draws"]
        .as_array_mut()
        .expect("draws")
        .iter_mut()
    {
        draw["grant_id"] = Value::Null;
    }
    view
}

/// A lone job creation, its replay and a second job on each path: the
/// answers (the job as the API shows it), the books and the calls.
async fn lone_jobs_on(path: &str) -> (Vec<Outcome>, Vec<Value>, Books, Vec<[i64; 3]>) {
    let app = TestApp::spawn_engine_path(path).await;
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let mut conn = app.database.connect();
    let request = Uuid::new_v4();
    let (mut seen, mut shapes, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for operation in [
        create_job(account, &key, request),
        create_job(account, &key, request),
        create_job(account, &key, Uuid::new_v4()),
    ] {
        let (answers, counted) = apply_counted(&mut conn, std::slice::from_ref(&operation));
        seen.extend(outcomes(&answers));
        shapes.push(job_shape(&answers[0]));
        calls.push(counted);
    }
    (seen, shapes, books(&mut conn, account), calls)
}

#[actix_web::test]
async fn a_lone_job_creation_takes_the_lone_path_and_ends_as_on_the_others() {
    let (lone_outcomes, lone_shapes, lone_books, lone_calls) = lone_jobs_on("on").await;
    let (batch_outcomes, batch_shapes, batch_books, batch_calls) = lone_jobs_on("batch").await;
    let (full_outcomes, full_shapes, full_books, _) = lone_jobs_on("off").await;
    assert_eq!(
        lone_outcomes,
        [Outcome::Created, Outcome::Replayed, Outcome::Created]
    );
    assert_eq!(lone_outcomes, full_outcomes);
    assert_eq!(batch_outcomes, full_outcomes);
    assert_eq!(lone_shapes, full_shapes);
    assert_eq!(batch_shapes, full_shapes);
    assert_eq!(lone_books, full_books);
    assert_eq!(batch_books, full_books);
    assert_eq!(
        lone_calls,
        [[0, 1, 0], [0, 1, 1], [0, 1, 0]],
        "a plain job creation on the lone path, its replay on the full machinery"
    );
    assert_eq!(batch_calls, [[1, 0, 0], [1, 0, 1], [1, 0, 0]]);
}

/// `value` without what differs between two runs: ids and times.
fn without_ids_and_times(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (field, inner) in map.iter_mut() {
                if field == "id" || field.ends_with("_id") || field.ends_with("_at") {
                    *inner = Value::Null;
                } else {
                    without_ids_and_times(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_ids_and_times),
        _ => {}
    }
}

/// What a job's finish leaves behind on `account`, ids and times taken
/// out: the jobs (status, result, error, lease token, cost...), the ledger
/// entries a finish wrote (kind, amount, reason, actor, whether it names
/// its job and is stamped at the job's finished_at), and the jobs' events.
fn finish_traces(conn: &mut PgConnection, account: Uuid) -> Value {
    let mut rows = |sql: &str| json_rows(conn, sql, account);
    let jobs = rows(
        "SELECT to_jsonb(j) - 'request_hash' AS row FROM generation_jobs j \
         WHERE account_id = $1 ORDER BY cost, status",
    );
    let entries = rows(
        "SELECT jsonb_build_array(l.kind, l.amount, l.reason, l.actor, l.job_id IS NOT NULL, \
                l.created_at = j.finished_at) AS row \
         FROM ledger_entries l LEFT JOIN generation_jobs j ON j.id = l.job_id \
         WHERE l.account_id = $1 AND l.kind IN ('commit', 'release') ORDER BY l.id",
    );
    let events = rows(
        "SELECT jsonb_build_array(type, data) AS row FROM events \
         WHERE account_id = $1 AND type LIKE 'job.%' ORDER BY seq",
    );
    let mut traces = serde_json::json!([jobs, entries, events]);
    without_ids_and_times(&mut traces);
    traces
}

/// Two jobs created, claimed and finished — the first succeeds, the
/// second fails — in one batch after a reserve (the finishes end the
/// batch, as the service sends them); then a finish of the third job
/// under a lease token it no longer holds, and its finish alone under the
/// right one. The answers, books, grants and draws
/// and what the finishes left (jobs, entries, events) on each path, and
/// the calls.
async fn finishes_on(path: &str) -> (Vec<Outcome>, Vec<Value>, Value, Vec<[i64; 3]>) {
    use token_billing::domain::job_leases::{claim_jobs, finish_operation, JobError};
    let app = TestApp::spawn_engine_path(path).await;
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let mut conn = app.database.connect();
    for _ in 0..3 {
        engine::apply(&mut conn, &[create_job(account, &key, Uuid::new_v4())]).expect("created");
    }
    let claimed = claim_jobs(&mut conn, "test-worker", 60, 5, 3).expect("claimed");
    assert_eq!(claimed.len(), 3);
    let result = serde_json::json!({"images": ["https://example.test/a.png"]});
    let failure = JobError::new("provider_failed", "the provider said no");
    let (first, second, third) = (&claimed[0].job, &claimed[1].job, &claimed[2].job);
    let (mut seen, mut shapes, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for batch in [
        vec![
            reserve(account, &key, Uuid::new_v4(), 1),
            finish_operation(first, first.lease_token, Ok(&result)),
            finish_operation(second, second.lease_token, Err(&failure)),
        ],
        // A lease token the job no longer holds: lease_lost, nothing moves.
        vec![finish_operation(third, third.lease_token - 1, Ok(&result))],
        vec![finish_operation(third, third.lease_token, Ok(&result))],
    ] {
        let (answers, counted) = apply_counted(&mut conn, &batch);
        seen.extend(outcomes(&answers));
        for answer in &answers {
            let mut shape = answer.object.clone().unwrap_or(Value::Null);
            without_ids_and_times(&mut shape);
            shapes.push(shape);
        }
        calls.push(counted);
    }
    let traces = serde_json::json!([
        books(&mut conn, account).0,
        books(&mut conn, account).1,
        grants_and_draws(&mut conn, account),
        finish_traces(&mut conn, account)
    ]);
    (seen, shapes, traces, calls)
}

#[actix_web::test]
async fn job_finishes_take_the_lone_path_and_end_as_on_the_full_machinery() {
    let (lone_outcomes, lone_shapes, lone_traces, lone_calls) = finishes_on("on").await;
    let (full_outcomes, full_shapes, full_traces, full_calls) = finishes_on("off").await;
    assert_eq!(
        lone_outcomes,
        [
            Outcome::Created,
            Outcome::Done,
            Outcome::Done,
            Outcome::LeaseLost,
            Outcome::Done
        ]
    );
    assert_eq!(lone_outcomes, full_outcomes);
    assert_eq!(lone_shapes, full_shapes);
    assert_eq!(lone_traces, full_traces);
    // Two job.succeeded and one job.failed event, on both paths.
    let events = lone_traces[3][2].as_array().expect("events");
    let types: Vec<&str> = events.iter().filter_map(|e| e[0].as_str()).collect();
    assert_eq!(types, ["job.succeeded", "job.failed", "job.succeeded"]);
    assert_eq!(
        lone_calls,
        [[1, 2, 0], [0, 1, 1], [0, 1, 0]],
        "[batch statement, lone path, full machinery]: the reserve on the batch \
         statement, the two finishes that end its batch and a lone finish on the lone \
         path, a finish under a stale lease token on the full machinery"
    );
    assert_eq!(full_calls, [[0, 0, 1], [0, 0, 1], [0, 0, 1]]);
}

/// Every field of every kind of operation reaches the engine under its own
/// name: the Rust side binds `engine_request` by position
/// (`EngineRequestFields` in src/engine/mod.rs) and sql/00_types.sql names
/// the positions, so two fields of one type listed in another order would
/// still bind — and every value would land in its neighbour's field.
#[actix_web::test]
async fn every_field_reaches_the_engine_under_its_name() {
    use token_billing::domain::types::{ExternalRef, Note, Priority, Reason, TtlSeconds};
    use token_billing::engine::jobs::JobRequest;
    use token_billing::engine::types::GrantExpiry;

    let app = TestApp::spawn().await;
    let mut conn = app.conn();
    let account = Uuid::new_v4();
    let (key_id, secret_hash) = (Uuid::new_v4(), [7u8; 32]);
    let request = Uuid::new_v4();
    let reservation = Uuid::new_v4();
    let job = Uuid::new_v4();
    let expiry = chrono::Utc::now() + chrono::Duration::days(30);
    let prices = [("standard".to_owned(), 3)].into_iter().collect();
    let job_request = JobRequest::parse(
        RequestId(request),
        "standard".into(),
        serde_json::json!({"prompt": "a cat"}),
        &prices,
    )
    .expect("job request");
    let hash = job_request.hash();
    let verified = |actor: &str| Authority::Verified {
        actor: actor.into(),
    };
    let operation = |authority: Authority, op: Op| Operation {
        account: AccountId(account),
        authority,
        op,
    };
    let operations = [
        operation(
            Authority::Key {
                id: key_id,
                secret_hash,
            },
            Op::Reserve {
                request_id: RequestId(request),
                amount: Tokens::parse(5).expect("tokens"),
                ttl_seconds: Some(TtlSeconds::try_from(61).expect("ttl")),
                effective_ttl_seconds: 62,
            },
        ),
        operation(
            verified("kiosk"),
            Op::CreateJob {
                request: job_request.clone(),
                ttl_seconds: 63,
            },
        ),
        operation(
            verified("kiosk"),
            Op::Commit {
                reservation: ReservationId(reservation),
                amount: CommitAmount::Exactly(Tokens::parse(4).expect("tokens")),
            },
        ),
        operation(
            Authority::Request {
                actor: "admin".into(),
                request_id: Some("http-request-1".into()),
            },
            Op::Credit {
                amount: Tokens::parse(9).expect("tokens"),
                external_ref: ExternalRef::try_from("ref-1".to_owned()).expect("ref"),
                note: Some(Note::try_from("a note".to_owned()).expect("note")),
                priority: Priority::try_from(17).expect("priority"),
                expires_at: Some(GrantExpiry::try_from(expiry).expect("expiry")),
            },
        ),
        operation(
            verified("admin"),
            Op::Adjust {
                amount: token_billing::engine::types::SignedTokens::try_from(-2).expect("tokens"),
                reason: Reason::try_from("a reason".to_owned()).expect("reason"),
                external_ref: ExternalRef::try_from("ref-2".to_owned()).expect("ref"),
                priority: None,
                expires_at: None,
            },
        ),
        operation(
            verified("worker"),
            Op::FinishJob {
                job,
                lease_token: 41,
                outcome: Err(Some(serde_json::json!({"code": "provider"}))),
                reason: Some("provider failed".into()),
            },
        ),
        operation(
            verified("worker"),
            Op::FinishJob {
                job,
                lease_token: 42,
                outcome: Ok(serde_json::json!({"image": "x"})),
                reason: None,
            },
        ),
    ];
    let read = engine::engine_requests(&mut conn, &operations).expect("the engine reads them");
    assert_eq!(read.len(), operations.len());

    let hex = |bytes: &[u8]| -> String {
        format!(
            "\\x{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    };
    let account = account.to_string();
    let key = token_billing::domain::types::ApiKeyId(key_id).to_string();
    // What each operation must carry (a new id, chosen by the service, is
    // only checked for being there); every other field must be NULL.
    let expected: [Vec<(&str, Value)>; 7] = [
        vec![
            ("op", "reserve".into()),
            ("actor", key.clone().into()),
            ("key_id", key_id.to_string().into()),
            ("key_hash", hex(&secret_hash).into()),
            ("authorized", false.into()),
            ("request", request.to_string().into()),
            ("amount", 5.into()),
            ("requested_ttl", 61.into()),
            ("ttl", 62.into()),
            ("new_id", Value::Bool(true)),
        ],
        vec![
            ("op", "create_job".into()),
            ("actor", "kiosk".into()),
            ("authorized", true.into()),
            ("request", request.to_string().into()),
            ("amount", 3.into()),
            ("ttl", 63.into()),
            ("new_id", Value::Bool(true)),
            ("job", Value::Bool(true)),
            ("hash", hex(&hash).into()),
            ("kind", "standard".into()),
            ("params", serde_json::json!({"prompt": "a cat"})),
        ],
        vec![
            ("op", "commit".into()),
            ("actor", "kiosk".into()),
            ("authorized", true.into()),
            ("reservation", reservation.to_string().into()),
            ("amount", 4.into()),
        ],
        vec![
            ("op", "credit".into()),
            ("actor", "admin".into()),
            ("authorized", true.into()),
            ("amount", 9.into()),
            ("new_id", Value::Bool(true)),
            ("external_ref", "ref-1".into()),
            ("note", "a note".into()),
            ("http_request_id", "http-request-1".into()),
            ("priority", 17.into()),
            ("expires_at", Value::Bool(true)),
        ],
        vec![
            ("op", "adjust".into()),
            ("actor", "admin".into()),
            ("authorized", true.into()),
            ("amount", (-2).into()),
            ("new_id", Value::Bool(true)),
            ("external_ref", "ref-2".into()),
            ("reason", "a reason".into()),
        ],
        vec![
            ("op", "finish_job".into()),
            ("actor", "worker".into()),
            ("authorized", true.into()),
            ("job", job.to_string().into()),
            ("lease_token", 41.into()),
            ("status", "failed".into()),
            ("error", serde_json::json!({"code": "provider"})),
            ("reason", "provider failed".into()),
        ],
        vec![
            ("op", "finish_job".into()),
            ("actor", "worker".into()),
            ("authorized", true.into()),
            ("job", job.to_string().into()),
            ("lease_token", 42.into()),
            ("status", "succeeded".into()),
            ("result", serde_json::json!({"image": "x"})),
        ],
    ];
    for (row, expected) in read.iter().zip(&expected) {
        let fields = row.as_object().expect("an object");
        assert_eq!(fields.len(), 26, "engine_request has 26 fields: {row}");
        assert_eq!(fields["account"], Value::from(account.clone()), "{row}");
        for (name, value) in fields {
            if name == "account" {
                continue;
            }
            match expected.iter().find(|(field, _)| field == name) {
                // A value the service chose: there, and an id or an instant.
                Some((_, Value::Bool(true))) if name != "authorized" => {
                    let text = value.as_str().unwrap_or_else(|| panic!("{name}: {row}"));
                    if name == "expires_at" {
                        let at = chrono::DateTime::parse_from_rfc3339(text).expect("an instant");
                        assert_eq!(at.timestamp_micros(), expiry.timestamp_micros(), "{row}");
                    } else {
                        Uuid::parse_str(text).unwrap_or_else(|_| panic!("{name}: {row}"));
                    }
                }
                Some((_, expected)) => assert_eq!(value, expected, "{name}: {row}"),
                None => assert_eq!(value, &Value::Null, "{name} must be NULL: {row}"),
            }
        }
    }
    // The service's new ids: a job's reservation and the job are two.
    assert_ne!(read[1]["new_id"], read[1]["job"]);
}
