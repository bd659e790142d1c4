//! The security suite: each case of the second security review (issue 27),
//! black-box against the real service over real HTTP.
//!
//! 1. A key's id is no handle on the key: a flood of `tbk_<its id>_<made-up
//!    secret>` costs the key nothing, gets past no throttle, and kiosks
//!    never see another key's id.
//! 2. No webhook URL's secret parts in the audit log or the event feed.
//! 3. The address guard knows every IPv6 spelling of a private address.
//! 4. Deliveries ignore `HTTP_PROXY`; only `WEBHOOK_PROXY` sets a proxy.
//! 5. A long poll opened before a revocation answers 401.
//! 6. Account names people can trust; the throttle speaks of addresses
//!    and blocks at its configured count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::crash::start_service_with;
use crate::helpers::{eventually, problem, FakeProvider, TestApp, TestDatabase, ADMIN_KEY};
use crate::receiver::Receiver;

/// A key with this key's id and a made-up secret.
fn same_id_made_up_secret(key: &str) -> String {
    let id = key_id(key);
    format!(
        "tbk_{}_{}{}",
        id.simple(),
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )
}

fn key_id(key: &str) -> Uuid {
    key.strip_prefix("tbk_")
        .and_then(|rest| rest.split_once('_'))
        .and_then(|(id, _)| id.parse().ok())
        .expect("a tbk_ key")
}

fn made_up_key() -> String {
    same_id_made_up_secret(&format!("tbk_{}_x", Uuid::new_v4().simple()))
}

async fn status_of(app: &TestApp, path: &str, key: &str) -> StatusCode {
    app.get(path, key).await.status()
}

async fn admin_key(app: &TestApp, label: &str) -> String {
    let response = app
        .post(
            "/v1/api-keys",
            ADMIN_KEY,
            &json!({"scope": "admin", "label": label}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    body["key"].as_str().expect("key").to_owned()
}

async fn reserve_status(app: &TestApp, account: Uuid, key: &str) -> StatusCode {
    app.post(
        &format!("/v1/accounts/{account}/reservations"),
        key,
        &json!({"request_id": Uuid::new_v4(), "amount": 1}),
    )
    .await
    .status()
}

fn counter(metrics: &str, outcome: &str) -> u64 {
    let prefix = format!("token_billing_auth_failures_total{{outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.trim().parse().expect("a count"))
}

// --- 1. A key's id is not a handle on it ---------------------------------

/// Before: the bucket of a key was charged by the id, before its secret
/// was checked, so 4 of a kiosk's next 5 reservations answered 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_a_keys_id_does_not_rate_limit_the_key() {
    let app = TestApp::spawn_with(|config| {
        config.rate_limit_per_second = 1;
        config.rate_limit_burst = 12;
    })
    .await;
    let account = app.funded_account(100).await;
    let kiosk = app.kiosk_key(account).await;
    let admin = admin_key(&app, "front desk").await;
    let path = format!("/v1/accounts/{account}");
    // Each key is used once, so the replica knows it.
    assert_eq!(status_of(&app, &path, &kiosk).await, StatusCode::OK);
    assert_eq!(status_of(&app, &path, &admin).await, StatusCode::OK);

    for key in [&kiosk, &admin] {
        for _ in 0..30 {
            let forged = same_id_made_up_secret(key);
            assert_eq!(
                status_of(&app, &path, &forged).await,
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                reserve_status(&app, account, &forged).await,
                StatusCode::UNAUTHORIZED
            );
        }
    }
    // A key this replica has never seen: its id flooded before its first
    // use (each forged request is looked up and refused) charges nothing.
    let cold = app.kiosk_key(account).await;
    for _ in 0..30 {
        assert_eq!(
            reserve_status(&app, account, &same_id_made_up_secret(&cold)).await,
            StatusCode::UNAUTHORIZED
        );
    }
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(reserve_status(&app, account, &cold).await);
    }
    assert!(
        statuses.iter().all(|status| status.is_success()),
        "a cold key was throttled by a flood of its id: {statuses:?}"
    );
    // The real holders still have their whole burst.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(reserve_status(&app, account, &kiosk).await);
        statuses.push(status_of(&app, &path, &kiosk).await);
        statuses.push(reserve_status(&app, account, &admin).await);
        statuses.push(status_of(&app, &path, &admin).await);
    }
    assert!(
        statuses.iter().all(|status| status.is_success()),
        "the owners were throttled by someone else's flood: {statuses:?}"
    );
}

