//! The rules of the tables a movement or a job writes, as the database
//! enforces them since the migration row_rules: one CHECK per table that
//! calls the table's rule function (`migrations/2026-12-04-000001_row_rules`;
//! since `2026-12-04-000010_row_rules_whole_row` the function takes the
//! whole row), and api_keys' since `2026-12-06-000050_api_keys_rules` (a
//! budgeted key's count is written by a reserve).
//! They must refuse exactly what the constraints they replaced refused,
//! with the same error: the same SQLSTATE, constraint name, table and
//! message (the first broken rule by name, as PostgreSQL checks them).
//!
//! The old constraints are the two migrations' down.sql, newest first
//! (which put them back under their names), and PostgreSQL itself is the judge: every candidate
//! row is written once under the rule functions and once, in a transaction
//! that runs down.sql first and is rolled back, under the old constraints;
//! the outcomes must be equal, and the candidates must make every old
//! constraint refuse at least once.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Jsonb, Text};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use token_billing::engine::types::{AccountId, ReservationId};
use token_billing::engine::{CommitAmount, Op};

use crate::helpers::{create_job, credit, engine, reserve, TestDatabase};

const BEFORE_BOOKS_IDENTITY: &str =
    include_str!("../../migrations/2026-12-05-000001_accounts_books_identity/down.sql");

const OLD_CONSTRAINTS: &str = concat!(
    include_str!("../../migrations/2026-12-06-000050_api_keys_rules/down.sql"),
    include_str!("../../migrations/2026-12-04-000010_row_rules_whole_row/down.sql"),
    include_str!("../../migrations/2026-12-04-000001_row_rules/down.sql"),
);

/// The account of the rows the candidates copy (a kiosk key candidate
/// names it).
const RULES_ACCOUNT: Uuid = Uuid::from_u128(0x5eed_0000_0000_4000_8000_0000_0000_0001);

