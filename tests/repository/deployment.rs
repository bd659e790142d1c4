//! The compose file and the image are safe to run as shipped: nothing is
//! published beyond this machine, no secret has a default, Docker waits
//! longer than the service's shutdown grace, the dependencies build in a
//! cached layer of their own, every variable compose reads is in
//! `.env.example`, and no tool's default port clashes with compose's. No
//! Docker engine is needed: the files are read as YAML and text.

use std::collections::BTreeMap;
use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

fn yaml(relative: &str) -> Yaml {
    YamlLoader::load_from_str(&read(relative))
        .expect("valid YAML")
        .remove(0)
}

/// Every service's `ports` entries, by service.
fn published_ports(compose: &Yaml) -> BTreeMap<String, Vec<String>> {
    compose["services"]
        .as_hash()
        .expect("services")
        .iter()
        .map(|(name, service)| {
            let ports = service["ports"]
                .as_vec()
                .map(|ports| {
                    ports
                        .iter()
                        .map(|port| port.as_str().expect("ports are strings").to_owned())
                        .collect()
                })
                .unwrap_or_default();
            (name.as_str().expect("name").to_owned(), ports)
        })
        .collect()
}

/// `"45s"`, `"1m30s"`, `"2m"` → seconds.
fn duration_seconds(text: &str) -> u64 {
    let mut seconds = 0;
    let mut number = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' => number.push(c),
            'h' | 'm' | 's' => {
                let value: u64 = number.parse().expect("a number before the unit");
                seconds += value
                    * match c {
                        'h' => 3600,
                        'm' => 60,
                        _ => 1,
                    };
                number.clear();
            }
            other => panic!("unexpected {other:?} in duration {text:?}"),
        }
    }
    assert!(number.is_empty(), "{text:?} ends without a unit");
    seconds
}

#[test]
fn compose_publishes_on_loopback_only_and_has_no_default_secrets() {
    for file in ["docker-compose.yml", "docker-compose.fixed-port.yml"] {
        let compose = yaml(file);
        for (service, ports) in published_ports(&compose) {
            for port in ports {
                assert!(
                    port.starts_with("127.0.0.1:"),
                    "{file}: {service} publishes {port:?} beyond this machine"
                );
            }
        }
    }
    let compose = yaml("docker-compose.yml");
    let services = &compose["services"];
    for (service, variable, value) in [
        (
            "token-billing",
            "ADMIN_API_KEY",
            &services["token-billing"]["environment"]["ADMIN_API_KEY"],
        ),
        (
            "grafana",
            "GRAFANA_ADMIN_PASSWORD",
            &services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"],
        ),
    ] {
        let value = value
            .as_str()
            .unwrap_or_else(|| panic!("{service}: {variable} set"));
        assert!(
            value.starts_with(&format!("${{{variable}:?")),
            "{service}: {value:?} must require {variable} with no default (`${{{variable}:?…}}`)"
        );
    }
}

#[test]
fn docker_waits_longer_than_the_shutdown_grace() {
    let compose = yaml("docker-compose.yml");
    let service = &compose["services"]["token-billing"];
    let grace: u64 = service["environment"]["SHUTDOWN_GRACE_SECONDS"]
        .as_str()
        .expect("compose sets SHUTDOWN_GRACE_SECONDS")
        .parse()
        .expect("seconds");
    let stop = duration_seconds(
        service["stop_grace_period"]
            .as_str()
            .expect("token-billing has a stop_grace_period"),
    );
    // The grace is for jobs; the HTTP server drains after it.
    assert!(
        stop >= grace + 5,
        "stop_grace_period {stop}s must exceed SHUTDOWN_GRACE_SECONDS {grace}s by 5 s at least"
    );
}

#[test]
fn every_variable_compose_reads_is_in_the_env_example_and_env_is_ignored() {
    let example = read(".env.example");
    let listed: Vec<&str> = example
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim()))
        .collect();
    for file in ["docker-compose.yml", "docker-compose.fixed-port.yml"] {
        let text = read(file);
        for (index, _) in text.match_indices("${") {
            let name: String = text[index + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                listed.contains(&name.as_str()),
                "{file} reads {name}, which .env.example does not list"
            );
        }
    }
    for (file, secret) in [
        (".env.example", "ADMIN_API_KEY="),
        (".env.example", "GRAFANA_ADMIN_PASSWORD="),
    ] {
        let line = example
            .lines()
            .find(|line| line.starts_with(secret))
            .unwrap_or_else(|| panic!("{file} lists {secret}"));
        assert_eq!(line, secret, "{file} must not ship a value for a secret");
    }
    for ignore in [".gitignore", ".dockerignore"] {
        assert!(
            read(ignore).lines().any(|line| line.trim() == ".env"),
            "{ignore} must ignore .env"
        );
    }
}

#[test]
fn no_tool_listens_on_a_port_compose_publishes() {
    let mut host_ports: BTreeMap<String, String> = BTreeMap::new();
    for file in ["docker-compose.yml", "docker-compose.fixed-port.yml"] {
        for (service, ports) in published_ports(&yaml(file)) {
            for port in ports {
                // 127.0.0.1:HOST:CONTAINER; an empty HOST is Docker's pick.
                let host = port.split(':').nth(1).expect("host port").to_owned();
                if host.is_empty() {
                    continue;
                }
                if let Some(other) = host_ports.insert(host.clone(), service.clone()) {
                    assert_eq!(other, service, "{other} and {service} both publish {host}");
                }
            }
        }
    }
    let fake_provider_port = token_billing_tools::fake_provider::DEFAULT_BIND
        .rsplit(':')
        .next()
        .expect("port");
    assert!(
        !host_ports.contains_key(fake_provider_port),
        "the fake provider's default port {fake_provider_port} is published by {}",
        host_ports[fake_provider_port]
    );
}

#[test]
fn the_image_builds_its_dependencies_in_a_cached_layer_of_their_own() {
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .collect();
    let position = |what: &dyn Fn(&str) -> bool| lines.iter().position(|line| what(line));
    let manifests = position(&|line| line.starts_with("COPY Cargo.toml Cargo.lock"))
        .expect("the manifests are copied on their own");
    let sources = position(&|line| line.starts_with("COPY src")).expect("COPY src");
    let builds: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("cargo build --release --locked"))
        .map(|(index, _)| index)
        .collect();
    assert!(
        builds.iter().any(|&build| manifests < build && build < sources),
        "a `cargo build --locked` between copying the manifests and copying src/ (the cached dependency layer)"
    );
    assert!(
        builds.iter().any(|&build| build > sources),
        "the project itself is built after src/ is copied"
    );
}