/// Before: from a blocked address, any key id the replica had verified got
/// through to a database lookup, whatever the secret (60 × 401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_address_is_not_reopened_by_a_known_key_id() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 5;
        config.auth_failures_per_minute = 1;
    })
    .await;
    let account = app.funded_account(3).await;
    let kiosk = app.kiosk_key(account).await;
    let path = format!("/v1/accounts/{account}");
    assert_eq!(status_of(&app, &path, &kiosk).await, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(
            status_of(&app, &path, &made_up_key()).await,
            StatusCode::UNAUTHORIZED
        );
    }
    let looked_up = counter(&app.metrics_text().await, "unauthorized");
    for _ in 0..30 {
        assert_eq!(
            status_of(&app, &path, &same_id_made_up_secret(&kiosk)).await,
            StatusCode::TOO_MANY_REQUESTS,
            "a known id with a made-up secret must stay blocked"
        );
    }
    let metrics = app.metrics_text().await;
    assert_eq!(
        counter(&metrics, "unauthorized"),
        looked_up,
        "none of them was looked up"
    );
    assert_eq!(counter(&metrics, "throttled"), 30);
    // The key's real holder is still let through from the same address.
    assert_eq!(status_of(&app, &path, &kiosk).await, StatusCode::OK);
    assert_eq!(
        reserve_status(&app, account, &kiosk).await,
        StatusCode::CREATED
    );
}

/// Before: a kiosk key this replica had verified, then revoked, and used
/// only to spend (the engine verifies it, no handler looks it up), stayed
/// remembered: from a blocked address it still got through to the
/// database (401) for the memory's ten minutes, instead of 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_refused_by_the_engine_is_forgotten() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 5;
        config.auth_failures_per_minute = 1;
    })
    .await;
    let account = app.funded_account(10).await;
    let kiosk = app.kiosk_key(account).await;
    // Remembered: the first answer verifies it, the second uses the memory.
    for _ in 0..2 {
        assert_eq!(
            reserve_status(&app, account, &kiosk).await,
            StatusCode::CREATED
        );
    }
    revoke(&app, &kiosk).await;
    assert_eq!(
        reserve_status(&app, account, &kiosk).await,
        StatusCode::UNAUTHORIZED,
        "the engine refuses the revoked key"
    );
    // The address is blocked by the failures that follow.
    for _ in 0..5 {
        status_of(&app, &format!("/v1/accounts/{account}"), &made_up_key()).await;
    }
    let looked_up = counter(&app.metrics_text().await, "unauthorized");
    for _ in 0..10 {
        assert_eq!(
            reserve_status(&app, account, &kiosk).await,
            StatusCode::TOO_MANY_REQUESTS,
            "a revoked key must not pass a blocked address"
        );
    }
    assert_eq!(
        counter(&app.metrics_text().await, "unauthorized"),
        looked_up,
        "none of them reached the database"
    );
}