/// A table, the columns a candidate gets fresh values for (so that one
/// passing every rule is written, not refused as a duplicate), and the
/// values tried for each column the rules read. A candidate is the table's
/// first row with the candidate's values in place.
struct Table {
    name: &'static str,
    fresh: fn(u64) -> Value,
    values: Vec<(&'static str, Vec<Value>)>,
}

fn tables() -> Vec<Table> {
    let at = json!("2026-12-04T00:00:00Z");
    let counts = |name: &'static str| (name, vec![json!(-1), json!(0), json!(1), json!(10)]);
    vec![
        Table {
            name: "accounts",
            fresh: |n| json!({"id": Uuid::new_v4(), "name": format!("copy {n}")}),
            values: vec![
                (
                    "name",
                    vec![
                        json!(""),
                        json!("k"),
                        json!("n".repeat(200)),
                        json!("n".repeat(201)),
                    ],
                ),
                (
                    "status",
                    vec![
                        json!("active"),
                        json!("suspended"),
                        json!("closed"),
                        json!(""),
                    ],
                ),
                counts("available"),
                counts("reserved"),
                counts("used"),
                counts("credited"),
                counts("active_reservations"),
                counts("max_active_reservations"),
                counts("low_balance_threshold"),
                counts("grant_expired"),
                counts("topup_threshold"),
            ],
        },
        Table {
            name: "reservations",
            fresh: |_| json!({"id": Uuid::new_v4(), "request_id": Uuid::new_v4()}),
            values: vec![
                ("amount", vec![json!(-1), json!(0), json!(1), json!(5)]),
                (
                    "state",
                    vec![
                        json!("held"),
                        json!("committed"),
                        json!("released"),
                        json!("expired"),
                        json!("lost"),
                    ],
                ),
                (
                    "committed_amount",
                    vec![json!(-1), json!(0), json!(1), json!(5), json!(6)],
                ),
                ("resolved_at", vec![Value::Null, at.clone()]),
            ],
        },
        Table {
            name: "ledger_entries",
            fresh: |n| json!({"id": 1_000_000_000 + n, "external_ref": Value::Null}),
            values: vec![
                (
                    "kind",
                    vec![
                        json!("credit"),
                        json!("adjustment"),
                        json!("reserve"),
                        json!("commit"),
                        json!("release"),
                        json!("expire"),
                        json!("grant_expire"),
                        json!("refund"),
                    ],
                ),
                ("amount", vec![json!(-3), json!(0), json!(3)]),
                ("available_after", vec![json!(-1), json!(0), json!(1)]),
                ("reserved_after", vec![json!(-1), json!(0), json!(1)]),
                ("used_after", vec![json!(-1), json!(0), json!(1)]),
            ],
        },
        Table {
            name: "credit_grants",
            fresh: |n| json!({"id": Uuid::new_v4(), "seq": 1_000_000_000 + n}),
            values: vec![
                (
                    "source",
                    vec![
                        json!("credit"),
                        json!("adjustment"),
                        json!("upgrade"),
                        json!("gift"),
                    ],
                ),
                counts("amount"),
                counts("remaining"),
                counts("reserved"),
                counts("consumed"),
                counts("debited"),
                counts("expired"),
                counts("opening_reserved"),
                (
                    "priority",
                    vec![json!(-1), json!(0), json!(100), json!(101)],
                ),
                ("drawable", vec![json!(true), json!(false)]),
                ("expires_at", vec![Value::Null, at.clone()]),
                ("expired_at", vec![Value::Null, at.clone()]),
            ],
        },
        Table {
            name: "generation_jobs",
            fresh: |_| json!({"id": Uuid::new_v4(), "request_id": Uuid::new_v4()}),
            values: vec![
                (
                    "request_hash",
                    vec![
                        json!(format!("\\x{}", "ab".repeat(32))),
                        json!(format!("\\x{}", "ab".repeat(31))),
                    ],
                ),
                (
                    "kind",
                    vec![
                        json!(""),
                        json!("k"),
                        json!("k".repeat(64)),
                        json!("k".repeat(65)),
                    ],
                ),
                ("cost", vec![json!(-1), json!(0), json!(1)]),
                (
                    "status",
                    vec![
                        json!("queued"),
                        json!("running"),
                        json!("succeeded"),
                        json!("failed"),
                        json!("lost"),
                    ],
                ),
                ("attempts", vec![json!(-1), json!(0), json!(2)]),
                ("finished_at", vec![Value::Null, at.clone()]),
                ("lease_expires_at", vec![Value::Null, at.clone()]),
            ],
        },
        Table {
            name: "api_keys",
            fresh: |_| json!({"id": Uuid::new_v4()}),
            values: vec![
                (
                    "secret_hash",
                    vec![
                        json!(format!("\\x{}", "ab".repeat(32))),
                        json!(format!("\\x{}", "ab".repeat(31))),
                    ],
                ),
                (
                    "scope",
                    vec![
                        json!("admin"),
                        json!("finance"),
                        json!("kiosk"),
                        json!("root"),
                    ],
                ),
                ("account_id", vec![Value::Null, json!(RULES_ACCOUNT)]),
                (
                    "label",
                    vec![
                        json!(""),
                        json!("k"),
                        json!("k".repeat(200)),
                        json!("k".repeat(201)),
                    ],
                ),
                (
                    "budget_tokens",
                    vec![
                        Value::Null,
                        json!(0),
                        json!(1),
                        json!(1_000_000_000),
                        json!(1_000_000_001),
                    ],
                ),
                (
                    "budget_period",
                    vec![Value::Null, json!("day"), json!("total"), json!("year")],
                ),
                (
                    "budget_low_percent",
                    vec![json!(0), json!(1), json!(100), json!(101)],
                ),
                ("budget_spent", vec![json!(-1), json!(0), json!(5)]),
                (
                    "budget_notified",
                    vec![Value::Null, json!("low"), json!("exhausted"), json!("high")],
                ),
            ],
        },
        Table {
            name: "events",
            fresh: |n| json!({"id": Uuid::new_v4(), "seq": 1_000_000_000 + n}),
            values: vec![(
                "type",
                [
                    "account.balance_low",
                    "account.balance_recovered",
                    "account.balance_depleted",
                    "credit.created",
                    "adjustment.created",
                    "reservation.expired",
                    "grant.expired",
                    "grant.expiring",
                    "topup.granted",
                    "topup.requested",
                    "topup.request_expired",
                    "topup.cap_reached",
                    "job.succeeded",
                    "job.failed",
                    "invariant.violated",
                    "endpoint.disabled",
                    "account.closed",
                    "",
                ]
                .iter()
                .map(|kind| json!(kind))
                .collect(),
            )],
        },
    ]
}

/// Every candidate of `table`: each column's values alone, then 300 rows
/// with two to five columns changed at once (drawn with a fixed seed), so
/// that rows breaking several rules show which one is named.
fn candidates(table: &Table) -> Vec<Map<String, Value>> {
    let mut rows: Vec<Map<String, Value>> = Vec::new();
    for (column, values) in &table.values {
        for value in values {
            rows.push([(column.to_string(), value.clone())].into_iter().collect());
        }
    }
    let mut rng = StdRng::seed_from_u64(34);
    for _ in 0..300 {
        let mut row = Map::new();
        for _ in 0..rng.gen_range(2..=5) {
            let (column, values) = &table.values[rng.gen_range(0..table.values.len())];
            row.insert(
                column.to_string(),
                values[rng.gen_range(0..values.len())].clone(),
            );
        }
        rows.push(row);
    }
    rows
}

/// What writing each candidate of each table did: "ok", or the error's
/// kind, constraint, table and message. Each write in a savepoint rolled
/// back, so every candidate starts from the same rows.
fn outcomes(conn: &mut PgConnection) -> Vec<String> {
    let mut seen = Vec::new();
    let mut n = 0;
    for table in tables() {
        let statement = format!(
            "INSERT INTO {name} OVERRIDING SYSTEM VALUE \
             SELECT (jsonb_populate_record(r, $1)).* FROM {name} r LIMIT 1",
            name = table.name
        );
        for candidate in candidates(&table) {
            n += 1;
            let mut row = candidate.clone();
            if let Value::Object(fresh) = (table.fresh)(n) {
                for (column, value) in fresh {
                    row.entry(column).or_insert(value);
                }
            }
            let written = conn.transaction(|conn| {
                let inserted = diesel::sql_query(&statement)
                    .bind::<Jsonb, _>(Value::Object(row))
                    .execute(conn)?;
                assert_eq!(inserted, 1, "{}: no row to copy", table.name);
                Err::<(), _>(diesel::result::Error::RollbackTransaction)
            });
            let outcome = match written {
                Err(diesel::result::Error::RollbackTransaction) => "ok".to_owned(),
                Err(diesel::result::Error::DatabaseError(kind, info)) => format!(
                    "{kind:?} constraint {:?} table {:?}: {}",
                    info.constraint_name(),
                    info.table_name(),
                    info.message()
                ),
                other => panic!("{}: {other:?}", table.name),
            };
            seen.push(format!(
                "{} {}: {outcome}",
                table.name,
                Value::Object(candidate)
            ));
        }
    }
    seen
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The CHECK constraints of the seven tables, by name.
fn check_constraints(conn: &mut PgConnection) -> Vec<String> {
    diesel::sql_query(
        "SELECT conname::text AS name FROM pg_constraint WHERE contype = 'c' \
         AND conrelid::regclass::text IN ('accounts', 'reservations', 'ledger_entries', \
         'credit_grants', 'generation_jobs', 'events', 'api_keys') ORDER BY 1",
    )
    .load::<Name>(conn)
    .expect("constraints")
    .into_iter()
    .map(|row| row.name)
    .collect()
}

#[test]
fn the_rule_functions_refuse_what_the_old_constraints_refused() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    // The rules as row_rules_whole_row made them: the books' identity,
    // added since (accounts_books_identity, tests/api/books_guard.rs), is
    // no constraint these replaced, and random balances break it.
    conn.batch_execute(BEFORE_BOOKS_IDENTITY)
        .expect("the row rules before the books' identity");
    // A row of each table: an account with a grant (its credit's entry
    // and event), a committed reservation, a held one, a job.
    let account = AccountId(RULES_ACCOUNT);
    diesel::sql_query("INSERT INTO accounts (id, name) VALUES ($1, 'rules')")
        .bind::<diesel::sql_types::Uuid, _>(account.0)
        .execute(&mut conn)
        .expect("account");
    credit(&mut conn, account, 20);
    let committed = reserve(&mut conn, account, 5);
    engine(
        &mut conn,
        account,
        Op::Commit {
            reservation: ReservationId(committed.id),
            amount: CommitAmount::All,
        },
    )
    .expect("commit");
    reserve(&mut conn, account, 5);
    create_job(&mut conn, account);
    // An admin key (api_keys' rules, api_keys_rules): candidates make it
    // a kiosk key of the account, with or without a budget.
    diesel::sql_query(
        "INSERT INTO api_keys (id, secret_hash, scope, label) \
         VALUES (gen_random_uuid(), sha256('rules'), 'admin', 'rules')",
    )
    .execute(&mut conn)
    .expect("key");

    let constraints = check_constraints(&mut conn);
    assert!(
        constraints.iter().all(|name| name.ends_with("_rules")),
        "the migration's constraints: {constraints:?}"
    );
    let new = outcomes(&mut conn);

    // Under the old constraints, in a transaction rolled back.
    let mut judged = None;
    let rolled_back = conn.transaction::<(), diesel::result::Error, _>(|conn| {
        conn.batch_execute(OLD_CONSTRAINTS)?;
        judged = Some((outcomes(conn), check_constraints(conn)));
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(
        matches!(rolled_back, Err(diesel::result::Error::RollbackTransaction)),
        "{rolled_back:?}"
    );
    let (old, old_names) = judged.expect("judged");
    assert_eq!(new, outcomes(&mut conn), "the rule functions are back");
    assert_eq!(old_names.len(), 33, "{old_names:?}");

    // Every old constraint refused some candidate: the comparison covers
    // every rule.
    let unrefused: Vec<&String> = old_names
        .iter()
        .filter(|name| {
            !old.iter()
                .any(|outcome| outcome.contains(&format!("constraint Some({name:?})")))
        })
        .collect();
    assert!(unrefused.is_empty(), "no candidate broke {unrefused:?}");
    assert!(old.iter().any(|outcome| outcome.ends_with(": ok")));

    let differ: Vec<(&String, &String)> = old
        .iter()
        .zip(&new)
        .filter(|(old, new)| old != new)
        .collect();
    assert_eq!(old.len(), new.len());
    assert!(
        differ.is_empty(),
        "{} of {} candidates differ, e.g. {:#?}",
        differ.len(),
        old.len(),
        &differ[..differ.len().min(5)]
    );
}
