//! The address throttle has no way around it (issue 36, findings 1–5):
//! the bootstrap admin key is throttled like every key; the path the
//! throttle, the metrics and the idempotency scopes see is the path the
//! router routes; a kiosk in use is never locked out by a neighbour; a
//! full failure table still blocks (and, since issue 56, newcomers share
//! one count past it); IPv6 clients are counted per /64; every
//! forwarding header line is read, hops with ports included.

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{made_up_key, problem, TestApp, ADMIN_KEY};

/// A GET with `key`, and each of `forwarded` as one header line of its
/// name (`x-forwarded-for` or `forwarded`).
async fn get_from(
    app: &TestApp,
    path: &str,
    key: Option<&str>,
    forwarded: &[(&str, &str)],
) -> StatusCode {
    let mut request = app.client.get(app.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    for (name, value) in forwarded {
        // `header` appends: several lines of one header.
        request = request.header(*name, *value);
    }
    request.send().await.expect("request sent").status()
}

/// Statuses of `n` made-up keys sent one after another from `forwarded`.
async fn guesses_from(app: &TestApp, n: usize, forwarded: &[(&str, &str)]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let status = get_from(app, "/v1/accounts", Some(&made_up_key()), forwarded).await;
        statuses.push(status.as_u16());
    }
    statuses
}

const BEHIND_THE_PROXY: &[&str] = &[
    "--auth-failure-burst",
    "3",
    "--auth-failures-per-minute",
    "1",
    "--trusted-proxies",
    "127.0.0.1/32",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_admin_key_is_throttled_like_every_key() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
    })
    .await;
    for n in 0..3 {
        let guess = format!("guess-{n}-0123456789abcdef");
        assert_eq!(
            get_from(&app, "/v1/accounts", Some(&guess), &[]).await,
            StatusCode::UNAUTHORIZED
        );
    }
    // A blocked address learns nothing: the right key is refused like a
    // wrong one, before any comparison is answered.
    let response = app
        .client
        .get(app.url("/v1/accounts"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited")),
        "the bootstrap key from a blocked address: {body}"
    );

    // Guesses sent at once are counted before any is answered: exactly
    // the burst is answered 401.
    let fresh = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
    })
    .await;
    let statuses: Vec<u16> = join_all((0..24).map(|n| {
        let guess = format!("concurrent-guess-{n}-0123456789");
        let fresh = &fresh;
        async move {
            get_from(fresh, "/v1/accounts", Some(&guess), &[])
                .await
                .as_u16()
        }
    }))
    .await;
    assert_eq!(
        statuses.iter().filter(|status| **status == 401).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|status| **status == 429).count(),
        21,
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_path_is_the_path_the_throttle_and_the_metrics_see() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let status = get_from(&app, "/%761/me", Some(&made_up_key()), &[]).await;
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429]);
    let metrics = app.metrics_text().await;
    let unmatched: Vec<&str> = metrics
        .lines()
        .filter(|line| line.contains("route=\"unmatched\""))
        .collect();
    assert!(unmatched.is_empty(), "{unmatched:?}");
    assert!(metrics.contains("route=\"/v1/me\""), "{metrics}");

    // Any other escape is refused, before routing, as problem+json.
    let app = TestApp::spawn().await;
    for refused in [
        "/v1/accounts%2Fx",
        "/v1/%25",
        "/%2576%2531/me",
        "/v1/%C3%A9",
    ] {
        let response = app
            .client
            .get(app.url(refused))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .expect("sent");
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{refused}: {body}"
        );
    }
    // A decoded path is served as the plain one.
    assert_eq!(
        get_from(&app, "/%761/reconciliation", Some(ADMIN_KEY), &[]).await,
        StatusCode::OK
    );
}

