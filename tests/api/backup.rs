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
    assert_eq!(first["format"], "sha256-chain-v1");
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

#[test]
fn the_ledger_digest_refuses_bad_instants_and_starts_from_the_empty_chain() {
    let database = TestDatabase::create();
    let empty = digest(&database.url, "2026-11-30T00:00:00+01:00");
    assert_eq!(empty["entries"], 0);
    assert_eq!(empty["digest"], "0".repeat(64));
    assert_eq!(empty["last_entry_id"], Value::Null);
    assert_eq!(empty["until"], "2026-11-29T23:00:00.000000Z");

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
