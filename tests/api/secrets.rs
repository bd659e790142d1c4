//! No secret is ever printed: not the database password in a failing
//! start's error, not the admin key or an API key's secret in the logs of a
//! normal run (at debug level, with requests that use them).

use crate::crash::free_port;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::TestDatabase;

const ADMIN_SECRET: &str = "admin-secret-never-printed-0123";
const DB_PASSWORD: &str = "db-password-never-printed";

#[test]
fn a_failing_start_does_not_print_the_database_password() {
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .env(
            "DATABASE_URL",
            format!("postgres://postgres:{DB_PASSWORD}@127.0.0.1:1/token_billing?password={DB_PASSWORD}"),
        )
        .env("ADMIN_API_KEY", ADMIN_SECRET)
        .env("RUST_LOG", "debug")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains("***"),
        "the URL is shown redacted: {printed}"
    );
    for secret in [DB_PASSWORD, ADMIN_SECRET] {
        assert!(!printed.contains(secret), "{secret} printed: {printed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_run_logs_no_key() {
    let database = TestDatabase::create();
    let port = free_port();
    let log = std::env::temp_dir().join(format!("token-billing-secrets-{}.log", Uuid::new_v4()));
    let child = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .env("DATABASE_URL", &database.url)
        .env("BIND_ADDR", format!("127.0.0.1:{port}"))
        .env("ADMIN_API_KEY", ADMIN_SECRET)
        .env("RUST_LOG", "debug")
        .env("WORKER_CONCURRENCY", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("starts");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
    {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let post = |path: String, key: String, body: Value| {
        let client = client.clone();
        async move {
            client
                .post(path)
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .expect("sent")
        }
    };
    let account: Value = post(
        format!("{base}/v1/accounts"),
        ADMIN_SECRET.into(),
        json!({"name": "secrets"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let account = account["account_id"].as_str().expect("id").to_owned();
    let key: Value = post(
        format!("{base}/v1/accounts/{account}/api-keys"),
        ADMIN_SECRET.into(),
        json!({"scope": "kiosk", "label": "booth"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let kiosk = key["key"].as_str().expect("key").to_owned();
    let secret_part = kiosk.rsplit('_').next().expect("secret").to_owned();
    let refused = post(
        format!("{base}/v1/accounts/{account}/reservations"),
        kiosk.clone(),
        json!({"request_id": Uuid::new_v4(), "amount": 1}),
    )
    .await;
    assert_eq!(refused.status(), StatusCode::PAYMENT_REQUIRED);
    let wrong = post(
        format!("{base}/v1/accounts"),
        format!("{kiosk}x"),
        json!({"name": "x"}),
    )
    .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    // Stop it gracefully so every log line is written.
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let mut child = child;
    child.wait().expect("exits");
    let logs = std::fs::read_to_string(&log).expect("logs");
    let _ = std::fs::remove_file(&log);
    assert!(
        logs.contains("served"),
        "the run logged its requests: {logs}"
    );
    for secret in [ADMIN_SECRET, secret_part.as_str()] {
        assert!(!logs.contains(secret), "a secret was logged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_any_admin_key_says_how_to_create_one() {
    let database = TestDatabase::create();
    let port = free_port();
    let log = std::env::temp_dir().join(format!("token-billing-no-admin-{}.log", Uuid::new_v4()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .arg("serve")
        .env("DATABASE_URL", &database.url)
        .env("BIND_ADDR", format!("127.0.0.1:{port}"))
        .env_remove("ADMIN_API_KEY")
        .env("RUST_LOG", "warn")
        .env("WORKER_CONCURRENCY", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("starts");
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !client
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
    {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    child.wait().expect("exits");
    let logs = std::fs::read_to_string(&log).expect("logs");
    let _ = std::fs::remove_file(&log);
    assert!(
        logs.contains("token-billing api-key create --scope admin"),
        "the start says how to create an admin key: {logs}"
    );
}
