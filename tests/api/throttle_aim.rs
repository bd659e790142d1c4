//! The address throttle can be neither reset nor aimed (issue 56, findings
//! 2, 3 and 5): filling the failure table never unblocks a blocked address
//! (new addresses share one bucket instead, which a remembered key passes);
//! requests with no key never count, so a web page cannot lock out a
//! venue's kiosks; the memory of verified keys is sized apart from the
//! failure table; a malformed forwarding hop (a non-ASCII byte, garbage) is
//! skipped, so the client the trusted proxy names is charged, never the
//! proxy.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::header::HeaderValue;

use crate::helpers::{made_up_key, TestApp};

/// The statuses of `keys` sent one after another with each of
/// `forwarded` as one header line (name, raw bytes).
async fn statuses(
    app: &TestApp,
    path: &str,
    keys: &[Option<&str>],
    forwarded: &[(&str, &[u8])],
) -> Vec<u16> {
    let mut statuses = Vec::new();
    for key in keys {
        let mut request = app.client.get(app.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        for (name, value) in forwarded {
            let value = HeaderValue::from_bytes(value).expect("a header value");
            request = request.header(*name, value);
        }
        statuses.push(request.send().await.expect("sent").status().as_u16());
    }
    statuses
}

/// `n` made-up keys from the client `forwarded` names.
async fn guesses(app: &TestApp, n: usize, forwarded: &[(&str, &[u8])]) -> Vec<u16> {
    let keys: Vec<String> = (0..n).map(|_| made_up_key()).collect();
    let keys: Vec<Option<&str>> = keys.iter().map(|key| Some(key.as_str())).collect();
    statuses(app, "/v1/accounts", &keys, forwarded).await
}

/// `n` made-up keys from `address`, behind the trusted proxy.
async fn guesses_from(app: &TestApp, n: usize, address: &str) -> Vec<u16> {
    guesses(app, n, &[("x-forwarded-for", address.as_bytes())]).await
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
async fn filling_the_failure_table_never_unblocks_a_blocked_address() {
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--auth-failure-tracked-max", "100"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let account = app.funded_account(10).await;
    let in_use = app.kiosk_key(account).await;
    let unused = app.kiosk_key(account).await;
    let path = format!("/v1/accounts/{account}");
    let kiosk = |key: &str, address: &str| {
        let key = key.to_owned();
        let address = address.to_owned();
        let (app, path) = (&app, &path);
        async move {
            statuses(
                app,
                path,
                &[Some(&key)],
                &[("x-forwarded-for", address.as_bytes())],
            )
            .await[0]
        }
    };
    assert_eq!(kiosk(&in_use, "203.0.113.1").await, 200);

    // The guesser is blocked first, so it is the entry that has drained
    // the most when the table fills up.
    assert_eq!(
        guesses_from(&app, 4, "198.51.100.1").await,
        [401, 401, 401, 429]
    );
    // 99 other addresses are blocked too: the table (100) is full of
    // blocked addresses.
    for chunk in 0..9_u32 {
        join_all((0..11_u32).map(|n| {
            let address = format!("10.0.{chunk}.{n}");
            let app = &app;
            async move {
                assert_eq!(
                    guesses_from(app, 4, &address).await,
                    [401, 401, 401, 429],
                    "{address}"
                );
            }
        }))
        .await;
    }
    // New addresses find the table full.
    let mut new_addresses = Vec::new();
    for n in 0..4 {
        new_addresses.extend(guesses_from(&app, 1, &format!("192.0.2.{n}")).await);
    }
    assert_eq!(
        guesses_from(&app, 1, "198.51.100.1").await,
        [429],
        "the first address blocked is still blocked"
    );
    // They share one bucket of the burst (3), then fail closed...
    assert_eq!(new_addresses, [401, 401, 401, 429]);
    assert_eq!(guesses_from(&app, 1, "192.0.2.200").await, [429]);
    assert_eq!(kiosk(&unused, "203.0.113.2").await, 429);
    // ...but only for addresses the table does not hold and keys this
    // replica does not remember: a kiosk in use keeps working from
    // anywhere.
    assert_eq!(kiosk(&in_use, "203.0.113.3").await, 200);
    assert_eq!(kiosk(&in_use, "192.0.2.201").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_traffic_never_locks_out_a_kiosk() {
    // The defaults (20 failures at once, 10 a minute), behind a proxy.
    let app = TestApp::spawn_with_flags(&[
        "--auth-failure-burst",
        "20",
        "--auth-failures-per-minute",
        "10",
        "--trusted-proxies",
        "127.0.0.1/32",
    ])
    .await;
    let account = app.funded_account(10).await;
    // A kiosk this replica has not seen yet (as after a restart, or after
    // AUTH_VERIFIED_KEY_MEMORY_SECONDS idle).
    let kiosk = app.kiosk_key(account).await;
    let path = format!("/v1/accounts/{account}");
    let venue: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.5")];
    // A web page on a guest's phone behind the venue's address: 60
    // requests a second with no Authorization header (fetch no-cors,
    // <img>), for four seconds; the kiosk polls four times a second from
    // the second second on.
    let mut anonymous = Vec::new();
    let mut polls = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    for quarter in 0..16 {
        tick.tick().await;
        let page = join_all((0..15).map(|_| statuses(&app, &path, &[None], venue))).await;
        anonymous.extend(page.into_iter().flatten());
        if quarter >= 4 {
            polls.extend(statuses(&app, &path, &[Some(&kiosk)], venue).await);
        }
    }
    assert_eq!(polls, [200; 12], "the kiosk's polls");
    assert_eq!(
        anonymous, [401; 240],
        "requests with no key are not counted"
    );
    // A guest who does send keys is still throttled, and the kiosk still
    // passes the blocked address.
    assert_eq!(
        guesses(&app, 21, venue).await[19..],
        [401, 429],
        "the 20th failure blocks the address"
    );
    assert_eq!(statuses(&app, &path, &[Some(&kiosk)], venue).await, [200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_memory_is_sized_apart_from_the_failure_table() {
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--auth-failure-tracked-max", "100"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let account = app.funded_account(10).await;
    let path = format!("/v1/accounts/{account}");
    // 110 booths behind one venue address, each in use.
    let mut kiosks = Vec::new();
    for _ in 0..110 {
        kiosks.push(app.kiosk_key(account).await);
    }
    let venue: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.9")];
    let keys: Vec<Option<&str>> = kiosks.iter().map(|key| Some(key.as_str())).collect();
    assert_eq!(statuses(&app, &path, &keys, venue).await, [200; 110]);
    // A guest blocks the venue's address.
    assert_eq!(guesses(&app, 4, venue).await, [401, 401, 401, 429]);
    // Every booth is remembered, however small the failure table.
    let refused: Vec<usize> = statuses(&app, &path, &keys, venue)
        .await
        .iter()
        .enumerate()
        .filter(|(_, status)| **status != 200)
        .map(|(booth, _)| booth)
        .collect();
    assert_eq!(refused, Vec::<usize>::new(), "booths refused");
}

/// nginx's `$proxy_add_x_forwarded_for`: whatever the client sent, then
/// the address the proxy saw.
fn appended(client_sent: &[u8], real_client: &str) -> Vec<u8> {
    let mut line = client_sent.to_vec();
    line.extend_from_slice(b", ");
    line.extend_from_slice(real_client.as_bytes());
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_x_forwarded_for_hop_charges_the_real_client_not_the_proxy() {
    let app = TestApp::spawn_with_flags(BEHIND_THE_PROXY).await;
    // A non-ASCII byte and garbage in what the client sent.
    let junk: &[u8] = b"\xff\xfe, not an address, \"[::1";
    for client in ["192.0.2.50", "192.0.2.51"] {
        let line = appended(junk, client);
        assert_eq!(
            guesses(&app, 4, &[("x-forwarded-for", &line)]).await,
            [401, 401, 401, 429],
            "the client behind the proxy, {client}, is charged"
        );
        // The proxy's own address is never charged.
        assert_eq!(guesses(&app, 1, &[]).await, [401], "the proxy itself");
    }
    // A junk line of its own, before the proxy's (HAProxy adds a line).
    let client_line: &[u8] = b"caf\xc3\xa9";
    assert_eq!(
        guesses(
            &app,
            4,
            &[
                ("x-forwarded-for", client_line),
                ("x-forwarded-for", b"192.0.2.52")
            ]
        )
        .await,
        [401, 401, 401, 429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_forwarded_element_charges_the_real_client_not_the_proxy() {
    // RFC 7239 `Forwarded`, the proxy appending its element: the junk
    // carries a non-ASCII byte, an unclosed quote and a broken element.
    let mut flags = BEHIND_THE_PROXY.to_vec();
    flags.extend(["--forwarded-header", "forwarded"]);
    let app = TestApp::spawn_with_flags(&flags).await;
    let junk: &[u8] = b"for=\"\xff;proto=\xe2\x80\x8b, for=_hidden;garbage";
    for client in ["for=192.0.2.60", "for=\"[2001:db8:60::1]:4711\""] {
        let line = appended(junk, client);
        assert_eq!(
            guesses(&app, 4, &[("forwarded", &line)]).await,
            [401, 401, 401, 429],
            "the client behind the proxy, {client}, is charged"
        );
        assert_eq!(guesses(&app, 1, &[]).await, [401], "the proxy itself");
    }
}
