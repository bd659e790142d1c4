//! `TestApp`: a fresh database per test, cloned from a migrated template,
//! and the real application on a free port, with typed request helpers.

use std::sync::Arc;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use token_billing::cli::Cli;
use token_billing::config::{Config, ProviderKind};
use token_billing::db;
use token_billing::db::models::{JobRow, ReservationRow};
use token_billing::domain::jobs::JobRequest;
use token_billing::domain::ledger::{replay, Balances};
use token_billing::engine::types::{AccountId, ExternalRef, Name, RequestId, Tokens};
use token_billing::engine::{Authority, Op, Operation};
use token_billing::error::ApiError;
use token_billing::provider::fake::FakeBackend;
use token_billing::provider::simulated::SimulatedProvider;
use token_billing::provider::AnyProvider;
use token_billing::startup::{start_replica, AppState};
use token_billing::worker::Background;
use token_billing_tools::fake_provider::build_fake_provider;

pub const ADMIN_KEY: &str = "test-admin-key-0123456789";

/// The tools' binary, `token-billing-tools` (the tools package, `tools/`).
pub fn tools_binary() -> String {
    sibling_binary("token-billing-tools")
}

/// The load generators' binary, `token-billing-bench` (the bench package,
/// `bench/`).
pub fn bench_binary() -> String {
    sibling_binary("token-billing-bench")
}

/// Another package's binary of the workspace: cargo leaves it beside the
/// service's binary. `cargo test` and `cargo build` at the root build it;
/// a run of one test target (`cargo test --test api …`) builds only the
/// service's binary, so build the others first (`cargo build`) when they
/// changed.
fn sibling_binary(name: &str) -> String {
    let service = std::path::Path::new(env!("CARGO_BIN_EXE_token-billing"));
    let binary = service.with_file_name(name);
    assert!(
        binary.is_file(),
        "{} is missing: build it (`cargo build` at the root)",
        binary.display()
    );
    binary.to_string_lossy().into_owned()
}

pub fn server_url() -> String {
    std::env::var("TEST_DATABASE_SERVER")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Name of the template database for the current migrations: a change to
/// any migration makes a new template. Only the migrations' paths inside
/// the repository and their contents count, so every clone and worktree
/// with the same migrations shares one template.
fn template_name() -> String {
    template_name_for(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations"
    )))
}

fn template_name_for(root: &std::path::Path) -> String {
    let mut paths: Vec<_> = walk(root);
    paths.sort();
    let mut hasher = Sha256::new();
    for path in paths {
        let relative = path.strip_prefix(root).expect("under migrations/");
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(std::fs::read(&path).expect("migration readable"));
    }
    // The engine's schema is named by its SQL files' content.
    hasher.update(db::ENGINE_SCHEMA.as_bytes());
    format!("tb_template_{}", &hex::encode(hasher.finalize())[..16])
}

/// A template not used by any test run for this long is dropped by the
/// next run (it belongs to migrations no checkout has any more).
const TEMPLATE_UNUSED_DROP_AFTER_SECONDS: u64 = 24 * 3600;

