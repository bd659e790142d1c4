//! History: balances `as_of` an instant against a replay of the ledger,
//! the daily closings checked against the ledger, retention with its
//! archive (killed mid-pass), and the paging rule of the account lists.
//!
//! Days of history are made through the real engine on a connection whose
//! `clock_timestamp()` runs behind (`test_clock`, first on its
//! `search_path`): the engine's own functions write the entries, only the
//! clock they read is shifted.

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::accounts::create_account;
use token_billing::domain::checks::find_violations;
use token_billing::domain::history::{account_as_of, close_days};
use token_billing::domain::ledger::replay;
use token_billing::domain::reconciliation::reconcile;
use token_billing::domain::retention::{run_pass_exclusive_paced, RetentionSettings};
use token_billing::engine::types::{
    AccountId, ExternalRef, Name, RequestId, ReservationId, Tokens,
};
use token_billing::engine::{CommitAmount, Op};

use crate::helpers::{engine, problem, property_config, TestApp, TestDatabase, ADMIN_KEY};

const BINARY: &str = env!("CARGO_BIN_EXE_token-billing");

/// A connection whose engine reads a clock `shift` behind the real one.
fn shifted_connection(database: &TestDatabase) -> PgConnection {
    let mut conn = database.connect();
    conn.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS test_clock; \
         CREATE OR REPLACE FUNCTION test_clock.clock_timestamp() RETURNS timestamptz \
         LANGUAGE sql VOLATILE AS $$ SELECT pg_catalog.clock_timestamp() \
             - COALESCE(NULLIF(current_setting('test_clock.shift', true), ''), '0')::interval $$; \
         SET search_path TO test_clock, pg_catalog, public, {}",
        token_billing::engine::install::SCHEMA
    ))
    .expect("shifted clock");
    conn
}

fn set_shift(conn: &mut PgConnection, seconds: i64) {
    conn.batch_execute(&format!("SET test_clock.shift = '{seconds} seconds'"))
        .expect("shift");
}

fn reference() -> ExternalRef {
    ExternalRef::try_from(format!("ref-{}", Uuid::new_v4())).expect("ref")
}

/// An account opened long ago (before any history the tests write).
fn new_account(conn: &mut PgConnection) -> AccountId {
    let account = AccountId(
        create_account(
            conn,
            &Name::try_from("history".to_owned()).expect("name"),
            0,
        )
        .expect("account")
        .id,
    );
    conn.batch_execute(&format!(
        "UPDATE accounts SET created_at = now() - interval '400 days' WHERE id = '{}'",
        account.0
    ))
    .expect("opened long ago");
    account
}

#[derive(Clone, Debug)]
enum Step {
    Credit(i64),
    Reserve(i64),
    /// Commit the n-th reservation, optionally partly (a commit entry and a
    /// release entry in one transaction, with one `created_at`).
    Commit(usize, Option<i64>),
    Release(usize),
}

fn step() -> impl Strategy<Value = (Step, i64)> {
    let kind = prop_oneof![
        (1i64..20).prop_map(Step::Credit),
        (1i64..6).prop_map(Step::Reserve),
        (0usize..6, proptest::option::of(1i64..6)).prop_map(|(n, a)| Step::Commit(n, a)),
        (0usize..6).prop_map(Step::Release),
    ];
    // The gap before the step, in hours: 0 keeps it within the same moment.
    (kind, prop_oneof![Just(0i64), 1i64..40])
}

/// Runs the steps through the engine, spread over the past; returns the account.
fn write_history(conn: &mut PgConnection, steps: &[(Step, i64)]) -> AccountId {
    let account = new_account(conn);
    let span: i64 = steps.iter().map(|(_, gap)| gap * 3600).sum();
    let mut shift = span + 3600;
    let mut reservations: Vec<ReservationId> = Vec::new();
    for (step, gap) in steps {
        shift -= gap * 3600;
        set_shift(conn, shift);
        let pick = |n: usize| reservations.get(n % reservations.len().max(1)).copied();
        let op = match step {
            Step::Credit(amount) => Some(Op::Credit {
                amount: Tokens::parse(*amount).expect("amount"),
                external_ref: reference(),
                note: None,
                priority: Default::default(),
                expires_at: None,
                price: None,
            }),
            Step::Reserve(amount) => Some(Op::Reserve {
                request_id: RequestId(Uuid::new_v4()),
                amount: Tokens::parse(*amount).expect("amount"),
                ttl_seconds: None,
                effective_ttl_seconds: 86_400,
            }),
            Step::Commit(n, amount) => pick(*n).map(|reservation| Op::Commit {
                reservation,
                amount: amount.map_or(CommitAmount::All, |a| {
                    CommitAmount::Exactly(Tokens::parse(a).expect("amount"))
                }),
            }),
            Step::Release(n) => pick(*n).map(|reservation| Op::Release { reservation }),
        };
        let Some(op) = op else { continue };
        let reserve = matches!(op, Op::Reserve { .. });
        if let Ok(Some(object)) = engine(conn, account, op) {
            if reserve {
                let id = object["id"].as_str().expect("reservation id");
                reservations.push(ReservationId(Uuid::parse_str(id).expect("uuid")));
            }
        }
    }
    set_shift(conn, 0);
    account
}

