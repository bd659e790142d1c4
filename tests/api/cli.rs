//! The service binary as a shell user meets it: JSON alone on stdout, logs
//! on stderr without colour when not on a terminal, clear refusals on a
//! database that `migrate` has not prepared, per-command help, and no test
//! tools in it.

use std::process::{Command, Output};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use serde_json::{json, Value};
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
    assert_eq!(key["budget"], Value::Null);
    // A booth's key with a budget, as the API sets it.
    let budgeted = json_stdout(&run(
        &url,
        &[
            "api-key",
            "create",
            "--scope",
            "kiosk",
            "--account",
            &id,
            "--label",
            "booth 2",
            "--budget-tokens",
            "200",
            "--budget-period",
            "day",
            "--budget-time-zone",
            "Europe/Berlin",
        ],
    ));
    assert_eq!(budgeted["budget"]["budget_tokens"], 200, "{budgeted}");
    assert_eq!(budgeted["budget"]["budget_period"], "day");
    assert_eq!(budgeted["budget"]["budget_time_zone"], "Europe/Berlin");
    let refused = run(
        &url,
        &[
            "api-key",
            "create",
            "--scope",
            "admin",
            "--budget-tokens",
            "5",
            "--budget-period",
            "total",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("kiosk"),
        "{}",
        text(&refused.stderr)
    );

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

    // The tools and the load generators live in binaries of their own,
    // which the image does not ship.
    for (binary, commands) in [
        (
            crate::helpers::tools_binary(),
            &["chaos", "fake-provider"][..],
        ),
        (
            crate::helpers::bench_binary(),
            &["load", "jobs", "history", "webhook-sink"],
        ),
    ] {
        let output = Command::new(&binary)
            .arg("--help")
            .output()
            .expect("the binary runs");
        let help = text(&output.stdout);
        for command in commands {
            assert!(help.contains(command), "{binary} lacks {command}:\n{help}");
        }
    }
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile"))
        .expect("Dockerfile");
    assert!(
        dockerfile.contains("--bin token-billing\n"),
        "the image builds the service"
    );
    for other in ["token-billing-tools", "token-billing-bench"] {
        assert!(!dockerfile.contains(other), "the image ships {other}");
    }
}

/// Every help screen of the three binaries: each option that reads a variable
/// says `[env: NAME]`, never a bare `[env: NAME=]`; prune's retention flags
/// say what they keep; the fake provider offers no `--database-url` it
/// would not use.
#[test]
fn help_describes_every_option_without_empty_env_markers() {
    let help = |binary: &str, args: &[&str]| {
        let output = Command::new(binary)
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("LOG_FORMAT")
            .output()
            .expect("runs");
        assert!(output.status.success(), "{args:?}");
        text(&output.stdout)
    };
    let tools = crate::helpers::tools_binary();
    let tools = tools.as_str();
    let bench = crate::helpers::bench_binary();
    let bench = bench.as_str();
    let mut screens = Vec::new();
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["account", "create", "--help"],
        &["account", "list", "--help"],
        &["api-key", "create", "--help"],
        &["api-key", "list", "--help"],
        &["api-key", "revoke", "--help"],
        &["credit", "--help"],
        &["reconcile", "--help"],
        &["balances", "--help"],
        &["close-days", "--help"],
        &["prune", "--help"],
        &["ledger-digest", "--help"],
    ] {
        screens.push((args.join(" "), help(BINARY, args)));
    }
    for args in [
        &["--help"][..],
        &["fake-provider", "--help"],
        &["chaos", "--help"],
    ] {
        screens.push((format!("tools {}", args.join(" ")), help(tools, args)));
    }
    for args in [&["--help"][..], &["load", "--help"], &["history", "--help"]] {
        screens.push((format!("bench {}", args.join(" ")), help(bench, args)));
    }
    for (name, screen) in &screens {
        assert!(
            !screen.contains("=]"),
            "{name}: a bare env marker:\n{screen}"
        );
    }
    let prune = &screens
        .iter()
        .find(|(name, _)| name == "prune --help")
        .expect("prune")
        .1;
    for described in [
        "How long idempotency keys are kept",
        "How long events",
        "How long finished webhook deliveries",
        "How long audit events are kept",
        "Where pruned rows are archived",
    ] {
        assert!(prune.contains(described), "prune --help: {prune}");
    }
    let fake = &screens
        .iter()
        .find(|(name, _)| name == "tools fake-provider --help")
        .expect("fake-provider")
        .1;
    assert!(!fake.contains("--database-url"), "{fake}");
}

