//! Operating the service: request ids, the metrics the alerts and the
//! dashboard rely on, each key's rate limit. (The compose files' checks
//! need no database: tests/repository/compose.rs.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{TestApp, ADMIN_KEY};

fn repository_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repository_file(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_a_request_id_also_in_problem_bodies() {
    let app = TestApp::spawn().await;
    let missing = format!("/v1/accounts/{}", Uuid::new_v4());

    let response = app.get(&missing, ADMIN_KEY).await;
    let header = response.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(Uuid::parse_str(&header).is_ok(), "a generated id: {header}");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["request_id"], header.as_str());

    let echoed = app
        .client
        .get(app.url(&missing))
        .bearer_auth(ADMIN_KEY)
        .header("x-request-id", "kiosk-7.retry_2")
        .send()
        .await
        .expect("sent");
    assert_eq!(echoed.headers()["x-request-id"], "kiosk-7.retry_2");
    let body: Value = echoed.json().await.expect("json");
    assert_eq!(body["request_id"], "kiosk-7.retry_2");

    let replaced = app
        .client
        .get(app.url("/healthz"))
        .header("x-request-id", "evil\"id<>")
        .send()
        .await
        .expect("sent");
    assert_eq!(replaced.status(), StatusCode::OK);
    let header = replaced.headers()["x-request-id"].to_str().expect("ascii");
    assert!(
        Uuid::parse_str(header).is_ok(),
        "an unsafe client id is replaced: {header}"
    );
}

/// Metric names (`token_billing_…`, `process_…`) mentioned in a text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["token_billing_", "process_"] {
        let mut rest = text;
        while let Some(start) = rest.find(prefix) {
            let tail = &rest[start..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_design_the_alerts_and_the_dashboard_is_exported() {
    let app = TestApp::spawn().await;
    // HTTP series exist once a request was served (their labels vary).
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::OK
    );
    let exposition = app.metrics_text().await;
    let mut exported = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().expect("name"), parts.next().expect("type"));
            exported.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    let design = [
        "reservations_total",
        "reservation_resolutions_total",
        "tokens_total",
        "active_reservations",
        "reserved_tokens",
        "oldest_reservation_age_seconds",
        "jobs_total",
        "jobs_in_flight",
        "job_duration_seconds",
        "provider_requests_total",
        "provider_request_duration_seconds",
        "reaper_runs_total",
        "reaper_last_success_timestamp_seconds",
        "consistency_repairs_total",
        "invariant_violations",
        "http_requests_total",
        "http_request_duration_seconds",
        "build_info",
    ];
    for name in design {
        assert!(
            exported.contains(&format!("token_billing_{name}")),
            "metric token_billing_{name} of docs/api.md missing"
        );
    }
    // The backup metrics come from pgBackRest through the textfile
    // collector script (docs/backup.md), not from the service.
    let collected = metric_names(&read("prometheus/backup-metrics.sh"));
    for file in [
        "prometheus/alerts.yml",
        "prometheus/backup-alerts.yml",
        "grafana/dashboard.json",
    ] {
        let used = metric_names(&read(file));
        assert!(!used.is_empty(), "{file} uses metrics");
        for name in used {
            assert!(
                exported.contains(&name) || collected.contains(&name),
                "{file} uses {name}, which neither /metrics nor prometheus/backup-metrics.sh exports"
            );
        }
    }
    // No per-account, per-key or per-request label anywhere.
    for forbidden in ["account", "key", "request_id", "reservation"] {
        assert!(
            !exposition.contains(&format!("{forbidden}=\"")),
            "label {forbidden} exported"
        );
    }
}

/// Sends `count` requests back to back; returns the statuses and the
/// tokens the quota (1 per second) may have regained meanwhile.
async fn burst(app: &TestApp, path: &str, key: &str, count: usize) -> (Vec<StatusCode>, usize) {
    let started = std::time::Instant::now();
    let mut statuses = Vec::with_capacity(count);
    for _ in 0..count {
        statuses.push(app.get(path, key).await.status());
    }
    (statuses, started.elapsed().as_secs() as usize + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_key_is_rate_limited_on_its_own() {
    let app = TestApp::spawn_with(|config| {
        config.rate_limit_per_second = 1;
        // The set-up below sends 4 admin requests at once.
        config.rate_limit_burst = 5;
    })
    .await;
    let account = app.funded_account(1).await;
    let (first, second) = (app.kiosk_key(account).await, app.kiosk_key(account).await);
    let path = format!("/v1/accounts/{account}");

    let (statuses, regained) = burst(&app, &path, &first, 12).await;
    assert!(
        statuses[..5].iter().all(|s| *s == StatusCode::OK),
        "the burst is served: {statuses:?}"
    );
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(
        limited >= 7 - regained.min(7),
        "beyond the burst, 429s: {statuses:?}"
    );
    assert!(statuses
        .iter()
        .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS));
    let mut over = None;
    for _ in 0..100 {
        let response = app.get(&path, &first).await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            over = Some(response);
            break;
        }
    }
    let over = over.expect("a 429 within 100 requests at 1 per second");
    assert_eq!(over.headers()["retry-after"], "1");
    let (_, body) = crate::helpers::problem(over).await;
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(
        app.get(&path, &second).await.status(),
        StatusCode::OK,
        "another key has its own quota"
    );

    // Garbage keys are refused before any lookup, and charged to no key's
    // bucket: a key is charged only once its secret is verified (what
    // limits a flood of bad keys is the per-address failure throttle,
    // auth_throttle.rs).
    let (statuses, _) = burst(&app, &path, "garbage", 12).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::UNAUTHORIZED),
        "{statuses:?}"
    );
    assert_eq!(
        app.get(&path, &second).await.status(),
        StatusCode::OK,
        "nor does the flood touch a real key's quota"
    );
}