/// Before: the ledger's and the events' `actor` was the acting key's id, so
/// a kiosk learnt the id of the admin key that credited it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kiosk_never_sees_another_keys_id() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let admin = admin_key(&app, "front desk").await;
    let admin_id = key_id(&admin);
    let credited = app
        .post(
            &format!("/v1/accounts/{account}/credits"),
            &admin,
            &json!({"amount": 10, "external_ref": "top-up-1"}),
        )
        .await;
    assert_eq!(credited.status(), StatusCode::CREATED);
    assert_eq!(
        reserve_status(&app, account, &kiosk).await,
        StatusCode::CREATED
    );

    let ledger: Value = app
        .get(&format!("/v1/accounts/{account}/ledger"), &kiosk)
        .await
        .json()
        .await
        .expect("json");
    let actors: Vec<&str> = ledger["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["actor"].as_str().expect("actor"))
        .collect();
    assert_eq!(actors, ["admin:front desk", "kiosk:kiosk 1"], "{ledger}");

    let events = eventually_events(&app, &kiosk, account).await;
    assert_eq!(
        events["events"][0]["data"]["entry"]["actor"],
        "admin:front desk"
    );
    for (what, body) in [("ledger", &ledger), ("events", &events)] {
        let text = body.to_string();
        for spelling in [admin_id.to_string(), admin_id.simple().to_string()] {
            assert!(
                !text.contains(&spelling),
                "the kiosk's {what} shows {spelling}: {text}"
            );
        }
    }

    // Finance attributes movements to keys: it sees the id (docs/security.md).
    let finance = app.finance_key().await;
    let ledger: Value = app
        .get(&format!("/v1/accounts/{account}/ledger"), &finance)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(ledger["entries"][0]["actor"], json!(admin_id.to_string()));
    assert_eq!(
        ledger["entries"][0]["api_key_id"],
        json!(admin_id.to_string())
    );
}

/// The kiosk's feed, long-polling until the credit's event is listed.
async fn eventually_events(app: &TestApp, key: &str, account: Uuid) -> Value {
    let response = app
        .get(
            &format!("/v1/events?account_id={account}&type=credit.created&wait_seconds=10"),
            key,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let page: Value = response.json().await.expect("json");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(1), "{page}");
    page
}

// --- 2. Audit without secrets -------------------------------------------

