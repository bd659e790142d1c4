//! What a restore from backup relies on, as a shell user meets it:
//! `token-billing ledger-digest` (the hash chain finance keeps and compares
//! after a restore) and the start-up refusal of a database migrated by a
//! newer release (docs/backup.md).

use std::process::{Command, Output};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use serde_json::Value;

use crate::helpers::TestDatabase;

const BINARY: &str = env!("CARGO_BIN_EXE_token-billing");

fn run(database_url: &str, args: &[&str]) -> Output {
    Command::new(BINARY)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .output()
        .expect("the binary runs")
}

/// Like [`run`], for commands that would keep running if the refusal
/// failed: killed after 60 s, and the test fails.
fn run_bounded(database_url: &str, args: &[&str]) -> Output {
    let mut child = Command::new(BINARY)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!("{args:?} kept running: {}", text(&output.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn digest(database_url: &str, until: &str) -> Value {
    let output = run(database_url, &["ledger-digest", "--until", until]);
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        text(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

/// Three entries at fixed instants on one account (made with the CLI):
/// a credit of 50 at 10:00, a reserve of 2 at 11:00, its commit at 12:00.
fn seed_ledger(database: &TestDatabase) {
    let created = run(&database.url, &["account", "create", "--name", "Digest"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let account: Value = serde_json::from_slice(&created.stdout).expect("json");
    let account = account["account_id"].as_str().expect("id").to_owned();
    database
        .connect()
        .batch_execute(&format!(
            "INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, \
                 used_after, external_ref, actor, created_at) VALUES \
             ('{account}', 'credit', 50, 50, 0, 0, 'invoice-1', 'admin', '2026-11-30T10:00:00Z'), \
             ('{account}', 'reserve', 2, 48, 2, 0, NULL, 'kiosk', '2026-11-30T11:00:00Z'), \
             ('{account}', 'commit', 2, 48, 0, 2, NULL, 'kiosk', '2026-11-30T12:00:00Z')"
        ))
        .expect("seed the ledger");
}

#[test]
fn one_changed_entry_changes_the_ledger_digest() {
    let database = TestDatabase::create();
    seed_ledger(&database);
    let until = "2026-11-30T11:30:00Z";

    let first = digest(&database.url, until);
    assert_eq!(first["entries"], 2, "{first}");
    assert_eq!(first["until"], "2026-11-30T11:30:00.000000Z");
    assert_eq!(first["format"], "sha256-chain-v2");
    let digest_text = first["digest"].as_str().expect("digest");
    assert_eq!(digest_text.len(), 64);
    assert!(digest_text.chars().all(|c| c.is_ascii_hexdigit()));

    // The same ledger gives the same digest, and an entry after the
    // instant is not part of it.
    assert_eq!(digest(&database.url, until), first);
    let through_noon = digest(&database.url, "2026-11-30T12:00:00Z");
    assert_eq!(through_noon["entries"], 3);
    assert_ne!(through_noon["digest"], first["digest"]);
    let first_id = first["last_entry_id"].as_i64().expect("id");
    assert_eq!(through_noon["last_entry_id"].as_i64(), Some(first_id + 1));

    // One changed entry (as a superuser attacker would, with the
    // append-only trigger disabled) changes the digest; changing it back
    // restores it.
    let tamper = |amount: i64| {
        database
            .connect()
            .batch_execute(&format!(
                "ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete; \
                 UPDATE ledger_entries SET available_after = {amount} WHERE kind = 'credit'; \
                 ALTER TABLE ledger_entries ENABLE TRIGGER ledger_entries_no_update_delete"
            ))
            .expect("tamper");
    };
    tamper(51);
    let tampered = digest(&database.url, until);
    assert_eq!(tampered["entries"], 2);
    assert_ne!(
        tampered["digest"], first["digest"],
        "a changed entry went unnoticed"
    );
    tamper(50);
    assert_eq!(digest(&database.url, until), first);

    // A removed entry changes it too, even with the count unchanged by a
    // later entry moved into the window.
    database
        .connect()
        .batch_execute(
            "ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete; \
             DELETE FROM ledger_entries WHERE kind = 'reserve'; \
             UPDATE ledger_entries SET created_at = '2026-11-30T11:00:00Z' WHERE kind = 'commit'; \
             ALTER TABLE ledger_entries ENABLE TRIGGER ledger_entries_no_update_delete",
        )
        .expect("tamper");
    let rewritten = digest(&database.url, until);
    assert_eq!(rewritten["entries"], 2);
    assert_ne!(rewritten["digest"], first["digest"]);
}

/// The chain recomputed by the auditor's script from `row_to_json` of
/// every entry (format 2) or the thirteen-column array (format 1), as
/// docs/backup.md shows.
fn recomputed(database: &TestDatabase, until: &str, format: u8) -> Value {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = diesel::sql_types::Text)]
        line: String,
    }
    let query = match format {
        2 => "SELECT row_to_json(e)::text AS line FROM ledger_entries e \
              WHERE created_at <= $1::timestamptz ORDER BY id",
        _ => "SELECT json_build_array(id, account_id, kind, amount, available_after, \
                  reserved_after, used_after, reservation_id, job_id, external_ref, reason, actor, \
                  to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))::text \
                  AS line \
              FROM ledger_entries WHERE created_at <= $1::timestamptz ORDER BY id",
    };
    let lines: Vec<Line> = diesel::sql_query(query)
        .bind::<diesel::sql_types::Text, _>(until)
        .load(&mut database.connect())
        .expect("entries");
    let mut input = String::new();
    for line in lines {
        input.push_str(&line.line);
        input.push('\n');
    }
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/backup/ledger_digest.py"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes())
        .expect("written");
    let output = child.wait_with_output().expect("output");
    assert!(output.status.success());
    serde_json::from_slice(&output.stdout).expect("json")
}

#[test]
fn every_column_is_in_the_digest_and_an_independent_script_agrees() {
    let database = TestDatabase::create();
    seed_ledger(&database);
    let until = "2026-11-30T12:00:00Z";
    let digest_in = |format: &str| {
        let output = run(
            &database.url,
            &["ledger-digest", "--until", until, "--format", format],
        );
        assert!(output.status.success(), "{}", text(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).expect("json")
    };
    let agreed = |previous: Option<&Value>| {
        let kept = digest(&database.url, until);
        assert_eq!(kept["format"], "sha256-chain-v2");
        assert_eq!(kept["entries"], 3);
        let script = recomputed(&database, until, 2);
        assert_eq!(
            (&script["digest"], &script["format"]),
            (&kept["digest"], &kept["format"]),
            "the script recomputes format 2"
        );
        if let Some(previous) = previous {
            assert_ne!(kept["digest"], previous["digest"]);
        }
        kept
    };
    let mut kept = agreed(None);
    let v1 = digest_in("1");
    assert_eq!(v1["format"], "sha256-chain-v1");
    assert_ne!(v1["digest"], kept["digest"]);
    assert_eq!(
        recomputed(&database, until, 1)["digest"],
        v1["digest"],
        "format 1 is still computable"
    );

    // Each column of the table in turn, changed in the first entry with
    // every trigger bypassed (as a superuser could): the digest changes,
    // and the script still agrees.
    #[derive(QueryableByName)]
    struct Column {
        #[diesel(sql_type = diesel::sql_types::Text)]
        column_name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        data_type: String,
    }
    let columns: Vec<Column> = diesel::sql_query(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'ledger_entries' \
         ORDER BY ordinal_position",
    )
    .load(&mut database.connect())
    .expect("columns");
    assert!(columns.len() >= 14, "every column: {}", columns.len());
    let mut changed = Vec::new();
    for Column {
        column_name,
        data_type,
    } in columns
    {
        let new_value = match (column_name.as_str(), data_type.as_str()) {
            // The kinds are a CHECK (which no setting bypasses).
            ("kind", _) => "CASE kind WHEN 'credit' THEN 'adjustment' ELSE 'credit' END".to_owned(),
            (_, data_type) => match data_type {
                "bigint" | "integer" | "smallint" => format!("{column_name} + 1000"),
                "uuid" => "gen_random_uuid()".to_owned(),
                "text" => format!("COALESCE({column_name}, '') || 'x'"),
                "timestamp with time zone" => format!("{column_name} - interval '1 microsecond'"),
                other => panic!("{column_name}: a column of type {other} the test cannot change"),
            },
        };
        database
            .connect()
            .batch_execute(&format!(
                "SET session_replication_role = replica; \
                 UPDATE ledger_entries SET {column_name} = {new_value} \
                 WHERE id = (SELECT min(id) FROM ledger_entries); \
                 SET session_replication_role = origin"
            ))
            .expect("tamper");
        let now = agreed(Some(&kept));
        changed.push(column_name);
        kept = now;
    }
    assert!(changed.contains(&"grant_id".to_owned()), "{changed:?}");
    assert!(changed.contains(&"api_key_id".to_owned()), "{changed:?}");
}

#[test]
fn the_ledger_digest_refuses_bad_instants_and_starts_from_the_empty_chain() {
    let database = TestDatabase::create();
    let empty = digest(&database.url, "2026-11-30T00:00:00+01:00");
    assert_eq!(empty["entries"], 0);
    assert_eq!(empty["digest"], "0".repeat(64));
    assert_eq!(empty["last_entry_id"], Value::Null);
    assert_eq!(empty["until"], "2026-11-29T23:00:00.000000Z");
    // A bare date is its midnight UTC, as for reconcile, balances and as_of.
    assert_eq!(
        digest(&database.url, "2026-11-30")["until"],
        "2026-11-30T00:00:00.000000Z"
    );

    for (until, expected) in [
        ("yesterday", "--until must be an RFC 3339 timestamp"),
        ("2999-01-01T00:00:00Z", "--until must not be in the future"),
    ] {
        let output = run(&database.url, &["ledger-digest", "--until", until]);
        assert!(!output.status.success(), "{until} accepted");
        assert!(output.stdout.is_empty());
        let stderr = text(&output.stderr);
        assert!(stderr.contains(expected), "{until}: {stderr}");
    }
}

#[test]
fn a_database_migrated_by_a_newer_release_is_refused_and_left_unchanged() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    conn.batch_execute(
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('29991231000000'); \
         DROP TABLE idempotency_keys; \
         DELETE FROM __diesel_schema_migrations WHERE version = '20261201000010'",
    )
    .expect("pretend a newer release migrated it (and one of ours is pending)");

    for args in [&["migrate"][..], &["serve", "--bind-addr", "127.0.0.1:0"]] {
        let output = run_bounded(&database.url, args);
        assert_eq!(output.status.code(), Some(1), "{args:?} was not refused");
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains("refusing to serve")
                && stderr.contains("29991231000000")
                && stderr.contains("newer release"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("serving"), "{args:?} served: {stderr}");
    }
    // Nothing was migrated: the pending migration is still pending.
    let pending = diesel::sql_query(
        "SELECT 1 FROM __diesel_schema_migrations WHERE version = '20261201000010'",
    )
    .execute(&mut conn)
    .expect("query");
    assert_eq!(pending, 0, "the refused start migrated the database");

    // Without the unknown version the same binary migrates and is happy.
    conn.batch_execute("DELETE FROM __diesel_schema_migrations WHERE version = '29991231000000'")
        .expect("forget it");
    let output = run(&database.url, &["migrate"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}