#[derive(QueryableByName)]
struct Entry {
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = BigInt)]
    amount: i64,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    of_reservation: bool,
}

fn entries(conn: &mut PgConnection, account: AccountId) -> Vec<Entry> {
    diesel::sql_query(
        "SELECT kind, amount, created_at, reservation_id IS NOT NULL AS of_reservation \
         FROM ledger_entries WHERE account_id = $1 ORDER BY id",
    )
    .bind::<diesel::sql_types::Uuid, _>(account.0)
    .load(conn)
    .expect("entries")
}

/// The balances by replaying the entries written at or before `at`.
fn replay_until(entries: &[Entry], at: DateTime<Utc>) -> (i64, i64, i64) {
    let balances = replay(
        entries
            .iter()
            .filter(|entry| entry.created_at <= at)
            .map(|entry| (entry.kind.as_str(), entry.amount, entry.of_reservation)),
    )
    .expect("known kinds");
    (balances.available, balances.reserved, balances.used)
}

/// Instants worth asking about: each entry's own instant (with every entry
/// of its transaction), a microsecond before it, and random ones.
fn instants(entries: &[Entry], random: &[u32]) -> Vec<DateTime<Utc>> {
    let micro = chrono::Duration::microseconds(1);
    let mut instants = Vec::new();
    for entry in entries {
        instants.push(entry.created_at);
        instants.push(entry.created_at - micro);
    }
    if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
        let span = (last.created_at - first.created_at)
            .num_microseconds()
            .unwrap_or(0);
        for r in random {
            let offset = i128::from(*r) * i128::from(span.max(1)) / i128::from(u32::MAX);
            let offset = i64::try_from(offset).expect("within the span");
            instants.push(first.created_at + chrono::Duration::microseconds(offset));
        }
        instants.push(first.created_at - chrono::Duration::days(3));
    }
    instants
}

fn check_as_of(
    conn: &mut PgConnection,
    account: AccountId,
    entries: &[Entry],
    at: &[DateTime<Utc>],
) {
    for instant in at {
        let expected = replay_until(entries, *instant);
        let got = account_as_of(conn, account.0, *instant).expect("as_of");
        assert_eq!(
            (got.available, got.reserved, got.used),
            expected,
            "as_of {instant}"
        );
    }
}

#[test]
fn as_of_equals_a_replay_of_the_ledger_at_any_instant() {
    let mut runner = TestRunner::new(property_config(12));
    let strategy = (
        proptest::collection::vec(step(), 1..40),
        proptest::collection::vec(any::<u32>(), 8),
    );
    runner
        .run(&strategy, |(steps, random)| {
            let database = TestDatabase::create();
            let mut conn = shifted_connection(&database);
            let account = write_history(&mut conn, &steps);
            let entries = entries(&mut conn, account);
            let at = instants(&entries, &random);
            // From the ledger alone, then with the daily closings written.
            check_as_of(&mut conn, account, &entries, &at);
            close_days(&mut conn, Utc::now(), 1_000).expect("close days");
            check_as_of(&mut conn, account, &entries, &at);
            // A reconciliation's opening and closing are the same books.
            for pair in at.windows(2) {
                let (from, to) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
                if from == to {
                    continue;
                }
                let report = reconcile(&mut conn, from, to, Some(account.0)).expect("report");
                assert_eq!(report.status, "ok", "{:?}", report.discrepancies);
                let before = |at: DateTime<Utc>| {
                    replay_until(&entries, at - chrono::Duration::microseconds(1))
                };
                let line = &report.accounts[0];
                assert_eq!(
                    (
                        line.opening_available,
                        line.opening_reserved,
                        line.opening_used
                    ),
                    before(from)
                );
                assert_eq!(
                    (
                        line.closing_available,
                        line.closing_reserved,
                        line.closing_used
                    ),
                    before(to)
                );
            }
            Ok(())
        })
        .expect("as_of matches the replay");
}