async fn post_once(app: &TestApp, path: &str, idempotency_key: &str, body: &Value) -> Value {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(ADMIN_KEY)
        .header("idempotency-key", idempotency_key)
        .json(body)
        .send()
        .await
        .expect("sent");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_is_one_idempotency_scope_however_it_is_spelled() {
    let app = TestApp::spawn().await;
    let body = json!({"name": "Booth 7"});
    let mut accounts = Vec::new();
    for path in ["/v1/accounts", "/%761/accounts", "/v1/%61ccounts"] {
        let created = post_once(&app, path, "one-account-please", &body).await;
        accounts.push(created["account_id"].as_str().expect("id").to_owned());
    }
    accounts.dedup();
    assert_eq!(accounts.len(), 1, "one key, one account: {accounts:?}");

    let account = &accounts[0];
    let upper = account.to_ascii_uppercase();
    let body = json!({"scope": "kiosk", "label": "kiosk 1"});
    let mut keys = Vec::new();
    for path in [
        format!("/v1/accounts/{account}/api-keys"),
        format!("/v1/accounts/{upper}/api-keys"),
    ] {
        let created = post_once(&app, &path, "one-kiosk-key-please", &body).await;
        keys.push(created["key_id"].as_str().expect("key id").to_owned());
    }
    keys.dedup();
    assert_eq!(keys.len(), 1, "one key, one kiosk key: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kiosk_in_use_is_never_locked_out_by_a_neighbour() {
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--auth-verified-key-memory-seconds", "2"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let venue = [("x-forwarded-for", "203.0.113.5")];
    let path = format!("/v1/accounts/{account}");
    assert_eq!(
        get_from(&app, &path, Some(&kiosk), &venue).await,
        StatusCode::OK
    );
    // A guest behind the venue's address guesses keys: the address is
    // blocked.
    assert_eq!(guesses_from(&app, 4, &venue).await, [401, 401, 401, 429]);
    // The kiosk keeps spending for twice the memory's lifetime: each of
    // its requests proves its key again.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        let status = app
            .client
            .post(app.url(&format!("/v1/accounts/{account}/reservations")))
            .bearer_auth(&kiosk)
            .header("x-forwarded-for", "203.0.113.5")
            .json(&json!({"request_id": Uuid::new_v4(), "amount": 1}))
            .send()
            .await
            .expect("sent")
            .status();
        statuses.push(status.as_u16());
        assert_eq!(guesses_from(&app, 1, &venue).await, [429]);
    }
    assert_eq!(statuses, [201; 6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_failure_table_still_blocks() {
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--auth-failure-tracked-max", "100"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let busy = [("x-forwarded-for", "198.51.100.7")];
    assert_eq!(guesses_from(&app, 4, &busy).await, [401, 401, 401, 429]);
    // Requests with no key, from four times as many addresses as the
    // table holds, are never counted (issue 56): the table stays as it was.
    for chunk in 0..8_u32 {
        join_all((0..50_u32).map(|n| {
            let address = format!("10.0.{chunk}.{n}");
            let app = &app;
            async move {
                let status =
                    get_from(app, "/v1/accounts", None, &[("x-forwarded-for", &address)]).await;
                assert_eq!(status, StatusCode::UNAUTHORIZED);
            }
        }))
        .await;
    }
    assert_eq!(app.state.auth_guard.tracked().0, 1);
    // Made-up keys from as many addresses: the table fills up, and past
    // it the newcomers share one count, which they soon spend.
    for chunk in 0..8_u32 {
        join_all((0..50_u32).map(|n| {
            let address = format!("10.1.{chunk}.{n}");
            let app = &app;
            async move { guesses_from(app, 1, &[("x-forwarded-for", &address)]).await }
        }))
        .await;
    }
    assert_eq!(app.state.auth_guard.tracked().0, 100);
    assert_eq!(
        guesses_from(&app, 1, &busy).await,
        [429],
        "the busiest offender is still blocked"
    );
    let fresh = [("x-forwarded-for", "192.0.2.77")];
    assert_eq!(
        guesses_from(&app, 1, &fresh).await,
        [429],
        "a new client shares the newcomers' spent count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_are_counted_per_64() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
        config.trusted_proxies = "127.0.0.1/32".into();
    })
    .await;
    let mut statuses = Vec::new();
    for host in 1..=4 {
        let address = format!("2001:db8:7:7::{host}");
        statuses.extend(guesses_from(&app, 1, &[("x-forwarded-for", &address)]).await);
    }
    assert_eq!(statuses, [401, 401, 401, 429], "one /64 is one client");
    assert_eq!(
        guesses_from(&app, 1, &[("x-forwarded-for", "2001:db8:7:8::1")]).await,
        [401],
        "the next /64 is another"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarded_for_line_is_read_and_hops_with_ports_are_parsed() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
        config.trusted_proxies = "127.0.0.1/32".into();
    })
    .await;
    // The client writes a new first line each time; the proxy adds its own
    // line (HAProxy's `option forwardfor`): the client is the right-most.
    let mut statuses = Vec::new();
    for n in 0..4 {
        let forged = format!("198.51.100.{n}");
        statuses.extend(
            guesses_from(
                &app,
                1,
                &[
                    ("x-forwarded-for", &forged),
                    ("x-forwarded-for", "192.0.2.44"),
                ],
            )
            .await,
        );
    }
    assert_eq!(statuses, [401, 401, 401, 429]);

    // Hops with ports: each client is itself, not the proxy.
    let first = guesses_from(&app, 4, &[("x-forwarded-for", "8.8.4.4:1234")]).await;
    assert_eq!(first, [401, 401, 401, 429]);
    assert_eq!(
        guesses_from(&app, 1, &[("x-forwarded-for", "8.8.8.8:1234")]).await,
        [401],
        "another client behind the same proxy"
    );
    let v6 = guesses_from(&app, 4, &[("x-forwarded-for", "[2001:db8:9::1]:443")]).await;
    assert_eq!(v6, [401, 401, 401, 429]);
    assert_eq!(
        guesses_from(&app, 1, &[("x-forwarded-for", "[2001:db8:a::1]:443")]).await,
        [401]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarded_header_is_read_the_same_way_when_configured() {
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--forwarded-header", "forwarded"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let mut statuses = Vec::new();
    for n in 0..4 {
        let forged = format!("for=198.51.100.{n}");
        statuses.extend(
            guesses_from(
                &app,
                1,
                &[
                    ("forwarded", &forged),
                    ("forwarded", "for=\"[2001:db8:5::1]:4711\";proto=https"),
                ],
            )
            .await,
        );
    }
    assert_eq!(statuses, [401, 401, 401, 429]);
    assert_eq!(
        guesses_from(&app, 1, &[("forwarded", "for=192.0.2.9")]).await,
        [401]
    );
    // X-Forwarded-For is not read then: varying it changes nothing.
    let same = [
        ("forwarded", "for=192.0.2.10"),
        ("x-forwarded-for", "198.51.100.99"),
    ];
    assert_eq!(guesses_from(&app, 4, &same).await, [401, 401, 401, 429]);
}
