//! The service runs as the role `postgres/service-role.sh` makes (the one
//! compose uses): no superuser, the owner of its database and nothing
//! more. The script runs as written on a fresh database of the main
//! cluster, under a role name of the test's own; the service then
//! migrates, installs its engine and serves a kiosk's whole story as that
//! role.

use std::process::{Command, Stdio};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::crash::{funded_kiosk, start_service_with};
use crate::helpers::{server_url, FakeProvider};

/// Drops the database and the role, however the test ends.
struct DropBoth(String);

impl Drop for DropBoth {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&format!("{}/postgres", server_url())) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{0}\" WITH (FORCE); DROP ROLE IF EXISTS \"{0}\"",
                self.0
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_as_the_role_the_script_makes_without_superuser() {
    let name = format!("tb_role_{}", Uuid::new_v4().simple());
    let _dropper = DropBoth(name.clone());
    let server = server_url();
    let (_, authority) = server.split_once("://").expect("a URL");
    let (_, host) = authority.split_once('@').expect("user@host");
    let (host, port) = host.split_once(':').expect("host:port");
    let mut admin = PgConnection::establish(&format!("{server}/postgres")).expect("connect");
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .expect("a fresh database");

    let status = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/postgres/service-role.sh"
    ))
    .env("PGHOST", host)
    .env("PGPORT", port)
    .env("POSTGRES_USER", "postgres")
    .env("POSTGRES_DB", &name)
    .env("SERVICE_DB_USER", &name)
    .env("SERVICE_DB_PASSWORD", "not-checked-on-a-trust-server")
    .stderr(Stdio::inherit())
    .status()
    .expect("run postgres/service-role.sh");
    assert!(status.success(), "postgres/service-role.sh: {status}");

    #[derive(QueryableByName, Debug)]
    struct Role {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        rolsuper: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        rolcreatedb: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        rolcreaterole: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        rolreplication: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        rolbypassrls: bool,
    }
    let role: Role = diesel::sql_query(
        "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls \
         FROM pg_roles WHERE rolname = $1",
    )
    .bind::<diesel::sql_types::Text, _>(&name)
    .get_result(&mut admin)
    .expect("the role exists");
    assert!(
        !(role.rolsuper
            || role.rolcreatedb
            || role.rolcreaterole
            || role.rolreplication
            || role.rolbypassrls),
        "{role:?}"
    );

    // The service as that role: migrations, the engine, a kiosk's story,
    // a job, the finance reads and the metrics.
    let provider = FakeProvider::start(10).await;
    let url = format!("postgres://{name}@{host}:{port}/{name}");
    let service = start_service_with(&url, &provider.url, &[]).await;
    let client = reqwest::Client::new();
    let base = &service.base;
    let (account, key) = funded_kiosk(
        &client,
        base,
        json!({"name": "role"}),
        json!({"amount": 10, "external_ref": "role"}),
    )
    .await;
    let accounts = format!("{base}/v1/accounts/{account}");
    let reserved = client
        .post(format!("{accounts}/reservations"))
        .bearer_auth(&key)
        .json(&json!({"request_id": Uuid::new_v4(), "amount": 2}))
        .send()
        .await
        .expect("reserve");
    assert_eq!(reserved.status(), StatusCode::CREATED);
    let reservation = reserved.json::<serde_json::Value>().await.expect("json")["reservation_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let committed = client
        .post(format!("{accounts}/reservations/{reservation}/commit"))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .expect("commit");
    assert_eq!(committed.status(), StatusCode::OK);
    let job = Uuid::new_v4();
    let created = client
        .post(format!("{accounts}/jobs"))
        .bearer_auth(&key)
        .json(&json!({"request_id": job, "kind": "standard", "params": {}}))
        .send()
        .await
        .expect("create a job");
    assert_eq!(created.status(), StatusCode::CREATED);
    let finished: serde_json::Value = client
        .get(format!("{accounts}/jobs/{job}?wait_seconds=20"))
        .bearer_auth(&key)
        .send()
        .await
        .expect("wait for the job")
        .json()
        .await
        .expect("json");
    assert_eq!(finished["status"], "succeeded", "{finished}");
    for path in [
        format!("/v1/accounts/{account}"),
        format!("/v1/accounts/{account}/ledger"),
        "/v1/reconciliation".to_owned(),
    ] {
        let answer = client
            .get(format!("{base}{path}"))
            .bearer_auth(crate::helpers::ADMIN_KEY)
            .send()
            .await
            .expect("a read");
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
    }
    let balances: serde_json::Value = client
        .get(&accounts)
        .bearer_auth(crate::helpers::ADMIN_KEY)
        .send()
        .await
        .expect("the account")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (&balances["available"], &balances["used"]),
        (&json!(7), &json!(3)),
        "{balances}"
    );
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);
    drop(service);
}