#[test]
fn keys_are_listed_and_revoked_and_credits_are_idempotent_from_the_command_line() {
    let database = TestDatabase::create();
    let url = database.url.clone();
    let account = json_stdout(&run(&url, &["account", "create", "--name", "Booth"]));
    let account = account["account_id"].as_str().expect("id").to_owned();

    // credit: idempotent by --external-ref.
    let args = [
        "credit",
        "--account",
        &account,
        "--amount",
        "500",
        "--external-ref",
        "invoice-42",
        "--expires-at",
        "2036-01-01",
    ];
    let first = json_stdout(&run(&url, &args));
    assert_eq!(first["amount"], 500);
    assert_eq!(first["available"], 500);
    assert_eq!(first["expires_at"], "2036-01-01T00:00:00.000000Z");
    let again = run(&url, &args);
    assert_eq!(
        json_stdout(&again),
        first,
        "the same credit, not a second one"
    );
    assert!(
        text(&again.stderr).contains("nothing changed"),
        "{}",
        text(&again.stderr)
    );
    let other = args.map(|arg| if arg == "500" { "400" } else { arg });
    let reused = run(&url, &other);
    assert!(
        !reused.status.success(),
        "a reused --external-ref was accepted"
    );
    assert!(reused.stdout.is_empty());
    let listed = json_stdout(&run(&url, &["account", "list"]));
    assert_eq!(listed["accounts"][0]["available"], 500, "{listed}");
    // A price: both flags, an ISO 4217 code, whole minor units.
    let priced = [
        "credit",
        "--account",
        &account,
        "--amount",
        "10",
        "--external-ref",
        "invoice-43",
        "--amount-paid",
        "1999",
        "--currency",
        "EUR",
    ];
    let credit = json_stdout(&run(&url, &priced));
    assert_eq!(
        (credit["amount_paid"].clone(), credit["currency"].clone()),
        (json!(1999), json!("EUR"))
    );
    for (flags, says) in [
        (&["--amount-paid", "1999"][..], "--currency"),
        (
            &["--amount-paid", "1999", "--currency", "EURO"][..],
            "ISO 4217",
        ),
        (
            &["--amount-paid=-5", "--currency", "EUR"][..],
            "--amount-paid",
        ),
    ] {
        let mut args = vec![
            "credit",
            "--account",
            &account,
            "--amount",
            "1",
            "--external-ref",
            "x",
        ];
        args.extend_from_slice(flags);
        let refused = run(&url, &args);
        assert!(!refused.status.success(), "{flags:?} was accepted");
        assert!(
            text(&refused.stderr).contains(says),
            "{flags:?}: {}",
            text(&refused.stderr)
        );
    }

    // api-key list / revoke.
    let created = json_stdout(&run(
        &url,
        &[
            "api-key",
            "create",
            "--scope",
            "kiosk",
            "--account",
            &account,
            "--label",
            "booth 1",
        ],
    ));
    let key_id = created["key_id"].as_str().expect("key_id").to_owned();
    let secret = created["key"].as_str().expect("key").to_owned();
    let listed = run(&url, &["api-key", "list", "--account", &account]);
    assert!(
        !text(&listed.stdout).contains(&secret),
        "the list shows a secret"
    );
    let listed = json_stdout(&listed);
    assert_eq!(listed["keys"][0]["key_id"], key_id.as_str(), "{listed}");
    assert_eq!(listed["keys"][0]["revoked_at"], Value::Null);
    let revoked = json_stdout(&run(&url, &["api-key", "revoke", &key_id]));
    assert_eq!(revoked["revoked"], true);
    json_stdout(&run(&url, &["api-key", "revoke", &key_id]));
    let listed = json_stdout(&run(&url, &["api-key", "list"]));
    let shown = listed["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|key| key["key_id"] == key_id.as_str())
        .expect("the key is listed");
    assert!(shown["revoked_at"].is_string(), "{shown}");
    let unknown = run(&url, &["api-key", "revoke", &Uuid::new_v4().to_string()]);
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("api-key list"));
}

/// Booleans are `true` or `false`, nothing else; a setting that weakens a
/// guard is warned of at start.
#[test]
fn booleans_are_strict_and_a_weakened_guard_is_warned_of() {
    for value in ["yes", "1", "on", "TRUE "] {
        // A database that cannot be reached, and a bound: were the value
        // accepted, `serve` would stop at the connection (or be killed),
        // never touch a real database, and the test would fail, not hang.
        let mut child = Command::new(BINARY)
            .arg("serve")
            .env("WEBHOOK_ALLOW_PRIVATE_URLS", value)
            .env("DATABASE_URL", "postgres://unused@127.0.0.1:1/none")
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let output = child.wait_with_output().expect("output");
        let said = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{value}: {said}");
        assert!(
            said.contains("WEBHOOK_ALLOW_PRIVATE_URLS"),
            "{value}: {said}"
        );
    }

    let database = TestDatabase::create();
    let mut child = Command::new(BINARY)
        .args(["serve", "--bind-addr", "127.0.0.1:0"])
        .env("DATABASE_URL", &database.url)
        .env("ADMIN_API_KEY", "cli-test-admin-key-0123456789")
        .env("WEBHOOK_ALLOW_PRIVATE_URLS", "true")
        .env("RATE_LIMIT_PER_SECOND", "0")
        .env("RUST_LOG", "warn,token_billing=info")
        .env_remove("LOG_FORMAT")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut said = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !said.iter().any(|line: &String| line.contains("serving")) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => said.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let said = said.join("\n");
    for variable in ["WEBHOOK_ALLOW_PRIVATE_URLS=true", "RATE_LIMIT_PER_SECOND=0"] {
        assert!(
            said.contains(&format!("a guard is weakened: {variable}")),
            "no warning of {variable}:\n{said}"
        );
    }
    assert!(!said.contains("AUTH_FAILURE_BURST"), "{said}");
}
