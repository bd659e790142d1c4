//! Operating the service: request ids, the metrics the alerts and the
//! dashboard rely on, and the compose file's consistency with the code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;
use yaml_rust2::{Yaml, YamlLoader};

use token_billing::cli::Cli;

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

fn yaml(relative: &str) -> Yaml {
    YamlLoader::load_from_str(&read(relative))
        .expect("valid YAML")
        .remove(0)
}

fn strings(node: &Yaml) -> Vec<String> {
    node.as_vec()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `host:container` mounts of a compose service.
fn mounts(service: &Yaml) -> Vec<(String, String)> {
    strings(&service["volumes"])
        .into_iter()
        .filter(|volume| volume.starts_with("./"))
        .map(|volume| {
            let mut parts = volume.split(':');
            (
                parts.next().expect("host").to_owned(),
                parts.next().expect("container").to_owned(),
            )
        })
        .collect()
}

fn container_port(service: &Yaml) -> String {
    let ports = strings(&service["ports"]);
    ports[0].rsplit(':').next().expect("port").to_owned()
}

#[test]
fn the_compose_file_agrees_with_the_code_and_the_repository() {
    let compose = yaml("docker-compose.yml");
    let services = &compose["services"];
    for name in ["postgres", "token-billing", "prometheus", "grafana"] {
        assert!(!services[name].is_badvalue(), "service {name}");
        assert!(
            !services[name]["healthcheck"]["test"].is_badvalue(),
            "service {name} has a healthcheck"
        );
    }
    let service = &services["token-billing"];

    // The service and its database come back after a crash or a reboot,
    // and the service starts once the database answers pg_isready.
    for name in ["postgres", "token-billing"] {
        assert_eq!(
            services[name]["restart"].as_str(),
            Some("unless-stopped"),
            "service {name} has a restart policy"
        );
    }
    assert_eq!(
        service["depends_on"]["postgres"]["condition"].as_str(),
        Some("service_healthy"),
        "the service waits for the database"
    );
    assert!(
        strings(&services["postgres"]["healthcheck"]["test"])
            .iter()
            .any(|part| part.contains("pg_isready")),
        "the database's healthcheck is pg_isready"
    );

    // The backup alerts need the backup-metrics exporter, which the stack
    // does not run: they are in their own file, off in compose, and the
    // compose file says how to turn them on.
    let backup_alerts = read("prometheus/backup-alerts.yml");
    let alerts = read("prometheus/alerts.yml");
    for alert in ["TokenBillingBackupTooOld", "TokenBillingWalArchiveStale"] {
        assert!(
            backup_alerts.contains(&format!("alert: {alert}")),
            "{alert}"
        );
        assert!(!alerts.contains(alert), "{alert} is loaded by compose");
    }
    assert!(read("docker-compose.yml").contains("prometheus/backup-alerts.yml"));

    // Environment names are the service's configuration variables.
    let command = Cli::command();
    let serve = command.find_subcommand("serve").expect("serve");
    let known: BTreeSet<String> = command
        .get_arguments()
        .chain(serve.get_arguments())
        .filter_map(|argument| {
            argument
                .get_env()
                .map(|env| env.to_string_lossy().into_owned())
        })
        .collect();
    let environment = service["environment"].as_hash().expect("environment");
    for key in environment.keys() {
        let key = key.as_str().expect("name");
        assert!(
            known.contains(key),
            "compose sets {key}, which the service does not read"
        );
    }
    let env = |name: &str| {
        service["environment"][name]
            .as_str()
            .unwrap_or_else(|| panic!("{name}"))
            .to_owned()
    };

    // Ports: the bind address, the published port, the image and the scrape.
    let port = env("BIND_ADDR")
        .rsplit(':')
        .next()
        .expect("port")
        .to_owned();
    assert_eq!(container_port(service), port);
    assert!(read("Dockerfile").contains(&format!("EXPOSE {port}")));
    let prometheus_config = yaml("prometheus/prometheus.yml");
    let scrape = &prometheus_config["scrape_configs"][0];
    assert_eq!(
        scrape["job_name"].as_str(),
        Some("token-billing"),
        "the alerts select job=\"token-billing\""
    );
    assert!(read("prometheus/alerts.yml").contains("job=\"token-billing\""));
    let target = &scrape["dns_sd_configs"][0];
    assert_eq!(strings(&target["names"]), vec!["token-billing".to_owned()]);
    assert_eq!(target["port"].as_i64().map(|p| p.to_string()), Some(port));

    // The database URL names the postgres service and its database.
    let database_url = env("DATABASE_URL");
    let postgres = &services["postgres"];
    let database = postgres["environment"]["POSTGRES_DB"]
        .as_str()
        .expect("POSTGRES_DB");
    assert!(database_url.contains("@postgres:5432/"), "{database_url}");
    assert!(
        database_url.ends_with(&format!("/{database}")),
        "{database_url}"
    );

    // Every mounted file exists, and the configs point at the mount targets.
    for name in ["prometheus", "grafana"] {
        for (host, _) in mounts(&services[name]) {
            assert!(
                repository_file(&host).exists(),
                "{name} mounts {host}, which is not in the repository"
            );
        }
    }
    let rule_files = strings(&prometheus_config["rule_files"]);
    let prometheus_mounts = mounts(&services["prometheus"]);
    for rule_file in &rule_files {
        assert!(
            prometheus_mounts.iter().any(
                |(host, container)| container == rule_file && host == "./prometheus/alerts.yml"
            ),
            "{rule_file} is mounted from prometheus/alerts.yml"
        );
    }
    let grafana_mounts = mounts(&services["grafana"]);
    let provider = yaml("grafana/provisioning/dashboards/dashboards.yml");
    let dashboards_path = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("path")
        .to_owned();
    assert!(grafana_mounts
        .iter()
        .any(|(host, container)| host == "./grafana/dashboard.json"
            && container.starts_with(&format!("{dashboards_path}/"))));
    let datasource = yaml("grafana/provisioning/datasources/prometheus.yml");
    let url = datasource["datasources"][0]["url"]
        .as_str()
        .expect("url")
        .to_owned();
    assert_eq!(
        url,
        format!(
            "http://prometheus:{}",
            container_port(&services["prometheus"])
        )
    );
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

/// A newcomer's compose: the service can be scaled (no fixed host port in
/// the base file), the fixed-port override parses, the README's admin key
/// works against compose as it is, and the build context leaves out the
/// repository's history and build output.
#[test]
fn compose_scales_and_tells_one_admin_key_story() {
    let compose = yaml("docker-compose.yml");
    let service = &compose["services"]["token-billing"];
    for port in strings(&service["ports"]) {
        // `127.0.0.1::8080`: loopback, with the host port left to Docker.
        let host_port = port.split(':').nth(1).unwrap_or_default();
        assert!(
            port.starts_with("127.0.0.1:") && host_port.is_empty(),
            "token-billing publishes {port}: it must be loopback with no fixed host port \
             (replicas of a scaled service would collide)"
        );
    }
    let fixed = yaml("docker-compose.fixed-port.yml");
    assert_eq!(
        strings(&fixed["services"]["token-billing"]["ports"]),
        vec!["127.0.0.1:8080:8080".to_owned()]
    );

    // One admin key story: compose has no default key (it must be set in
    // .env, which .env.example explains), and the README says so, next to
    // the key its first session uses against `cargo run`.
    let admin_key = service["environment"]["ADMIN_API_KEY"]
        .as_str()
        .expect("ADMIN_API_KEY");
    assert!(
        admin_key.starts_with("${ADMIN_API_KEY:?"),
        "ADMIN_API_KEY must be required, with no default: {admin_key}"
    );
    let readme = read("README.md");
    let example = read(".env.example");
    assert!(
        example.contains("ADMIN_API_KEY="),
        ".env.example lists ADMIN_API_KEY"
    );
    let first_session_key = "dev-admin-key-change-me";
    assert!(
        readme.contains(&format!(
            "ADMIN_API_KEY={first_session_key} cargo run --release -- serve"
        )) && readme.contains(&format!("Authorization: Bearer {first_session_key}")),
        "the README's first session uses one admin key"
    );
    assert!(
        readme.contains(".env.example") && readme.contains("`ADMIN_API_KEY` from `.env`"),
        "the README tells compose users where the admin key comes from"
    );

    let ignored: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for needed in [".git", "target/"] {
        assert!(
            ignored.iter().any(|line| line == needed),
            ".dockerignore lacks {needed}"
        );
    }
    // What the Dockerfile copies must not be ignored.
    for line in read("Dockerfile").lines() {
        if let Some(sources) = line
            .strip_prefix("COPY ")
            .filter(|l| !l.starts_with("--from"))
        {
            let mut parts: Vec<&str> = sources.split_whitespace().collect();
            parts.pop();
            for source in parts {
                assert!(
                    !ignored
                        .iter()
                        .any(|line| line.trim_end_matches('/') == source),
                    ".dockerignore leaves out {source}, which the Dockerfile copies"
                );
            }
        }
    }
}