/// Before: the audit event of an endpoint's creation carried its whole URL,
/// and finance reads the audit log (and the event feed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_webhook_url_secret_reaches_the_audit_log_or_the_feed() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start();
    let secrets = [
        "PATH-SECRET-1",
        "qs-secret-123",
        "qs-secret-456",
        "PATH-SECRET-2",
    ];
    let created = app
        .post(
            "/v1/webhook-endpoints",
            ADMIN_KEY,
            &json!({
                "url": receiver.hook("services/T000/PATH-SECRET-1", "token=qs-secret-123"),
                "events": ["credit.created"],
            }),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let endpoint: Value = created.json().await.expect("json");
    let endpoint_id = endpoint["endpoint_id"].as_str().expect("id").to_owned();
    // A new URL, on the same receiver, that answers 410: the endpoint is
    // disabled and `endpoint.disabled` (which names the URL) is recorded.
    let patched = app
        .patch(
            &format!("/v1/webhook-endpoints/{endpoint_id}"),
            ADMIN_KEY,
            &json!({"url": receiver.hook(
                "services/T000/PATH-SECRET-2",
                "fail=1&status=410&token=qs-secret-456",
            )}),
        )
        .await;
    assert_eq!(patched.status(), StatusCode::OK);
    let account = app.create_account(0).await;
    app.credit(account, 5).await;
    let finance = app.finance_key().await;
    let disabled = app
        .get(
            "/v1/events?type=endpoint.disabled&wait_seconds=20",
            &finance,
        )
        .await;
    assert_eq!(disabled.status(), StatusCode::OK);
    let disabled: Value = disabled.json().await.expect("json");
    assert_eq!(
        disabled["events"].as_array().map(Vec::len),
        Some(1),
        "{disabled}"
    );
    crate::openapi_types::assert_events_conform(
        &app,
        &disabled["events"].as_array().cloned().unwrap_or_default(),
    )
    .await;
    // The admin still reads the whole URL where it is configured.
    let endpoint: Value = app
        .get(&format!("/v1/webhook-endpoints/{endpoint_id}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert!(endpoint["url"]
        .as_str()
        .expect("url")
        .ends_with("token=qs-secret-456"));
    let deleted = app
        .client
        .delete(app.url(&format!("/v1/webhook-endpoints/{endpoint_id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert!(deleted.status().is_success());

    // History written before the fix: a row with a whole URL, as the old
    // code wrote it (the table is append-only; it is redacted when read).
    let old_url = format!("{}/hook/PATH-SECRET-OLD?token=qs-secret-old", receiver.base);
    diesel::sql_query(
        "INSERT INTO audit_events (actor, action, target, after) \
         VALUES ('bootstrap-admin', 'webhook_endpoint.created', 'webhook_endpoint:old', \
                 jsonb_build_object('url', $1::text))",
    )
    .bind::<diesel::sql_types::Text, _>(&old_url)
    .execute(&mut app.conn())
    .expect("an old audit row");

    let audit: Value = app
        .get("/v1/audit-events?limit=1000", &finance)
        .await
        .json()
        .await
        .expect("json");
    let endpoint_events: Vec<&Value> = audit["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|event| {
            event["action"]
                .as_str()
                .is_some_and(|action| action.starts_with("webhook_endpoint."))
        })
        .collect();
    assert_eq!(endpoint_events.len(), 4, "{audit}");
    let shown = format!("{}/[redacted]", receiver.base);
    assert_eq!(endpoint_events[0]["after"]["url"], json!(shown));
    assert_eq!(endpoint_events[1]["after"]["url_changed"], json!(true));
    assert_eq!(endpoint_events[3]["after"]["url"], json!(shown));
    for (what, body) in [("audit log", &audit), ("event feed", &disabled)] {
        let text = body.to_string();
        for secret in secrets.iter().chain(&["PATH-SECRET-OLD", "qs-secret-old"]) {
            assert!(!text.contains(secret), "the {what} shows {secret}: {text}");
        }
    }
}

// --- 3. One address rule for every spelling ------------------------------

/// Before: only `::ffff:` was unwrapped; `[::127.0.0.1]` and
/// `[2002:7f00:1::]` were created (201), `[::a9fe:a9fe]` accepted by PATCH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_guard_knows_every_ipv6_spelling() {
    let app = TestApp::spawn_with(|config| {
        config.webhook_allow_private_urls = false;
        // Nothing is delivered: no event fires, and no sender runs.
        config.webhook_concurrency = 0;
    })
    .await;
    let spellings = [
        "http://[::127.0.0.1]/",
        "http://[::7f00:1]/",
        "http://[::a9fe:a9fe]/latest/meta-data",
        "http://[::ffff:0:a9fe:a9fe]/latest/meta-data",
        "http://[2002:7f00:1::]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[64:ff9b:1::a9fe:a9fe]/",
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
        "http://[::ffff:127.0.0.1]/",
    ];
    for url in spellings {
        let response = app
            .post(
                "/v1/webhook-endpoints",
                ADMIN_KEY,
                &json!({"url": url, "events": ["credit.created"]}),
            )
            .await;
        let (status, body) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        assert!(
            body["detail"]
                .as_str()
                .expect("detail")
                .contains("non-public"),
            "{body}"
        );
    }
    // A public address literal (never contacted: no sender runs).
    let created = app
        .post(
            "/v1/webhook-endpoints",
            ADMIN_KEY,
            &json!({"url": "http://[2606:4700:4700::1111]/hook", "events": ["credit.created"]}),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let endpoint: Value = created.json().await.expect("json");
    let endpoint_id = endpoint["endpoint_id"].as_str().expect("id");
    for url in spellings {
        let response = app
            .patch(
                &format!("/v1/webhook-endpoints/{endpoint_id}"),
                ADMIN_KEY,
                &json!({"url": url}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "PATCH {url}");
    }
}

// --- 4. No proxy from the environment -------------------------------------

/// A loopback HTTP server that answers every request 200 and counts them.
struct CountingServer {
    url: String,
    hits: Arc<AtomicUsize>,
}

impl CountingServer {
    async fn start() -> CountingServer {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    // Read the head and the (small, length-given) body.
                    while let Ok(read) = stream.read(&mut buffer).await {
                        if read == 0 {
                            break;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        let text = String::from_utf8_lossy(&request);
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let length = head
                                .lines()
                                .find_map(|line| {
                                    let (name, value) = line.split_once(':')?;
                                    name.eq_ignore_ascii_case("content-length")
                                        .then(|| value.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if body.len() >= length {
                                break;
                            }
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        CountingServer { url, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Starts the real binary with `env`, sends one `credit.created` to a
/// receiver, and returns (receiver hits, proxy hits) once one of them has it.
async fn deliver_once(
    env: &[(&str, &str)],
    receiver: &CountingServer,
    proxy: &CountingServer,
) -> (usize, usize) {
    let provider = FakeProvider::start(10).await;
    let database = TestDatabase::create();
    let service = start_service_with(&database.url, &provider.url, env).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        client
            .post(format!("{}{path}", service.base))
            .bearer_auth(ADMIN_KEY)
            .json(&body)
            .send()
    };
    let created = post(
        "/v1/webhook-endpoints",
        json!({"url": format!("{}/hook", receiver.url), "events": ["credit.created"]}),
    )
    .await
    .expect("sent");
    assert_eq!(created.status(), StatusCode::CREATED);
    let account: Value = post("/v1/accounts", json!({"name": "proxied"}))
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    let account = account["account_id"].as_str().expect("id").to_owned();
    let credited = post(
        &format!("/v1/accounts/{account}/credits"),
        json!({"amount": 1, "external_ref": "proxy-check"}),
    )
    .await
    .expect("sent");
    assert_eq!(credited.status(), StatusCode::CREATED);
    eventually("the delivery", Duration::from_secs(20), || {
        let delivered: i64 = diesel::sql_query("SELECT count(*) AS n FROM webhook_attempts")
            .get_result::<Count>(&mut database.connect())
            .map_or(0, |count| count.n);
        (delivered > 0).then_some(())
    })
    .await;
    drop(service);
    (receiver.hits(), proxy.hits())
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Before: reqwest read `HTTP_PROXY`/`http_proxy`, and the proxy, not the
/// guarded resolver, resolved the receiver's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_ignore_proxy_variables_and_use_webhook_proxy_only() {
    let receiver = CountingServer::start().await;
    let proxy = CountingServer::start().await;
    let common = [
        ("WEBHOOK_ALLOW_PRIVATE_URLS", "true"),
        ("WEBHOOK_TIMEOUT_SECONDS", "5"),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ];
    let mut environment = common.to_vec();
    environment.extend([
        ("HTTP_PROXY", proxy.url.as_str()),
        ("http_proxy", proxy.url.as_str()),
        ("ALL_PROXY", proxy.url.as_str()),
    ]);
    let (to_receiver, to_proxy) = deliver_once(&environment, &receiver, &proxy).await;
    assert_eq!(
        (to_receiver, to_proxy),
        (1, 0),
        "with HTTP_PROXY set, the delivery still goes straight to the receiver"
    );

    let mut explicit = common.to_vec();
    explicit.push(("WEBHOOK_PROXY", proxy.url.as_str()));
    let (to_receiver, to_proxy) = deliver_once(&explicit, &receiver, &proxy).await;
    assert_eq!(
        (to_receiver, to_proxy),
        (1, 1),
        "WEBHOOK_PROXY sends it through the proxy"
    );
}

// --- 5. Revocation ends what is open --------------------------------------

/// Waits until `key` has been verified by the service (its `last_used_at`
/// is set on its first verified request).
async fn until_used(app: &TestApp, key: &str) {
    let id = key_id(key);
    let mut conn = app.conn();
    eventually("the key's first use", Duration::from_secs(10), || {
        let used: Option<chrono::DateTime<chrono::Utc>> =
            token_billing::db::schema::api_keys::table
                .find(id)
                .select(token_billing::db::schema::api_keys::last_used_at)
                .first(&mut conn)
                .expect("the key");
        used.map(|_| ())
    })
    .await;
}

async fn revoke(app: &TestApp, key: &str) {
    let response = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{}", key_id(key))))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
}

/// Before: the open poll answered 200 with the credit made after the
/// revocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_open_event_poll_gets_401() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let poll = {
        let (app, kiosk) = (Arc::clone(&app), kiosk.clone());
        tokio::spawn(async move {
            app.get("/v1/events?type=credit.created&wait_seconds=20", &kiosk)
                .await
        })
    };
    until_used(&app, &kiosk).await;
    revoke(&app, &kiosk).await;
    app.credit(account, 5).await;
    let (status, body) = problem(poll.await.expect("the poll")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}

/// The same for a job's wait: a second kiosk key waits on a job another key
/// created; it is revoked while it waits; the job finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_open_job_wait_gets_401() {
    let app = Arc::new(TestApp::spawn_with(|config| config.simulated_latency_ms = 1_500).await);
    let account = app.funded_account(5).await;
    let creator = app.kiosk_key(account).await;
    let waiter = app.kiosk_key(account).await;
    let request_id = Uuid::new_v4();
    let created = app
        .post(
            &format!("/v1/accounts/{account}/jobs"),
            &creator,
            &json!({"request_id": request_id, "kind": "standard", "params": {}}),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let wait = {
        let (app, waiter) = (Arc::clone(&app), waiter.clone());
        tokio::spawn(async move {
            app.get(
                &format!("/v1/accounts/{account}/jobs/{request_id}?wait_seconds=20"),
                &waiter,
            )
            .await
        })
    };
    until_used(&app, &waiter).await;
    revoke(&app, &waiter).await;
    let (status, body) = problem(wait.await.expect("the wait")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The job did finish: the creator sees it.
    let job = app.wait_job(account, request_id, 10).await;
    assert_eq!(job["status"], "succeeded", "{job}");
}

// --- 6. Names people can trust; the throttle's words and count -----------

/// Before: U+202E, zero-width characters, a BOM, U+2028 and whitespace-only
/// names were accepted, and an exact duplicate said nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_names_are_visible_normalised_and_duplicates_are_flagged() {
    let app = TestApp::spawn().await;
    for name in [
        "Wedding\u{202E}kiosk",
        "Wed\u{200B}ding",
        "\u{FEFF}Wedding",
        "Wedding\u{2028}kiosk",
        "Wedding\u{2067}kiosk",
        "   ",
        "\u{3000}",
    ] {
        let response = app
            .post("/v1/accounts", ADMIN_KEY, &json!({"name": name}))
            .await;
        let (status, body) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name:?}: {body}");
        let response = app
            .post(
                &format!("/v1/accounts/{}/api-keys", app.create_account(0).await),
                ADMIN_KEY,
                &json!({"scope": "kiosk", "label": name}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "label {name:?}");
    }
    let listed: Value = app
        .get("/v1/accounts?limit=1000", ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = listed["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .map(|account| account["name"].as_str().expect("name"))
        .collect();
    assert!(
        names.iter().all(|name| *name == "kiosk fleet"),
        "refused names created nothing: {names:?}"
    );

    // NFC: "Café" typed with a combining accent is stored precomposed.
    let response = app
        .post(
            "/v1/accounts",
            ADMIN_KEY,
            &json!({"name": "Cafe\u{301} lobby"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let cafe: Value = response.json().await.expect("json");
    assert_eq!(cafe["name"], "Caf\u{E9} lobby");
    assert_eq!(cafe["warnings"], json!([]));

    // The same name again (in another case, or another normalisation):
    // created, with a warning that names the other account.
    let response = app
        .post(
            "/v1/accounts",
            ADMIN_KEY,
            &json!({"name": "CAF\u{C9} LOBBY"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let twin: Value = response.json().await.expect("json");
    assert_eq!(twin["warnings"][0]["code"], "name_taken", "{twin}");
    assert_eq!(
        twin["warnings"][0]["account_ids"],
        json!([cafe["account_id"]])
    );
}

/// Before: the block began after 21 failures with `AUTH_FAILURE_BURST=20`,
/// and its 429 said "too many requests for this API key".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throttle_blocks_at_its_count_and_says_it_is_per_address() {
    let app = TestApp::spawn_with(|config| {
        config.auth_failure_burst = 20;
        config.auth_failures_per_minute = 1;
    })
    .await;
    for failure in 1..=20 {
        assert_eq!(
            status_of(&app, "/v1/accounts", &made_up_key()).await,
            StatusCode::UNAUTHORIZED,
            "failure {failure}"
        );
    }
    let (status, body) = problem(app.get("/v1/accounts", &made_up_key()).await).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 21st request: {body}"
    );
    let detail = body["detail"].as_str().expect("detail");
    assert!(detail.contains("address"), "{detail}");
    assert!(!detail.contains("API key;"), "{detail}");
}
