//! The compose files agree with the code and the repository: services,
//! health checks, mounts, ports, the admin key's one story, and what the
//! image's build context leaves out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use yaml_rust2::{Yaml, YamlLoader};

use token_billing::cli::Cli;

fn repository_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repository_file(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
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
    // What the Dockerfile copies must not be ignored: not by its own line,
    // nor by a directory above it (`bench/`, `bench/*`), unless a later
    // `!` line takes it back (the last line that matches decides).
    let left_out = |source: &str| {
        let mut out = false;
        for line in &ignored {
            let (back, pattern) = match line.strip_prefix('!') {
                Some(pattern) => (true, pattern),
                None => (false, line.as_str()),
            };
            let pattern = pattern.trim_end_matches('/');
            let directory = pattern.strip_suffix("/*").unwrap_or(pattern);
            if source == pattern || source.starts_with(&format!("{directory}/")) {
                out = !back;
            }
        }
        out
    };
    for line in read("Dockerfile").lines() {
        if let Some(sources) = line
            .strip_prefix("COPY ")
            .filter(|l| !l.starts_with("--from"))
        {
            let mut parts: Vec<&str> = sources.split_whitespace().collect();
            parts.pop();
            for source in parts {
                assert!(
                    !left_out(source.trim_end_matches('/')),
                    ".dockerignore leaves out {source}, which the Dockerfile copies"
                );
            }
        }
    }
}
