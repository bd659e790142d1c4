//! The service binary as a shell user meets it: JSON alone on stdout, logs
//! on stderr without colour when not on a terminal, clear refusals on a
//! database that `migrate` has not prepared, per-command help, and no test
//! tools in it.

use std::process::{Command, Output};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{server_url, TestDatabase};

const BINARY: &str = env!("CARGO_BIN_EXE_token-billing");

fn run(database_url: &str, args: &[&str]) -> Output {
    Command::new(BINARY)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("LOG_FORMAT")
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// stdout must be one JSON document and nothing else.
fn json_stdout(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {}", text(&output.stdout)))
}

fn database_exists(name: &str) -> bool {
    let mut admin =
        PgConnection::establish(&format!("{}/postgres", server_url())).expect("connect");
    diesel::sql_query(format!(
        "SELECT 1 FROM pg_database WHERE datname = '{name}'"
    ))
    .execute(&mut admin)
    .expect("query")
        == 1
}

#[test]
fn management_commands_never_create_or_migrate_a_database() {
    let name = format!("tb_test_cli_{}", Uuid::new_v4().simple());
    let url = format!("{}/{name}", server_url());
    for args in [
        &["account", "create", "--name", "x"][..],
        &["account", "list"],
        &["api-key", "create", "--scope", "admin", "--label", "ops"],
        &["reconcile"],
    ] {
        let output = run(&url, args);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains("does not exist") && stderr.contains("token-billing migrate"),
            "{args:?}: {stderr}"
        );
        assert!(!database_exists(&name), "{args:?} created the database");
    }

    // An empty database (created, never migrated) is refused too, and left empty.
    let mut admin =
        PgConnection::establish(&format!("{}/postgres", server_url())).expect("connect");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create");
    let output = run(&url, &["account", "create", "--name", "x"]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("not migrated") && stderr.contains("token-billing migrate"),
        "{stderr}"
    );
    let mut conn = PgConnection::establish(&url).expect("connect");
    let tables = diesel::sql_query(
        "SELECT 1 FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    .execute(&mut conn)
    .expect("query");
    assert_eq!(tables, 0, "the refused command left tables behind");
    drop(conn);
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .expect("drop");
}

#[test]
fn results_are_json_alone_on_stdout_and_logs_have_no_colour() {
    let database = TestDatabase::create();
    let url = database.url.clone();

    // migrate's result is JSON too: what it did (here: nothing, the test
    // database is a migrated clone).
    let migrate = json_stdout(&run(&url, &["migrate"]));
    assert_eq!(migrate["applied"], serde_json::json!([]));
    assert_eq!(migrate["up_to_date"], true);

    let account = json_stdout(&run(
        &url,
        &["account", "create", "--name", "Booth 50% off"],
    ));
    assert_eq!(account["name"], "Booth 50% off");
    assert_eq!(account["available"], 0);
    let id = account["account_id"].as_str().expect("id").to_owned();
    json_stdout(&run(&url, &["account", "create", "--name", "Wedding"]));

    // `%` in q matches itself, not "anything".
    let found = json_stdout(&run(&url, &["account", "list", "--q", "50%"]));
    let names: Vec<&str> = found["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .map(|account| account["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["Booth 50% off"]);
    assert_eq!(found["next_after"], Value::Null);

    let key = json_stdout(&run(
        &url,
        &[
            "api-key",
            "create",
            "--scope",
            "kiosk",
            "--account",
            &id,
            "--label",
            "booth 1",
        ],
    ));
    assert_eq!(key["scope"], "kiosk");
    assert_eq!(key["account_id"], id.as_str());
    assert!(key["key"].as_str().expect("secret").len() >= 64);

    let report = json_stdout(&run(&url, &["reconcile"]));
    assert_eq!(report["status"], "ok");

    // Refusals speak the command line's language, not HTTP's.
    let output = run(
        &url,
        &["api-key", "create", "--scope", "kiosk", "--label", "x"],
    );
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("--account"), "{stderr}");
    assert!(!stderr.contains("/v1/"), "{stderr}");
    // A global option is accepted after the subcommand too.
    let listed = Command::new(BINARY)
        .args(["account", "list", "--database-url", &url])
        .env_remove("DATABASE_URL")
        .output()
        .expect("runs");
    assert_eq!(
        json_stdout(&listed)["accounts"].as_array().map(Vec::len),
        Some(2)
    );
    let output = run(&url, &["account", "list", "--limit", "0"]);
    assert!(text(&output.stderr).contains("--limit must be"));

    // Logs (here: the migrations applied) go to stderr, uncoloured when
    // stderr is not a terminal.
    let fresh = TestDatabase::create();
    fresh
        .connect()
        .batch_execute("DROP TABLE IF EXISTS idempotency_keys; DELETE FROM __diesel_schema_migrations WHERE version = '20261201000010'")
        .expect("unapply the last migration");
    let migrate = run(&fresh.url, &["migrate"]);
    let stderr = text(&migrate.stderr);
    assert!(stderr.contains("applied migration"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes on a pipe: {stderr:?}"
    );
    // stdout has the result alone: the one migration it applied.
    let report: serde_json::Value = serde_json::from_slice(&migrate.stdout).expect("JSON");
    assert_eq!(
        report["applied"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
}

#[test]
fn each_command_has_its_own_help_and_no_test_tools() {
    let help = |args: &[&str]| {
        let output = run("postgres://unused@127.0.0.1:1/none", args);
        assert!(output.status.success(), "{args:?}");
        text(&output.stdout)
    };
    let top = help(&["--help"]);
    for tool in ["chaos", "bench", "fake-provider"] {
        assert!(
            !top.contains(tool),
            "the service binary offers {tool}:\n{top}"
        );
    }
    let create = help(&["account", "create", "--help"]);
    assert!(
        create.contains("--name") && create.contains("Example"),
        "{create}"
    );
    assert!(
        create.contains("The account's name"),
        "--name has no description"
    );
    for serve_only in ["--bind-addr", "--admin-api-key", "--price-list"] {
        assert!(
            !create.contains(serve_only),
            "account create --help shows {serve_only}"
        );
    }
    let key = help(&["api-key", "create", "--help"]);
    assert!(
        key.contains("--label") && key.contains("A note telling"),
        "{key}"
    );
    let serve = help(&["serve", "--help"]);
    assert!(serve.contains("--bind-addr") && serve.contains("--admin-api-key"));

    let chaos = run("postgres://unused@127.0.0.1:1/none", &["chaos"]);
    assert!(
        !chaos.status.success(),
        "`token-billing chaos` still exists"
    );

    // The tools live in their own binary, which the image does not ship.
    let tools = Command::new(env!("CARGO_BIN_EXE_token-billing-tools"))
        .arg("--help")
        .output()
        .expect("the tools binary runs");
    let tools = text(&tools.stdout);
    for tool in ["chaos", "bench", "fake-provider"] {
        assert!(
            tools.contains(tool),
            "token-billing-tools lacks {tool}:\n{tools}"
        );
    }
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile"))
        .expect("Dockerfile");
    assert!(
        dockerfile.contains("--bin token-billing\n"),
        "the image builds the service"
    );
    assert!(
        !dockerfile.contains("token-billing-tools"),
        "the image ships the tools"
    );
}