/// Stamps `name` as used now (its database comment holds the Unix time of
/// its last use) and drops every other `tb_template_*` unused for a day.
/// Called under the template lock.
fn stamp_and_prune_templates(admin: &mut PgConnection, name: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    admin
        .batch_execute(&format!("COMMENT ON DATABASE {name} IS 'last used {now}'"))
        .expect("stamp template");
    #[derive(QueryableByName)]
    struct Template {
        #[diesel(sql_type = diesel::sql_types::Text)]
        datname: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        comment: Option<String>,
    }
    let templates: Vec<Template> = diesel::sql_query(
        "SELECT datname::text AS datname, shobj_description(oid, 'pg_database') AS comment \
         FROM pg_database WHERE datname LIKE 'tb\\_template\\_%'",
    )
    .load(admin)
    .expect("list templates");
    for template in templates.into_iter().filter(|t| t.datname != name) {
        let last_used = template
            .comment
            .as_deref()
            .and_then(|comment| comment.strip_prefix("last used "))
            .and_then(|seconds| seconds.parse::<u64>().ok());
        let Some(last_used) = last_used else {
            // Made by an older checkout that does not stamp its template (it
            // may be running right now): counted as used now, so it goes
            // only after a day without use.
            let _ = admin.batch_execute(&format!(
                "COMMENT ON DATABASE {} IS 'last used {now}'",
                template.datname
            ));
            continue;
        };
        if now.saturating_sub(last_used) > TEMPLATE_UNUSED_DROP_AFTER_SECONDS {
            // Fails harmlessly if someone is cloning it right now.
            // Two statements: DROP DATABASE cannot run in a transaction block.
            let _ = admin
                .batch_execute(&format!(
                    "ALTER DATABASE {} WITH is_template = false",
                    template.datname
                ))
                .and_then(|()| {
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {}", template.datname))
                });
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .expect("migrations dir")
        .flat_map(|entry| {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

/// Creates the template once per machine and set of migrations (guarded by
/// an advisory lock, as test binaries and nextest processes run
/// concurrently), keeps it for the next run, and drops the templates of
/// migrations no run has used for a day.
fn ensure_template() -> String {
    static TEMPLATE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let name = template_name();
            let mut admin = PgConnection::establish(&format!("{}/postgres", server_url()))
                .expect("PostgreSQL reachable (is it running on 127.0.0.1:5432?)");
            admin
                .batch_execute("SELECT pg_advisory_lock(7243002)")
                .expect("lock");
            let exists: bool = diesel::sql_query(format!(
                "SELECT 1 AS one FROM pg_database WHERE datname = '{name}' AND datistemplate"
            ))
            .execute(&mut admin)
            .expect("query")
                == 1;
            if !exists {
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                    .expect("drop stale template");
                admin
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .expect("create template");
                let mut conn = PgConnection::establish(&format!("{}/{name}", server_url()))
                    .expect("connect template");
                db::run_migrations(&mut conn).expect("migrate template");
                token_billing::engine::install::install(&mut conn).expect("install the engine");
                drop(conn);
                admin
                    .batch_execute(&format!("ALTER DATABASE {name} WITH is_template = true"))
                    .expect("mark template");
            }
            stamp_and_prune_templates(&mut admin, &name);
            admin
                .batch_execute("SELECT pg_advisory_unlock(7243002)")
                .expect("unlock");
            name
        })
        .clone()
}

#[test]
fn every_clone_with_the_same_migrations_shares_one_template() {
    let source = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"));
    let clone = std::env::temp_dir().join(format!("tb_clone_{}", Uuid::new_v4().simple()));
    for path in walk(source) {
        let target = clone.join(path.strip_prefix(source).expect("inside"));
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&path, &target).expect("copy");
    }
    let same = template_name_for(&clone);
    // A changed migration is another template.
    let first = walk(&clone).into_iter().min().expect("a migration");
    std::fs::write(&first, "-- changed\n").expect("write");
    let changed = template_name_for(&clone);
    std::fs::remove_dir_all(&clone).expect("clean up");
    assert_eq!(same, template_name());
    assert_ne!(changed, template_name());
}

#[test]
fn templates_unused_for_a_day_are_dropped_and_the_current_one_kept() {
    let current = ensure_template();
    let mut admin =
        PgConnection::establish(&format!("{}/postgres", server_url())).expect("connect");
    let stale = format!("tb_template_stale_{}", Uuid::new_v4().simple());
    let recent = format!("tb_template_recent_{}", Uuid::new_v4().simple());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    for (name, last_used) in [
        (&stale, now - 2 * TEMPLATE_UNUSED_DROP_AFTER_SECONDS),
        (&recent, now - 60),
    ] {
        for statement in [
            format!("CREATE DATABASE {name}"),
            format!("ALTER DATABASE {name} WITH is_template = true"),
            format!("COMMENT ON DATABASE {name} IS 'last used {last_used}'"),
        ] {
            admin.batch_execute(&statement).expect("create");
        }
    }
    admin
        .batch_execute("SELECT pg_advisory_lock(7243002)")
        .expect("lock");
    stamp_and_prune_templates(&mut admin, &current);
    admin
        .batch_execute("SELECT pg_advisory_unlock(7243002)")
        .expect("unlock");
    let exists = |admin: &mut PgConnection, name: &str| {
        diesel::sql_query(format!(
            "SELECT 1 FROM pg_database WHERE datname = '{name}'"
        ))
        .execute(admin)
        .expect("query")
            == 1
    };
    let (stale_left, recent_left, current_left) = (
        exists(&mut admin, &stale),
        exists(&mut admin, &recent),
        exists(&mut admin, &current),
    );
    let _ = admin.batch_execute(&format!("ALTER DATABASE {recent} WITH is_template = false"));
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {recent}"));
    assert!(!stale_left, "a template unused for two days is dropped");
    assert!(recent_left, "a template used a minute ago is kept");
    assert!(
        current_left,
        "the current template is kept for the next run"
    );
}

/// A database of its own for one test, dropped when the test ends.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub fn create() -> TestDatabase {
        let template = ensure_template();
        let name = format!("tb_test_{}", Uuid::new_v4().simple());
        let mut admin =
            PgConnection::establish(&format!("{}/postgres", server_url())).expect("connect");
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .expect("clone template");
        let url = format!("{}/{name}", server_url());
        TestDatabase { name, url }
    }

    pub fn connect(&self) -> PgConnection {
        db::connect_session(&self.url).expect("connect test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&format!("{}/postgres", server_url())) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

pub fn test_config(database_url: &str) -> Config {
    test_config_with(database_url, &[])
}

/// [`test_config`] with more `serve` flags after the tests' own (a later
/// flag wins): a setting by its flag, as an operator sets it.
pub fn test_config_with(database_url: &str, flags: &[&str]) -> Config {
    use clap::Parser;
    let arguments = [
        "token-billing",
        "--database-url",
        database_url,
        "serve",
        "--bind-addr",
        "127.0.0.1:0",
        "--db-pool-size",
        "16",
        "--admin-api-key",
        ADMIN_KEY,
        "--simulated-latency-ms",
        "20",
        "--job-retry-backoff-ms",
        "50",
        "--worker-concurrency",
        "4",
        // Concurrency tests fire hundreds of requests with one key at once;
        // the limit itself has its own test.
        "--rate-limit-per-second",
        "0",
        // Likewise for authentication failures per address (own test).
        "--auth-failure-burst",
        "0",
        // The tests' webhook receivers listen on loopback; the guard that
        // refuses such addresses by default has its own test.
        "--webhook-allow-private-urls",
        "true",
    ];
    // A flag given in `flags` replaces the tests' own (flags and values
    // come in pairs after `serve`).
    let serve = arguments
        .iter()
        .position(|argument| *argument == "serve")
        .expect("serve");
    let (head, own) = arguments.split_at(serve + 1);
    let own = own
        .chunks(2)
        .filter(|pair| !flags.contains(&pair[0]))
        .flatten();
    let cli = Cli::try_parse_from(head.iter().chain(own).chain(flags))
        .unwrap_or_else(|error| panic!("test arguments {flags:?} parse: {error}"));
    cli.serve_config().expect("serve defaults parse")
}

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    /// The simulated provider's backend (when `PROVIDER=simulated`).
    pub simulated: Option<Arc<FakeBackend>>,
    pub state: Arc<AppState>,
    server: actix_web::dev::ServerHandle,
    background: Background,
    _scheduler: tokio_cron_scheduler::JobScheduler,
    // Dropped last: the database outlives the servers that use it.
    pub database: Arc<TestDatabase>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Both only send their stop command; nothing here can await.
        self.background.signal_stop();
        drop(self.server.stop(false));
    }
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
        Self::spawn_on(Arc::new(TestDatabase::create()), adjust).await
    }

    /// An app started with these `serve` flags besides the tests' own.
    pub async fn spawn_with_flags(flags: &[&str]) -> TestApp {
        Self::spawn_on(Arc::new(TestDatabase::create()), |config| {
            let database_url = config.database_url.clone();
            *config = test_config_with(&database_url, flags);
        })
        .await
    }

    /// Lifts the database's guard of the books' identity on this test's
    /// database (the accounts' row rules, whose `accounts_books_identity`
    /// refuses a row that breaks it), so that a test can store the broken
    /// books the audits must find. The accounts' other row rules go with
    /// it.
    pub fn allow_broken_books(&self) {
        self.conn()
            .batch_execute("ALTER TABLE accounts DROP CONSTRAINT accounts_rules")
            .expect("drop the accounts' row rules");
    }

    /// Another replica on the same database as `self`.
    pub async fn spawn_replica(&self, adjust: impl FnOnce(&mut Config)) -> TestApp {
        Self::spawn_on(Arc::clone(&self.database), adjust).await
    }

    async fn spawn_on(database: Arc<TestDatabase>, adjust: impl FnOnce(&mut Config)) -> TestApp {
        let mut config = test_config(&database.url);
        adjust(&mut config);
        config.validate().expect("valid test config");
        let (provider, simulated) = match config.provider {
            ProviderKind::Simulated => {
                let backend = Arc::new(FakeBackend::new(
                    config.simulated_latency_ms,
                    config.simulated_failure_rate,
                ));
                (
                    AnyProvider::Simulated(SimulatedProvider::new(Arc::clone(&backend))),
                    Some(backend),
                )
            }
            ProviderKind::Http => (
                AnyProvider::from_config(&config).expect("http provider"),
                None,
            ),
        };
        let pool = db::build_pool(&config.database_url, config.db_pool_size);
        let state = AppState::new(config, pool).expect("state");
        let replica = start_replica(Arc::clone(&state), provider, 2)
            .await
            .expect("replica starts");
        let handle = replica.server.handle();
        tokio::spawn(replica.server);
        TestApp {
            address: format!("http://{}", replica.address),
            client: reqwest::Client::new(),
            simulated,
            state,
            server: handle,
            background: replica.background,
            _scheduler: replica.scheduler,
            database,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn get(&self, path: &str, key: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn post_raw(
        &self,
        path: &str,
        key: &str,
        body: impl Into<reqwest::Body>,
    ) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn patch(&self, path: &str, key: &str, body: &Value) -> Response {
        self.client
            .patch(self.url(path))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn create_account(&self, max_active_reservations: i64) -> Uuid {
        self.create_account_from(
            &json!({"name": "kiosk fleet", "max_active_reservations": max_active_reservations}),
        )
        .await
    }

    /// Creates an account (admin) from `body`; its id.
    pub async fn create_account_from(&self, body: &Value) -> Uuid {
        let response = self.post("/v1/accounts", ADMIN_KEY, body).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        body["account_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("uuid")
    }

    /// An account with `tokens` credited and no reservation limit.
    pub async fn funded_account(&self, tokens: i64) -> Uuid {
        let account = self.create_account(0).await;
        if tokens > 0 {
            self.credit(account, tokens).await;
        }
        account
    }

    pub async fn credit(&self, account: Uuid, amount: i64) -> Value {
        let response = self
            .post(
                &format!("/v1/accounts/{account}/credits"),
                ADMIN_KEY,
                &json!({"amount": amount, "external_ref": Uuid::new_v4().to_string()}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        response.json().await.expect("json")
    }

    pub async fn kiosk_key(&self, account: Uuid) -> String {
        let response = self
            .post(
                &format!("/v1/accounts/{account}/api-keys"),
                ADMIN_KEY,
                &json!({"scope": "kiosk", "label": "kiosk 1"}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("json");
        body["key"].as_str().expect("key").to_owned()
    }

    /// A new finance key (reads everything, spends nothing).
    pub async fn finance_key(&self) -> String {
        let created: Value = self
            .post(
                "/v1/api-keys",
                ADMIN_KEY,
                &json!({"scope": "finance", "label": "books"}),
            )
            .await
            .json()
            .await
            .expect("json");
        created["key"].as_str().expect("key").to_owned()
    }

    /// The Prometheus exposition of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("sent")
            .text()
            .await
            .expect("text")
    }

    pub async fn reserve(
        &self,
        account: Uuid,
        key: &str,
        request_id: Uuid,
        amount: i64,
    ) -> Response {
        self.post(
            &format!("/v1/accounts/{account}/reservations"),
            key,
            &json!({"request_id": request_id, "amount": amount}),
        )
        .await
    }

    pub async fn create_job(
        &self,
        account: Uuid,
        key: &str,
        request_id: Uuid,
        params: &Value,
    ) -> Response {
        self.post(
            &format!("/v1/accounts/{account}/jobs"),
            key,
            &json!({"request_id": request_id, "kind": "standard", "params": params}),
        )
        .await
    }

    /// The job after waiting (long-poll) up to `seconds` for a terminal status.
    pub async fn wait_job(&self, account: Uuid, request_id: Uuid, seconds: u64) -> Value {
        let response = self
            .get(
                &format!("/v1/accounts/{account}/jobs/{request_id}?wait_seconds={seconds}"),
                ADMIN_KEY,
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.expect("json")
    }

    /// Polls the database until every job is terminal.
    pub async fn all_jobs_terminal(&self, limit: std::time::Duration) {
        let mut conn = self.conn();
        eventually("every job terminal", limit, || {
            use token_billing::db::schema::generation_jobs::dsl::*;
            let open: i64 = generation_jobs
                .filter(status.eq_any(["queued", "running"]))
                .count()
                .get_result(&mut conn)
                .expect("count");
            (open == 0).then_some(())
        })
        .await;
    }

    pub async fn account(&self, account: Uuid) -> Value {
        let response = self
            .get(&format!("/v1/accounts/{account}"), ADMIN_KEY)
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.expect("json")
    }

    pub fn conn(&self) -> PgConnection {
        self.database.connect()
    }

    /// Balances and a fingerprint of everything the account has (ledger
    /// length, version), to assert that a refused request changed nothing.
    pub fn snapshot(&self, account: Uuid) -> (i64, i64, i64, i64) {
        let mut conn = self.conn();
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            version: i64,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            entries: i64,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            reservations: i64,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            credits: i64,
        }
        let row: Row = diesel::sql_query(
            "SELECT a.version, \
                    (SELECT count(*) FROM ledger_entries l WHERE l.account_id = a.id) AS entries, \
                    (SELECT count(*) FROM reservations r WHERE r.account_id = a.id) AS reservations, \
                    (SELECT count(*) FROM credits c WHERE c.account_id = a.id) \
                  + (SELECT count(*) FROM adjustments d WHERE d.account_id = a.id) AS credits \
             FROM accounts a WHERE a.id = $1",
        )
        .bind::<diesel::sql_types::Uuid, _>(account)
        .get_result(&mut conn)
        .expect("snapshot");
        (row.version, row.entries, row.reservations, row.credits)
    }

    /// Checks every invariant of one account; returns its balances.
    pub fn assert_invariants(&self, account: Uuid) -> Balances {
        assert_account_invariants(&mut self.conn(), account)
    }
}

/// An account's ledger in order: (kind, amount, available, reserved, used
/// after).
pub fn ledger_of(conn: &mut PgConnection, account: Uuid) -> Vec<(String, i64, i64, i64, i64)> {
    ledger_with_reservations(conn, account)
        .into_iter()
        .map(|(kind, amount, available, reserved, used, _)| {
            (kind, amount, available, reserved, used)
        })
        .collect()
}

/// The same, with whether each entry names a reservation (a `grant_expire`
/// takes from `reserved` when it does).
pub fn ledger_with_reservations(
    conn: &mut PgConnection,
    account: Uuid,
) -> Vec<(String, i64, i64, i64, i64, bool)> {
    use token_billing::db::schema::ledger_entries;
    ledger_entries::table
        .filter(ledger_entries::account_id.eq(account))
        .order(ledger_entries::id.asc())
        .select((
            ledger_entries::kind,
            ledger_entries::amount,
            ledger_entries::available_after,
            ledger_entries::reserved_after,
            ledger_entries::used_after,
            ledger_entries::reservation_id.is_not_null(),
        ))
        .load(conn)
        .expect("ledger")
}

/// `credited + adjusted = available + reserved + used + grant_expired`,
/// `reserved` = sum of held reservations, `active_reservations` = their
/// count, and the ledger replays to the balance columns with each entry's
/// balances-after.
pub fn assert_account_invariants(conn: &mut PgConnection, account: Uuid) -> Balances {
    use token_billing::db::schema::{accounts, reservations};
    let (available, reserved, used, credited, adjusted, grant_expired, active): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i32,
    ) = accounts::table
        .find(account)
        .select((
            accounts::available,
            accounts::reserved,
            accounts::used,
            accounts::credited,
            accounts::adjusted,
            accounts::grant_expired,
            accounts::active_reservations,
        ))
        .first(conn)
        .expect("account");
    let balances = Balances {
        available,
        reserved,
        used,
    };
    assert_eq!(
        credited + adjusted,
        balances.total() + grant_expired,
        "conservation of tokens for {account}"
    );
    let held: Vec<i64> = reservations::table
        .filter(reservations::account_id.eq(account))
        .filter(reservations::state.eq("held"))
        .select(reservations::amount)
        .load(conn)
        .expect("held");
    assert_eq!(
        held.iter().sum::<i64>(),
        reserved,
        "reserved = sum of held reservations"
    );
    assert_eq!(
        i32::try_from(held.len()).expect("fits"),
        active,
        "active_reservations = held count"
    );
    let entries = ledger_with_reservations(conn, account);
    let mut running = Balances::default();
    for (kind, amount, available_after, reserved_after, used_after, of_reservation) in &entries {
        running = replay_step(running, kind, *amount, *of_reservation);
        assert_eq!(
            running,
            Balances {
                available: *available_after,
                reserved: *reserved_after,
                used: *used_after
            },
            "ledger entry balances-after match the replay"
        );
    }
    let replayed = replay(
        entries
            .iter()
            .map(|(kind, amount, .., of_reservation)| (kind.as_str(), *amount, *of_reservation)),
    )
    .expect("replay");
    assert_eq!(replayed, balances, "ledger replay = balance columns");
    balances
}

fn replay_step(before: Balances, kind: &str, amount: i64, of_reservation: bool) -> Balances {
    token_billing::domain::ledger::EntryKind::parse(kind)
        .expect("known kind")
        .apply(before, amount, of_reservation)
}

/// A real key with the last character of its secret changed: the key id
/// exists, the secret is wrong.
pub fn tampered(key: &str) -> String {
    let last = if key.ends_with('0') { '1' } else { '0' };
    format!("{}{last}", &key[..key.len() - 1])
}

pub async fn problem(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(
        content_type, "application/problem+json",
        "errors are problem+json: {body}"
    );
    assert_eq!(
        body["status"].as_u64(),
        Some(u64::from(status.as_u16())),
        "{body}"
    );
    for field in ["type", "title", "detail", "code"] {
        assert!(body[field].is_string(), "problem has {field}: {body}");
    }
    (status, body)
}

/// The fake provider over real HTTP on a free loopback port.
pub struct FakeProvider {
    pub url: String,
    pub backend: Arc<FakeBackend>,
    server: actix_web::dev::ServerHandle,
}

impl FakeProvider {
    pub async fn start(latency_ms: u64) -> FakeProvider {
        let backend = Arc::new(FakeBackend::new(latency_ms, 0.0));
        let (server, address) =
            build_fake_provider("127.0.0.1:0", Arc::clone(&backend)).expect("fake provider binds");
        let handle = server.handle();
        tokio::spawn(server);
        FakeProvider {
            url: format!("http://{address}"),
            backend,
            server: handle,
        }
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after
/// `limit` with `what` (a condition, not a sleep, decides).
pub async fn eventually<T>(
    what: &str,
    limit: std::time::Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A session of `app`'s database in an open transaction, in which the
/// engine has applied `op` (an engine_request's fields by name, the others
/// NULL) and answered `created`: what that operation locked stays locked,
/// and what it wrote unseen, until the caller runs COMMIT on it.
pub fn applied_in_an_open_transaction(app: &TestApp, op: &Value) -> PgConnection {
    #[derive(QueryableByName)]
    struct Outcome {
        #[diesel(sql_type = diesel::sql_types::Text)]
        outcome: String,
    }
    let schema = token_billing::engine::install::SCHEMA;
    let mut holder = app.conn();
    holder
        .batch_execute(&format!("SET search_path TO {schema}, public; BEGIN;"))
        .expect("a transaction");
    let answer = diesel::sql_query(
        "SELECT outcome FROM engine_apply(\
             ARRAY[jsonb_populate_record(NULL::engine_request, $1::jsonb)])",
    )
    .bind::<diesel::sql_types::Text, _>(op.to_string())
    .get_result::<Outcome>(&mut holder)
    .expect("engine_apply");
    assert_eq!(answer.outcome, "created", "{op}");
    holder
}

/// Waits until a session of `app`'s database waits for a lock (a request
/// blocked behind a transaction a test holds open).
pub async fn until_a_session_waits_for_a_lock(app: &TestApp) {
    let mut watcher = app.conn();
    eventually(
        "a session waits for a lock",
        std::time::Duration::from_secs(10),
        || {
            #[derive(QueryableByName)]
            struct Waiting {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                waiting: i64,
            }
            let waiting = diesel::sql_query(
                "SELECT count(*) AS waiting FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .get_result::<Waiting>(&mut watcher)
            .expect("pg_stat_activity")
            .waiting;
            (waiting > 0).then_some(())
        },
    )
    .await;
}

/// The server process id of `conn`'s session (`pg_backend_pid()`).
pub fn backend_pid(conn: &mut PgConnection) -> i32 {
    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)
        .expect("the session's pid")
        .pid
}

/// Shared handle for tasks firing requests in parallel.
pub type SharedApp = Arc<TestApp>;

/// Runs one operation through the money engine as an already-verified
/// caller (actor `test`): the object it returns, or the API error of its
/// refusal.
pub fn engine(
    conn: &mut PgConnection,
    account: AccountId,
    op: Op,
) -> Result<Option<Value>, ApiError> {
    let operation = Operation {
        account,
        authority: Authority::Verified {
            actor: "test".into(),
        },
        op,
    };
    let answer = token_billing::engine::apply_one(conn, operation.clone())?;
    match answer.error(&operation) {
        Some(error) => Err(error),
        None => Ok(answer.object),
    }
}

/// A new account named `name` (no reservation limit) holding `tokens`.
pub fn funded(conn: &mut PgConnection, name: &str, tokens: i64) -> AccountId {
    let account = AccountId(
        token_billing::domain::accounts::create_account(
            conn,
            &Name::try_from(name.to_owned()).expect("name"),
            0,
        )
        .expect("account")
        .id,
    );
    credit(conn, account, tokens);
    account
}

/// Credits `tokens` to `account` through the engine.
pub fn credit(conn: &mut PgConnection, account: AccountId, tokens: i64) {
    let op = Op::Credit {
        amount: Tokens::parse(tokens).expect("tokens"),
        external_ref: ExternalRef::try_from(format!("credit-{}", Uuid::new_v4())).expect("ref"),
        note: None,
        priority: Default::default(),
        expires_at: None,
        price: None,
    };
    engine(conn, account, op).expect("credit");
}

/// Reserves `tokens` on `account` through the engine (TTL 300 s).
pub fn reserve(conn: &mut PgConnection, account: AccountId, tokens: i64) -> ReservationRow {
    let op = Op::Reserve {
        request_id: RequestId(Uuid::new_v4()),
        amount: Tokens::parse(tokens).expect("tokens"),
        ttl_seconds: None,
        effective_ttl_seconds: 300,
    };
    let object = engine(conn, account, op).expect("reserve").expect("row");
    serde_json::from_value(object).expect("reservation")
}

/// Creates a `standard` job (cost 1, TTL 300 s) through the engine.
pub fn create_job(conn: &mut PgConnection, account: AccountId) -> JobRow {
    let prices = [("standard".to_owned(), 1)].into_iter().collect();
    let request = JobRequest::parse(
        RequestId(Uuid::new_v4()),
        "standard".into(),
        json!({}),
        &prices,
    )
    .expect("request");
    let op = Op::CreateJob {
        request,
        ttl_seconds: 300,
    };
    let object = engine(conn, account, op).expect("job").expect("job");
    let id: Uuid = serde_json::from_value(object["job_id"].clone()).expect("job id");
    token_billing::db::schema::generation_jobs::table
        .find(id)
        .select(JobRow::as_select())
        .first(conn)
        .expect("job row")
}

/// The proptest configuration of the property tests: `cases` runs, and a
/// failing history shrinks for at most 64 steps and 2 minutes, so a failure
/// reports within minutes (unbounded shrinking of a history against the
/// real service took over 12 minutes). `PROPTEST_MAX_SHRINK_ITERS` and
/// `PROPTEST_MAX_SHRINK_TIME` (milliseconds) override the bounds.
pub fn property_config(cases: u32) -> proptest::test_runner::Config {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: env("PROPTEST_MAX_SHRINK_ITERS", 64),
        max_shrink_time: env("PROPTEST_MAX_SHRINK_TIME", 120_000),
        ..proptest::test_runner::Config::default()
    }
}

/// A well-formed kiosk key that no key row has: id and secret made up.
pub fn made_up_key() -> String {
    format!(
        "tbk_{}_{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )
}

/// The JSON column `row` of each row `sql` selects, `$1` bound to `account`.
pub fn json_rows(conn: &mut PgConnection, sql: &str, account: Uuid) -> Vec<Value> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Jsonb)]
        row: Value,
    }
    diesel::sql_query(sql)
        .bind::<diesel::sql_types::Uuid, _>(account)
        .load::<Row>(conn)
        .expect("rows")
        .into_iter()
        .map(|row| row.row)
        .collect()
}

/// The account's events of `kind`, in order, as the table holds them.
pub fn events_of(conn: &mut PgConnection, account: Uuid, kind: &str) -> Vec<Value> {
    #[derive(QueryableByName)]
    struct Event {
        #[diesel(sql_type = diesel::sql_types::Jsonb)]
        data: Value,
    }
    diesel::sql_query(
        "SELECT data FROM events WHERE account_id = $1 AND type = $2 ORDER BY txid, seq",
    )
    .bind::<diesel::sql_types::Uuid, _>(account)
    .bind::<diesel::sql_types::Text, _>(kind)
    .load::<Event>(conn)
    .expect("events")
    .into_iter()
    .map(|event| event.data)
    .collect()
}
