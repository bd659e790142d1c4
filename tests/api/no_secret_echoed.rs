//! No password is echoed, however malformed the database URL: every
//! command of the service binary, at debug level, in text and JSON logs,
//! with the URL in the environment or as a flag. libpq and the URL parsers
//! repeat a malformed URL in their own errors; what they print must reach
//! the terminal scrubbed.

use std::process::{Command, Output};

use crate::helpers::TestDatabase;

const PASSWORD: &str = "Sup3r\"Secret-never-printed";
const ADMIN_SECRET: &str = "admin-secret-never-printed-4567";

/// Malformed database URLs, each carrying the password.
fn malformed_urls() -> Vec<(&'static str, String)> {
    vec![
        (
            "missing `:` after the scheme",
            format!("postgres//postgres:{PASSWORD}@localhost/db"),
        ),
        (
            "missing `//`",
            format!("postgres:/postgres:{PASSWORD}@localhost/db"),
        ),
        (
            "a port that is not a number",
            format!("postgres://postgres:{PASSWORD}@localhost:port/db"),
        ),
        (
            "a wrong scheme",
            format!("mysql://root:{PASSWORD}@localhost/db"),
        ),
        (
            "broken IPv6 brackets",
            format!("postgres://postgres:{PASSWORD}@[::1/db"),
        ),
        (
            "no database name",
            format!("postgres://postgres:{PASSWORD}@localhost"),
        ),
        (
            "an unknown query parameter",
            format!("postgres://postgres:{PASSWORD}@localhost/db?passwd={PASSWORD}"),
        ),
        (
            "key=value with a bad port",
            format!("host=localhost password={PASSWORD} dbname=db port=abc"),
        ),
        (
            "key=value, quoted, unterminated",
            format!("host=localhost password='{PASSWORD} dbname=db"),
        ),
        (
            "key=value with a missing `=`",
            format!("host=localhost password = {PASSWORD} dbname"),
        ),
        (
            "an unreachable server",
            format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/db"),
        ),
    ]
}

const COMMANDS: [&[&str]; 7] = [
    &["serve"],
    &["migrate"],
    &["account", "create", "--name", "x"],
    &["account", "list"],
    &["api-key", "create", "--scope", "admin", "--label", "ops"],
    &["reconcile"],
    &["reconcile", "--from", "2026-11-01", "--csv"],
];

fn run(args: &[&str], environment: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_token-billing"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_READ_URL")
        .env_remove("LOG_FORMAT")
        .env("RUST_LOG", "debug")
        .env("ADMIN_API_KEY", ADMIN_SECRET)
        .env("BIND_ADDR", "127.0.0.1:0");
    for (name, value) in environment {
        command.env(name, value);
    }
    command.output().expect("the binary runs")
}

fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The password in any form a printer could give it.
fn leaked(text: &str) -> bool {
    let json_escaped = PASSWORD.replace('"', "\\\"");
    [
        PASSWORD,
        json_escaped.as_str(),
        "Secret-never-printed",
        ADMIN_SECRET,
    ]
    .iter()
    .any(|secret| text.contains(secret))
}

#[test]
fn no_command_echoes_the_password_of_a_malformed_url() {
    for (what, url) in malformed_urls() {
        for args in COMMANDS {
            for format in ["text", "json"] {
                let output = run(args, &[("DATABASE_URL", &url), ("LOG_FORMAT", format)]);
                let text = printed(&output);
                assert!(
                    !output.status.success(),
                    "{what}, {args:?}: succeeded?\n{text}"
                );
                assert!(
                    !leaked(&text),
                    "{what}, {args:?}, {format} logs: printed\n{text}"
                );
                assert!(!text.trim().is_empty(), "{what}, {args:?}: said nothing");
            }
            // The same URL as a flag rather than in the environment.
            let mut with_flag = vec!["--database-url", url.as_str()];
            with_flag.extend_from_slice(args);
            let output = run(&with_flag, &[]);
            let text = printed(&output);
            assert!(
                !output.status.success(),
                "{what}, --database-url {args:?}: succeeded?\n{text}"
            );
            assert!(
                !leaked(&text),
                "{what}, --database-url {args:?}: printed\n{text}"
            );
            assert!(
                !text.trim().is_empty(),
                "{what}, --database-url {args:?}: said nothing"
            );
        }
    }
}

/// A connection string pasted where the command line expects something
/// else: the argument parser repeats the argument it refuses, and what it
/// prints is scrubbed like every other error (every binary).
#[test]
fn the_argument_parser_does_not_echo_a_misplaced_url() {
    let urls = [
        format!("postgres://postgres:{}@localhost/db", urlencode(PASSWORD)),
        format!(
            "postgresql://ops:{}@db.example:5432/tb",
            urlencode(PASSWORD)
        ),
    ];
    for url in &urls {
        let service = env!("CARGO_BIN_EXE_token-billing");
        let tools = crate::helpers::tools_binary();
        let tools = tools.as_str();
        let bench = crate::helpers::bench_binary();
        let bench = bench.as_str();
        for (binary, args) in [
            (service, vec!["migrate", url]),
            (service, vec!["account", "list", url]),
            (service, vec!["serve", "--db-pool-size", url]),
            (tools, vec!["fake-provider", url]),
            (bench, vec!["load", "--seconds", url]),
        ] {
            let output = Command::new(binary)
                .args(&args)
                .env_remove("DATABASE_URL")
                .output()
                .expect("the binary runs");
            let text = printed(&output);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
            assert!(text.contains("***"), "{args:?}: nothing masked?\n{text}");
            assert!(
                !leaked(&text) && !text.contains(&urlencode(PASSWORD)),
                "{args:?}: printed\n{text}"
            );
        }
    }
}

#[test]
fn the_configuration_error_and_help_do_not_echo_it_either() {
    let url = format!("postgres://postgres:{PASSWORD}@h1,h2/db");
    // A configuration refused by `validate` (several hosts, no
    // target_session_attrs) quotes the URL.
    let output = run(&["serve"], &[("DATABASE_URL", &url)]);
    let text = printed(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("target_session_attrs") && text.contains("***"),
        "{text}"
    );
    assert!(!leaked(&text), "{text}");
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
    ] {
        let output = run(args, &[("DATABASE_URL", &url), ("DATABASE_READ_URL", &url)]);
        let text = printed(&output);
        assert!(output.status.success(), "{args:?}: {text}");
        assert!(!leaked(&text), "{args:?}: {text}");
    }
}

#[test]
fn a_working_url_with_a_password_is_not_echoed_at_debug_level() {
    // The server trusts local connections, so the password is sent and
    // ignored: the commands succeed and log at debug level all the way.
    let database = TestDatabase::create();
    let url = database.url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{}@", urlencode(PASSWORD)),
        1,
    );
    assert_ne!(
        url, database.url,
        "TEST_DATABASE_SERVER has the expected form"
    );
    for args in [
        &["migrate"][..],
        &["account", "list"],
        &["reconcile", "--csv"],
    ] {
        for format in ["text", "json"] {
            let output = run(args, &[("DATABASE_URL", &url), ("LOG_FORMAT", format)]);
            let text = printed(&output);
            assert!(output.status.success(), "{args:?}: {text}");
            assert!(!leaked(&text), "{args:?}, {format}: {text}");
            assert!(!text.contains(&urlencode(PASSWORD)), "{args:?}: {text}");
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}