/// Three days of history for one account, closed.
fn closed_history(database: &TestDatabase) -> (PgConnection, AccountId) {
    let mut conn = shifted_connection(database);
    let account = new_account(&mut conn);
    for days_ago in [4i64, 3, 2] {
        set_shift(&mut conn, days_ago * 86_400);
        engine(
            &mut conn,
            account,
            Op::Credit {
                amount: Tokens::parse(10).expect("amount"),
                external_ref: reference(),
                note: None,
                priority: Default::default(),
                expires_at: None,
                price: None,
            },
        )
        .expect("credit");
    }
    set_shift(&mut conn, 0);
    let closed = close_days(&mut conn, Utc::now(), 1_000).expect("close");
    assert!(closed.days.len() >= 3, "{closed:?}");
    (conn, account)
}

#[test]
fn a_corrupted_daily_closing_is_flagged_and_never_trusted() {
    let database = TestDatabase::create();
    let (mut conn, account) = closed_history(&database);
    let now = Utc::now();
    let report = reconcile(&mut conn, now - chrono::Duration::days(10), now, None).expect("report");
    assert_eq!(report.status, "ok", "{:?}", report.discrepancies);
    conn.batch_execute(&format!(
        "UPDATE ledger_daily_closings SET available = available + 5 \
         WHERE account_id = '{}' AND day = (SELECT min(day) + 1 FROM ledger_daily_closings)",
        account.0
    ))
    .expect("corrupt one closing");
    // From the midnight that ends the corrupted day: the opening is read
    // from that day's closing (the row under test), and it counts the
    // first two credits only, whatever the time of day the test runs at.
    #[derive(QueryableByName)]
    struct Midnight {
        #[diesel(sql_type = Timestamptz)]
        at: DateTime<Utc>,
    }
    let from = diesel::sql_query(
        "SELECT ((min(day) + 2)::timestamp AT TIME ZONE 'UTC') AS at FROM ledger_daily_closings",
    )
    .get_result::<Midnight>(&mut conn)
    .expect("the corrupted day's end")
    .at;
    assert!(from < now, "{from} is not before {now}");
    let report = reconcile(&mut conn, from, now, None).expect("report");
    assert_eq!(report.status, "mismatch");
    assert!(
        report
            .discrepancies
            .iter()
            .any(|d| d.account_id == account.0 && d.check == "daily_closing_available"),
        "{:?}",
        report.discrepancies
    );
    // The figures themselves come from the ledger, not the bad row.
    let line = &report.accounts[0];
    assert_eq!(line.opening_available, 20);
    assert_eq!(line.closing_available, 30);
    let entries = entries(&mut conn, account);
    check_as_of(&mut conn, account, &entries, &[from, now]);
    // The reaper's replay starts from the last closing's totals: altered
    // totals are a violation there too.
    assert!(find_violations(&mut conn).expect("checks").is_empty());
    conn.batch_execute(&format!(
        "UPDATE ledger_daily_closings SET credited = credited + 1 \
         WHERE account_id = '{}' AND day = (SELECT max(day) FROM ledger_daily_closings)",
        account.0
    ))
    .expect("corrupt the last closing's totals");
    let violations = find_violations(&mut conn).expect("checks");
    assert!(
        violations
            .iter()
            .any(|d| d.account_id == account.0 && d.check == "ledger_replay_available"),
        "{violations:?}"
    );
}

