//! Authentication failures are throttled per client address, before any
//! lookup: made-up keys from one address get 429 after a small burst, while
//! a valid key from the same address keeps working; `X-Forwarded-For` is
//! believed only from a trusted proxy.

use reqwest::StatusCode;

use crate::helpers::{made_up_key, problem, TestApp};

async fn status_with(
    app: &TestApp,
    path: &str,
    key: &str,
    forwarded_for: Option<&str>,
) -> StatusCode {
    let mut request = app.client.get(app.url(path)).bearer_auth(key);
    if let Some(forwarded_for) = forwarded_for {
        request = request.header("x-forwarded-for", forwarded_for);
    }
    request.send().await.expect("request sent").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_keys_are_throttled_per_address_and_a_valid_key_still_works() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 10;
        config.auth_failures_per_minute = 1;
    })
    .await;
    let account = app.funded_account(3).await;
    let kiosk = app.kiosk_key(account).await;
    let path = format!("/v1/accounts/{account}");
    assert_eq!(status_with(&app, &path, &kiosk, None).await, StatusCode::OK);

    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(status_with(&app, &path, &made_up_key(), None).await);
    }
    let unauthorized = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    let throttled = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    // AUTH_FAILURE_BURST failures, and the next request is throttled.
    assert_eq!(
        unauthorized, 10,
        "a burst of failures, then throttled: {statuses:?}"
    );
    assert_eq!(throttled, 30, "{statuses:?}");
    // The throttled answers are problem+json with Retry-After.
    let response = app
        .client
        .get(app.url(&path))
        .bearer_auth(made_up_key())
        .send()
        .await
        .expect("sent");
    assert!(response.headers().get("retry-after").is_some());
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
    );
    // The valid key from the same address still works.
    assert_eq!(status_with(&app, &path, &kiosk, None).await, StatusCode::OK);
    // The throttled requests never reached the database: counted apart.
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("token_billing_auth_failures_total{outcome=\"throttled\"} 31"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("auth_failures"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("token_billing_auth_failures_total{outcome=\"unauthorized\"} 10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_is_honoured_from_a_trusted_proxy_only() {
    // The test client connects from 127.0.0.1.
    let trusted = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
        config.trusted_proxies = "127.0.0.1/32".into();
    })
    .await;
    let path = "/v1/accounts";
    for _ in 0..4 {
        status_with(&trusted, path, &made_up_key(), Some("192.0.2.10")).await;
    }
    assert_eq!(
        status_with(&trusted, path, &made_up_key(), Some("192.0.2.10")).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the forwarded client is throttled"
    );
    assert_eq!(
        status_with(&trusted, path, &made_up_key(), Some("192.0.2.11")).await,
        StatusCode::UNAUTHORIZED,
        "another client behind the same proxy is not"
    );

    let untrusted = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 3;
        config.auth_failures_per_minute = 1;
    })
    .await;
    // Without a trusted proxy the header is ignored: varying it does not
    // escape the throttle of the real peer address.
    for n in 0..4 {
        status_with(
            &untrusted,
            path,
            &made_up_key(),
            Some(&format!("192.0.2.{n}")),
        )
        .await;
    }
    assert_eq!(
        status_with(&untrusted, path, &made_up_key(), Some("192.0.2.99")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
