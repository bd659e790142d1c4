//! Nothing leaks from files, help texts, job errors, the finance CSV or the
//! event feed (issue 36, finding 6).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use diesel::connection::SimpleConnection;
use reqwest::StatusCode;
use serde_json::{json, Value};
use token_billing::config::ProviderKind;
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

const BINARY: &str = env!("CARGO_BIN_EXE_token-billing");

/// The cells a spreadsheet makes of one CSV line when it splits at
/// `separator`: a cell that starts with `"` is quoted (doubled quotes
/// inside); a quote anywhere else is a plain character.
fn spreadsheet_cells(line: &str, separator: char) -> Vec<String> {
    let mut cells = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut cell = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(character) = chars.next() {
                match character {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        cell.push('"');
                    }
                    '"' => break,
                    other => cell.push(other),
                }
            }
        }
        for character in chars.by_ref() {
            if character == separator {
                break;
            }
            cell.push(character);
        }
        cells.push(cell);
        if chars.peek().is_none() {
            return cells;
        }
    }
}

/// What a spreadsheet runs as a formula: a cell starting with `= + - @`, a
/// tab or a carriage return, leading blanks (no-break space too) aside.
fn runs_as_formula(cell: &str) -> bool {
    let formula = ['=', '+', '-', '@', '\t', '\r'];
    cell.starts_with(formula) || cell.trim_start().starts_with(formula)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finance_csv_defuses_formulas_wherever_a_spreadsheet_splits_cells() {
    let app = TestApp::spawn().await;
    let start = chrono::Utc::now() - chrono::Duration::seconds(5);
    let names = [
        "Booth 7;=1+1;",
        " =1+1",
        "\u{A0}@SUM(A1:A9)",
        "Smith, -2+3",
        "Lobby;+cmd",
    ];
    for name in names {
        let account = app.create_account_from(&json!({"name": name})).await;
        app.credit(account, 1).await;
    }
    let response = app
        .client
        .get(app.url(&format!(
            "/v1/reconciliation?from={}",
            start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let csv = response.text().await.expect("text");
    // One line per account, then the totals row.
    let lines: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(lines.len(), names.len() + 1, "{csv}");
    assert!(lines[names.len()].starts_with("totals,"), "{csv}");
    // Opened where the list separator is `;` (German, French, Dutch
    // defaults) and where it is `,`.
    for separator in [';', ','] {
        for line in &lines {
            for cell in spreadsheet_cells(line, separator) {
                assert!(
                    !runs_as_formula(&cell),
                    "split at {separator:?}, the cell {cell:?} of {line:?} is a formula"
                );
            }
        }
    }
    // Read as CSV (`,`), each name is still there, readable.
    let read: Vec<String> = lines
        .iter()
        .map(|line| spreadsheet_cells(line, ',')[1].clone())
        .collect();
    for name in ["Booth 7;'=1+1;", "'=1+1", "Lobby;'+cmd"] {
        assert!(read.contains(&name.to_owned()), "{name:?} in {read:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_refuse_every_default_ignorable_character_and_are_trimmed() {
    let app = TestApp::spawn().await;
    for hidden in [
        '\u{180B}',
        '\u{180C}',
        '\u{180D}',
        '\u{180F}',
        '\u{17B4}',
        '\u{17B5}',
        '\u{16FE4}',
    ] {
        let name = format!("Wed{hidden}ding");
        let response = app
            .post("/v1/accounts", ADMIN_KEY, &json!({"name": name}))
            .await;
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "U+{:04X}: {body}",
            u32::from(hidden)
        );
    }
    let response = app
        .post(
            "/v1/accounts",
            ADMIN_KEY,
            &json!({"name": " \u{A0}Booth 9\u{2003} "}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let account: Value = response.json().await.expect("json");
    assert_eq!(account["name"], "Booth 9");
    let response = app
        .post(
            &format!(
                "/v1/accounts/{}/api-keys",
                account["account_id"].as_str().expect("id")
            ),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "\tkiosk 1 "}),
        )
        .await;
    // A tab is a control character: refused, not trimmed away.
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = app
        .post(
            &format!(
                "/v1/accounts/{}/api-keys",
                account["account_id"].as_str().expect("id")
            ),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": " kiosk 1\u{A0}"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let key: Value = response.json().await.expect("json");
    assert_eq!(key["label"], "kiosk 1");
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_archives_are_private_whatever_the_umask() {
    let app = TestApp::spawn().await;
    app.database
        .connect()
        .batch_execute(
            "INSERT INTO events (type, account_id, data, created_at) \
             SELECT 'credit.created', NULL, jsonb_build_object('n', g), now() - interval '100 days' \
             FROM generate_series(1, 20) g; \
             UPDATE webhook_relay SET after_txid = 9223372036854775807; \
             INSERT INTO idempotency_keys \
             (actor, endpoint, idempotency_key, request_hash, resource_id, created_at) \
             SELECT 'test', '/v1/accounts', 'key-' || g, sha256(g::text::bytea), \
                    gen_random_uuid(), now() - interval '40 days' \
             FROM generate_series(1, 5) g;",
        )
        .expect("old rows");
    let scratch = std::env::temp_dir().join(format!("tb-private-{}", Uuid::new_v4()));
    let archive = scratch.join("archive");
    std::fs::create_dir_all(&scratch).expect("scratch");
    // `umask 000`: without care, files would be 0666 and folders 0777.
    let output = Command::new("sh")
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(BINARY)
        .args(["--database-url", &app.database.url, "prune"])
        .env("ARCHIVE_DIR", &archive)
        .output()
        .expect("prune runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut files = 0;
    assert_eq!(mode(&archive), 0o700, "{}", archive.display());
    for table in std::fs::read_dir(&archive).expect("archive") {
        let table = table.expect("entry").path();
        assert_eq!(mode(&table), 0o700, "{}", table.display());
        for file in std::fs::read_dir(&table).expect("table folder") {
            let file = file.expect("entry").path();
            assert_eq!(mode(&file), 0o600, "{}", file.display());
            files += 1;
        }
    }
    std::fs::remove_dir_all(&scratch).expect("cleaned up");
    assert!(files >= 2, "events and idempotency keys were archived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kiosk_reads_the_services_words_for_a_provider_failure() {
    let secret = "provider-query-secret-36";
    let app = TestApp::spawn_with(|config| {
        config.provider = ProviderKind::Http;
        // Nothing listens on port 1: every attempt is refused at once.
        config.provider_url = Some(format!("http://127.0.0.1:1/?token={secret}"));
        config.job_max_attempts = 2;
    })
    .await;
    let account = app.funded_account(3).await;
    let kiosk = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();
    let response = app
        .create_job(account, &kiosk, request_id, &json!({"prompt": "x"}))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let job = app.wait_job(account, request_id, 30).await;
    assert_eq!(job["status"], "failed", "{job}");
    let seen = app
        .get(&format!("/v1/accounts/{account}/jobs/{request_id}"), &kiosk)
        .await
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(seen["error"]["code"], "provider_unavailable", "{seen}");
    let feed = app
        .get("/v1/events?type=job.failed&wait_seconds=20", &kiosk)
        .await
        .text()
        .await
        .expect("text");
    assert!(feed.contains("provider_unavailable"), "{feed}");
    for text in [seen.to_string(), feed] {
        for leak in [secret, "127.0.0.1:1", "token="] {
            assert!(!text.contains(leak), "{leak:?} shown to a kiosk: {text}");
        }
    }
}

#[test]
fn no_help_text_prints_a_secrets_value() {
    let provider_secret = "help-provider-secret-36";
    let bench_secret = "help-bench-admin-key-36";
    let mut runs = vec![Command::new(BINARY)
        .args(["serve", "--help"])
        .env(
            "PROVIDER_URL",
            format!("https://provider.example/v1?token={provider_secret}"),
        )
        .output()
        .expect("serve --help")];
    for bench in ["jobs", "load", "history"] {
        runs.push(
            Command::new(crate::helpers::bench_binary())
                .args([bench, "--help"])
                .env("BENCH_ADMIN_KEY", bench_secret)
                .output()
                .expect("bench --help"),
        );
    }
    for output in runs {
        assert!(output.status.success());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(text.contains("--"), "a help text: {text}");
        for secret in [provider_secret, bench_secret] {
            assert!(!text.contains(secret), "{secret} printed: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_accounts_event_id_answers_like_a_random_one() {
    let app = TestApp::spawn().await;
    let mine = app.funded_account(2).await;
    let theirs = app.funded_account(2).await;
    let kiosk = app.kiosk_key(mine).await;
    let feed: Value = app
        .get(
            &format!("/v1/events?account_id={theirs}&wait_seconds=20"),
            ADMIN_KEY,
        )
        .await
        .json()
        .await
        .expect("json");
    let their_event = feed["events"][0]["id"]
        .as_str()
        .expect("an event")
        .to_owned();
    let answer = |after: String| {
        let app = &app;
        let kiosk = &kiosk;
        async move {
            let response = app.get(&format!("/v1/events?after={after}"), kiosk).await;
            let status = response.status();
            let body: Value = response.json().await.expect("json");
            (status, body["code"].clone(), body["detail"].clone())
        }
    };
    let for_theirs = answer(their_event).await;
    let for_random = answer(Uuid::new_v4().to_string()).await;
    assert_eq!(for_theirs, for_random);
    assert_eq!(for_random.0, StatusCode::BAD_REQUEST);
}

/// A command line as the shell runs it: continuation lines joined.
fn command_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        match line.trim_end().strip_suffix('\\') {
            Some(start) => current.push_str(start),
            None => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    lines
}

#[test]
fn docs_and_scripts_pass_no_secret_on_a_command_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for file in [
        "docs/backup.md",
        "docs/finance.md",
        "docs/operations.md",
        "tests/backup/drill.sh",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        for line in command_lines(&text) {
            // Every user can read another's command line (`ps`).
            let key_in_argv = line.contains("curl") && line.contains("Bearer $");
            let url_in_argv = ["psql ", "pg_dump ", "pg_restore ", "pg_basebackup "]
                .iter()
                .filter_map(|command| line.split_once(command).map(|(_, rest)| rest))
                .any(|rest| rest.contains("DATABASE_URL") || rest.contains("://"));
            if key_in_argv || url_in_argv {
                found.push(format!("{file}: {}", line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "secrets on command lines:\n{}",
        found.join("\n")
    );
}