#[tokio::test]
async fn balances_as_of_over_http_and_the_cli() {
    let app = TestApp::spawn().await;
    let account = {
        let mut conn = shifted_connection(&app.database);
        let account = new_account(&mut conn);
        set_shift(&mut conn, 2 * 86_400);
        engine(
            &mut conn,
            account,
            Op::Credit {
                amount: Tokens::parse(7).expect("amount"),
                external_ref: reference(),
                note: None,
                priority: Default::default(),
                expires_at: None,
                price: None,
            },
        )
        .expect("credit");
        account
    };
    app.credit(account.0, 5).await;
    let day_ago = (Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let path = format!("/v1/accounts/{}?as_of={}", account.0, urlencode(&day_ago));
    let body: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
    assert_eq!(body["available"], json!(7), "{body}");
    assert_eq!(body["used"], json!(0));
    assert!(body["as_of"].as_str().is_some());
    let now: Value = app
        .get(&format!("/v1/accounts/{}", account.0), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(now["available"], json!(12));
    let list: Value = app
        .get(
            &format!("/v1/accounts?as_of={}", urlencode(&day_ago)),
            ADMIN_KEY,
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(list["balances"][0]["available"], json!(7), "{list}");
    assert_eq!(list["next_after"], Value::Null);
    for bad in [
        "yesterday".to_owned(),
        urlencode(&(Utc::now() + chrono::Duration::hours(1)).to_rfc3339()),
    ] {
        let (status, problem) = problem(
            app.get(
                &format!("/v1/accounts/{}?as_of={bad}", account.0),
                ADMIN_KEY,
            )
            .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(problem["code"], json!("invalid_request"));
        let (status, _) = problem_of(
            app.get(&format!("/v1/accounts?as_of={bad}"), ADMIN_KEY)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    let output = Command::new(BINARY)
        .args([
            "--database-url",
            &app.database.url,
            "balances",
            "--as-of",
            &day_ago,
            "--csv",
        ])
        .output()
        .expect("run balances");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let csv = String::from_utf8(output.stdout).expect("utf-8");
    assert!(csv.starts_with("account_id,name,as_of,available"), "{csv}");
    assert!(csv.contains(&format!("{},history,", account.0)), "{csv}");
    assert!(
        csv.lines().nth(1).expect("a line").contains(",7,0,0,7,0,"),
        "{csv}"
    );
}

async fn problem_of(response: reqwest::Response) -> (StatusCode, Value) {
    problem(response).await
}

fn urlencode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}

#[tokio::test]
async fn pages_never_offer_an_empty_next_page() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    for _ in 0..2 {
        let response = app.reserve(account, &kiosk, Uuid::new_v4(), 1).await;
        assert!(response.status().is_success());
    }
    // 3 ledger entries (credit, 2 reserves), 2 reservations: pages exactly full.
    for (path, list) in [
        (format!("/v1/accounts/{account}/ledger?limit=3"), "entries"),
        (
            format!("/v1/accounts/{account}/reservations?limit=2"),
            "reservations",
        ),
        (format!("/v1/accounts/{account}/jobs?limit=1"), "jobs"),
    ] {
        let page: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
        let rows = page[list].as_array().expect("list").len();
        if list == "jobs" {
            assert_eq!(rows, 0);
        } else {
            assert!(rows > 0, "{page}");
        }
        assert_eq!(page["next_after"], Value::Null, "{path}: {page}");
    }
    let page: Value = app
        .get(&format!("/v1/accounts/{account}/ledger?limit=2"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(page["next_after"].is_number(), "{page}");
    let response = app
        .create_job(account, &kiosk, Uuid::new_v4(), &json!({}))
        .await;
    assert!(response.status().is_success());
    let page: Value = app
        .get(&format!("/v1/accounts/{account}/jobs?limit=1"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(page["jobs"].as_array().expect("jobs").len(), 1);
    assert_eq!(page["next_after"], Value::Null, "{page}");
}

/// Old rows of every pruned table, written straight into the tables.
fn old_rows(conn: &mut PgConnection, events: i64) {
    conn.batch_execute(&format!(
        "INSERT INTO events (type, account_id, data, created_at) \
         SELECT 'credit.created', NULL, jsonb_build_object('n', g), now() - interval '100 days' \
         FROM generate_series(1, {events}) g; \
         INSERT INTO events (type, account_id, data, created_at) \
         VALUES ('credit.created', NULL, '{{\"fresh\": true}}', now()); \
         UPDATE webhook_relay SET after_txid = 9223372036854775807; \
         INSERT INTO idempotency_keys (actor, endpoint, idempotency_key, request_hash, resource_id, created_at) \
         SELECT 'test', '/v1/accounts', 'key-' || g, sha256(g::text::bytea), gen_random_uuid(), \
                now() - interval '40 days' FROM generate_series(1, 30) g;"
    ))
    .expect("old rows");
}

fn ids(conn: &mut PgConnection, table: &str) -> BTreeSet<String> {
    #[derive(QueryableByName)]
    struct Key {
        #[diesel(sql_type = Text)]
        key: String,
    }
    let column = if table == "events" {
        "id::text"
    } else {
        "idempotency_key"
    };
    diesel::sql_query(format!("SELECT {column} AS key FROM {table}"))
        .load::<Key>(conn)
        .expect("keys")
        .into_iter()
        .map(|row| row.key)
        .collect()
}

/// Every row of every archive file of `table`, by key.
fn archived(dir: &std::path::Path, table: &str) -> (BTreeSet<String>, usize) {
    let mut keys = BTreeSet::new();
    let mut lines = 0;
    let Ok(files) = std::fs::read_dir(dir.join(table)) else {
        return (keys, 0);
    };
    for file in files {
        let path = file.expect("entry").path();
        if !path.to_string_lossy().ends_with(".jsonl.gz") {
            continue;
        }
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("open"))
            .read_to_string(&mut text)
            .expect("gzip");
        for line in text.lines() {
            let row: Value = serde_json::from_str(line).expect("json line");
            let key = if table == "events" {
                &row["id"]
            } else {
                &row["idempotency_key"]
            };
            keys.insert(key.as_str().expect("key").to_owned());
            lines += 1;
        }
    }
    (keys, lines)
}

/// A directory removed when the test ends.
struct ArchiveDir(std::path::PathBuf);

impl Drop for ArchiveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn retention_killed_mid_pass_loses_nothing_and_the_feed_says_so() {
    let app = TestApp::spawn().await;
    let archive = ArchiveDir(std::env::temp_dir().join(format!("tb-archive-{}", Uuid::new_v4())));
    let (before_events, before_keys) = {
        let mut conn = app.database.connect();
        old_rows(&mut conn, 3_000);
        (ids(&mut conn, "events"), ids(&mut conn, "idempotency_keys"))
    };
    let oldest = ids(&mut app.database.connect(), "events")
        .into_iter()
        .next()
        .expect("an event");
    let prune = || {
        Command::new(BINARY)
            .args([
                "--database-url",
                &app.database.url,
                "prune",
                "--batch",
                "50",
            ])
            .env("ARCHIVE_DIR", archive.0.as_path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run prune")
    };
    // Killed as soon as its first batch is archived.
    let mut child = prune();
    let started = Instant::now();
    while archived(archive.0.as_path(), "idempotency_keys").1 == 0
        && archived(archive.0.as_path(), "events").1 == 0
        && started.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("kill");
    let _ = child.wait();
    {
        let mut conn = app.database.connect();
        let (events_left, keys_left) =
            (ids(&mut conn, "events"), ids(&mut conn, "idempotency_keys"));
        let (events_archived, _) = archived(archive.0.as_path(), "events");
        let (keys_archived, _) = archived(archive.0.as_path(), "idempotency_keys");
        let union: BTreeSet<String> = events_left.union(&events_archived).cloned().collect();
        assert_eq!(union, before_events, "every event is kept or archived");
        let union: BTreeSet<String> = keys_left.union(&keys_archived).cloned().collect();
        assert_eq!(union, before_keys, "every key is kept or archived");
        assert!(events_left.len() > 1, "the pass was stopped before its end");
    }
    // A full pass: exactly the expired rows go, each into the archive.
    let output = prune().wait_with_output().expect("prune");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut conn = app.database.connect();
    let events_left = ids(&mut conn, "events");
    assert_eq!(events_left.len(), 1, "only the fresh event is left");
    assert!(ids(&mut conn, "idempotency_keys").is_empty());
    let (events_archived, lines) = archived(archive.0.as_path(), "events");
    let expired: BTreeSet<String> = before_events.difference(&events_left).cloned().collect();
    assert_eq!(events_archived, expired);
    assert!(lines >= expired.len());
    // A cursor older than the retention window is an error that says so.
    let (status, body) = problem(
        app.get(&format!("/v1/events?after={oldest}"), ADMIN_KEY)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("retention"),
        "{body}"
    );
    // So is a redelivery of a deleted event.
    let endpoint: Value = app
        .post(
            "/v1/webhook-endpoints",
            ADMIN_KEY,
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["credit.created"]}),
        )
        .await
        .json()
        .await
        .expect("json");
    let endpoint = endpoint["endpoint_id"].as_str().expect("endpoint id");
    let (status, body) = problem(
        app.post(
            &format!("/v1/webhook-endpoints/{endpoint}/events/{oldest}/redeliver"),
            ADMIN_KEY,
            &json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("RETENTION_EVENTS"),
        "{body}"
    );
}

/// `n` idempotency keys 40 days old: `n / batch` full batches for a pass
/// keeping them 30 days.
fn old_keys(conn: &mut PgConnection, n: i64) {
    conn.batch_execute(&format!(
        "INSERT INTO idempotency_keys (actor, endpoint, idempotency_key, request_hash, resource_id, created_at) \
         SELECT 'test', '/v1/accounts', 'key-' || gen_random_uuid(), sha256(g::text::bytea), \
                gen_random_uuid(), now() - interval '40 days' FROM generate_series(1, {n}) g"
    ))
    .expect("old keys");
}

fn count_keys(conn: &mut PgConnection) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query("SELECT count(*) AS n FROM idempotency_keys")
        .get_result::<Count>(conn)
        .expect("count")
        .n
}

fn keys_only(batch: i64, pause: Duration) -> RetentionSettings {
    RetentionSettings {
        idempotency_keys: Some(Duration::from_secs(30 * 86_400)),
        events: None,
        webhook_attempts: None,
        audit_events: None,
        archive_dir: None,
        batch,
        batches_max: usize::MAX,
        pause,
    }
}

/// The pause comes between batches, each committed before it: during the
/// pause the pass's connection is idle outside any transaction, holds no
/// lock but the session's advisory lock (so kiosks wait for nothing), and
/// the batch's deletes are visible to everyone. `0` makes no pause at all.
#[test]
fn retention_pauses_between_batches_holding_no_transaction_and_0_disables_it() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    let mut observer = database.connect();
    old_keys(&mut conn, 300);
    let pid = crate::helpers::backend_pid(&mut conn);
    #[derive(QueryableByName, Debug)]
    struct Seen {
        #[diesel(sql_type = Text)]
        state: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        no_transaction: bool,
        #[diesel(sql_type = Text)]
        locks: String,
    }
    let mut pauses = Vec::new();
    let mut left = Vec::new();
    let report = run_pass_exclusive_paced(
        &mut conn,
        &keys_only(50, Duration::from_millis(250)),
        None,
        &mut |pause| {
            let seen: Seen = diesel::sql_query(
                "SELECT a.state, (a.xact_start IS NULL AND a.backend_xid IS NULL) AS no_transaction, \
                        (SELECT string_agg(l.locktype, ',' ORDER BY l.locktype) FROM pg_locks l \
                         WHERE l.pid = a.pid) AS locks \
                 FROM pg_stat_activity a WHERE a.pid = $1",
            )
            .bind::<diesel::sql_types::Integer, _>(pid)
            .get_result(&mut observer)
            .expect("the pass's backend");
            assert_eq!(seen.state, "idle", "{seen:?}");
            assert!(seen.no_transaction, "{seen:?}");
            assert_eq!(seen.locks, "advisory", "only the pass's advisory lock: {seen:?}");
            pauses.push(pause);
            left.push(count_keys(&mut observer));
        },
    )
    .expect("pass")
    .expect("the lock is free");
    assert_eq!(report.pruned["idempotency_keys"], 300);
    // Six batches deleted 50 rows each; each is followed by a pause (the
    // sixth by the seventh batch, which finds nothing).
    assert_eq!(pauses, vec![Duration::from_millis(250); 6]);
    assert_eq!(left, [250, 200, 150, 100, 50, 0]);

    old_keys(&mut conn, 300);
    let mut paused = 0;
    let report =
        run_pass_exclusive_paced(&mut conn, &keys_only(50, Duration::ZERO), None, &mut |_| {
            paused += 1
        })
        .expect("pass")
        .expect("the lock is free");
    assert_eq!(report.pruned["idempotency_keys"], 300);
    assert_eq!(paused, 0, "RETENTION_PAUSE=0 makes no pause");
}

/// The pause really sleeps, in the scheduled pass (RETENTION_PAUSE of the
/// service's configuration) and in `token-billing prune` (RETENTION_PAUSE,
/// overridden by `--pause`): a pass of N deleting batches takes at least
/// (N − 1) pauses. `--pause 0` overrides a long RETENTION_PAUSE.
#[tokio::test]
async fn the_scheduled_pass_and_prune_honour_the_configured_pause() {
    let pause = Duration::from_millis(300);
    let app = TestApp::spawn_with(|config| config.retention_pause = pause).await;
    // Six batches of 50: at least five pauses.
    let at_least = pause * 5;

    old_keys(&mut app.conn(), 300);
    let mut settings = RetentionSettings::from_config(&app.state.config);
    assert_eq!(settings.pause, pause);
    settings.batch = 50;
    let started = Instant::now();
    let report = token_billing::scheduler::history_pass(
        app.state.pool.clone(),
        settings,
        std::sync::Arc::clone(&app.state.metrics),
    )
    .await
    .expect("pass")
    .expect("the lock is free");
    let elapsed = started.elapsed();
    assert_eq!(report.pruned["idempotency_keys"], 300);
    assert!(elapsed >= at_least, "{elapsed:?} < {at_least:?}");

    let prune = |env_pause: &str, flag: Option<&str>| {
        old_keys(&mut app.conn(), 300);
        let mut command = Command::new(BINARY);
        command
            .args([
                "--database-url",
                &app.database.url,
                "prune",
                "--batch",
                "50",
            ])
            .env("RETENTION_PAUSE", env_pause)
            .env("RETENTION_EVENTS", "0")
            .env("RETENTION_WEBHOOK_ATTEMPTS", "0")
            .env_remove("ARCHIVE_DIR");
        if let Some(flag) = flag {
            command.args(["--pause", flag]);
        }
        let started = Instant::now();
        let output = command.output().expect("run prune");
        let elapsed = started.elapsed();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Value = serde_json::from_slice(&output.stdout).expect("report");
        assert_eq!(report["pruned"]["idempotency_keys"], 300, "{report}");
        elapsed
    };
    let elapsed = prune("300ms", None);
    assert!(
        elapsed >= at_least,
        "RETENTION_PAUSE: {elapsed:?} < {at_least:?}"
    );
    let elapsed = prune("0", Some("300ms"));
    assert!(elapsed >= at_least, "--pause: {elapsed:?} < {at_least:?}");
    // Five pauses of RETENTION_PAUSE=10s would take 50 s.
    let elapsed = prune("10s", Some("0"));
    assert!(elapsed < Duration::from_secs(25), "--pause 0: {elapsed:?}");

    let refused = Command::new(BINARY)
        .args([
            "--database-url",
            &app.database.url,
            "prune",
            "--pause",
            "1h",
        ])
        .output()
        .expect("run prune");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("longest pause"), "{stderr}");
}

/// The horizon for instants (issue 35): a writer held open across T — a
/// transaction that wrote a credit stamped before T and has not committed
/// — keeps T open: `as_of=T` and a reconciliation ending just after T wait
/// and then refuse (409 `instant_not_closed`, `Retry-After`) instead of
/// answering without the credit and changing once it commits. After the
/// commit both answer, with the credit, and asked again they answer the
/// same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instant_is_answered_only_once_no_writer_can_write_into_it() {
    use std::sync::mpsc;
    use token_billing::engine::types::Tokens;
    use token_billing::engine::{apply, Authority, Operation};

    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let (stamped, stamp) = mpsc::channel::<DateTime<Utc>>();
    let (release, released) = mpsc::channel::<()>();
    let database = std::sync::Arc::clone(&app.database);
    let writer = std::thread::spawn(move || {
        let mut conn = database.connect();
        conn.transaction::<_, diesel::result::Error, _>(|conn| {
            let operation = Operation {
                account: AccountId(account),
                authority: Authority::Verified {
                    actor: "test".into(),
                },
                op: Op::Credit {
                    amount: Tokens::parse(5).expect("tokens"),
                    external_ref: reference(),
                    note: None,
                    priority: Default::default(),
                    expires_at: None,
                    price: None,
                },
            };
            let answers = apply(conn, &[operation]).expect("credit");
            let entry = answers[0].object.as_ref().expect("credit")["credit"]["ledger_entry_id"]
                .as_i64()
                .expect("entry");
            #[derive(QueryableByName)]
            struct At {
                #[diesel(sql_type = Timestamptz)]
                created_at: DateTime<Utc>,
            }
            let at: At = diesel::sql_query("SELECT created_at FROM ledger_entries WHERE id = $1")
                .bind::<BigInt, _>(entry)
                .get_result(conn)?;
            stamped.send(at.created_at).expect("stamp sent");
            released.recv().expect("released");
            Ok(())
        })
        .expect("the writer commits");
    });
    let at = stamp.recv().expect("stamped");
    let as_of = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let to = (at + chrono::Duration::microseconds(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let from =
        (at - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let balance_path = format!("/v1/accounts/{account}?as_of={as_of}");
    let report_path = format!("/v1/reconciliation?from={from}&to={to}&account_id={account}");

    // The writer is open: both wait and refuse.
    for path in [&balance_path, &report_path] {
        let started = Instant::now();
        let response = app.get(path, ADMIN_KEY).await;
        assert!(
            response.headers().get("retry-after").is_some(),
            "{path}: Retry-After"
        );
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::CONFLICT, Some("instant_not_closed")),
            "{path}: {body}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "it waited first"
        );
    }

    release.send(()).expect("release");
    writer.join().expect("writer");

    // Closed: the answers hold the credit, and never change.
    let mut first = None;
    for _ in 0..2 {
        let balances: Value = app
            .get(&balance_path, ADMIN_KEY)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(balances["available"], 15, "{balances}");
        let report = app.get(&report_path, ADMIN_KEY).await;
        assert_eq!(report.status(), StatusCode::OK);
        let report: Value = report.json().await.expect("json");
        assert_eq!(report["totals"]["credited"], 15, "{report}");
        let answers = (balances, report);
        match &first {
            None => first = Some(answers),
            Some(first) => assert_eq!(*first, answers, "asked again, the same"),
        }
    }
}

/// One time stamp per transaction (issue 35): two credits of one batch on
/// one account carry the same `created_at`, so no instant shows one
/// without the other: just before it neither counts, at it both do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_two_credits_on_one_account_is_never_split_by_an_instant() {
    use token_billing::engine::types::Tokens;
    use token_billing::engine::{apply, Authority, Operation};

    let app = TestApp::spawn().await;
    let account = app.funded_account(0).await;
    let mut conn = app.conn();
    let credit = |amount: i64| Operation {
        account: AccountId(account),
        authority: Authority::Verified {
            actor: "test".into(),
        },
        op: Op::Credit {
            amount: Tokens::parse(amount).expect("tokens"),
            external_ref: reference(),
            note: None,
            priority: Default::default(),
            expires_at: None,
            price: None,
        },
    };
    // The two credits in one batch (one transaction).
    let answers = apply(&mut conn, &[credit(9), credit(18)]).expect("batch");
    assert_eq!(answers.len(), 2);
    #[derive(QueryableByName)]
    struct At {
        #[diesel(sql_type = Timestamptz)]
        created_at: DateTime<Utc>,
    }
    let stamps: Vec<At> = diesel::sql_query(
        "SELECT created_at FROM ledger_entries WHERE account_id = $1 AND kind = 'credit' ORDER BY id",
    )
    .bind::<diesel::sql_types::Uuid, _>(account)
    .load(&mut conn)
    .expect("entries");
    assert_eq!(stamps.len(), 2);
    assert_eq!(
        stamps[0].created_at, stamps[1].created_at,
        "one stamp per transaction"
    );
    let at = stamps[0].created_at;
    for (instant, available) in [(at - chrono::Duration::microseconds(1), 0), (at, 27)] {
        let as_of = instant.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let shown: Value = app
            .get(&format!("/v1/accounts/{account}?as_of={as_of}"), ADMIN_KEY)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(shown["available"], available, "{as_of}: {shown}");
    }
}

/// A writer that waited for an account's row lock stamps its entries after
/// the transaction it waited for committed: the stamp (engine_now) is
/// taken after the locks. Otherwise an instant
/// closed by a transaction that held the account (a restore target, a
/// closed period) would gain an entry stamped before it that committed
/// after it (tests/backup/drill.sh: a restore to T missed two such
/// entries that the digest at T had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_waited_for_a_lock_stamps_its_entries_after_it() {
    waited_for_a_lock_then_stamped(TestApp::spawn().await).await;
}

async fn waited_for_a_lock_then_stamped(app: TestApp) {
    let app = std::sync::Arc::new(app);
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let mut holder = app.conn();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM accounts WHERE id = '{account}' FOR NO KEY UPDATE;"
        ))
        .expect("the account held");
    let reserving = {
        let app = std::sync::Arc::clone(&app);
        tokio::spawn(async move { app.reserve(account, &key, Uuid::new_v4(), 1).await.status() })
    };
    crate::helpers::until_a_session_waits_for_a_lock(&app).await;
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = Timestamptz)]
        now: DateTime<Utc>,
    }
    let released = diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result::<Now>(&mut holder)
        .expect("clock")
        .now;
    holder.batch_execute("COMMIT").expect("released");
    assert_eq!(reserving.await.expect("reserve"), StatusCode::CREATED);
    #[derive(QueryableByName)]
    struct Stamp {
        #[diesel(sql_type = Timestamptz)]
        created_at: DateTime<Utc>,
    }
    let stamp = diesel::sql_query(
        "SELECT created_at FROM ledger_entries WHERE account_id = $1 AND kind = 'reserve'",
    )
    .bind::<diesel::sql_types::Uuid, _>(account)
    .get_result::<Stamp>(&mut app.conn())
    .expect("the reserve's entry")
    .created_at;
    assert!(
        stamp > released,
        "the reserve's entry is stamped {stamp}, before the lock it waited for was released at {released}"
    );
}
