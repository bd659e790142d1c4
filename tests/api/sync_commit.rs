//! An acknowledged movement is on two disks: with a synchronous standby
//! named, a commit waits for it, and nothing the service does cancels that
//! wait. PostgreSQL keeps a commit whose wait is *cancelled* and answers
//! success with only a WARNING, so a cancelled wait would acknowledge a
//! movement on the primary's disk alone. The service's `statement_timeout`
//! (`DB_STATEMENT_TIMEOUT_MS`) does not reach the commit's wait (PostgreSQL
//! stops the statement's timer before it commits); this test holds that
//! true for the engine's own calls, past the timeout.
//!
//! A private cluster (never the main one) whose `synchronous_standby_names`
//! names a standby that never connects. `.ci/run` runs it with the other
//! private-cluster tests (`cargo test --test api private_cluster --
//! --ignored`).

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::crash::{funded_kiosk, start_service_with};
use crate::helpers::FakeProvider;
use crate::storage::PrivateCluster;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    count: i64,
}

fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (runuser) for a private cluster, about 20 s: .ci/run runs it \
            (cargo test --test api private_cluster -- --ignored)"]
async fn private_cluster_a_commit_waiting_for_its_standby_is_never_acknowledged() {
    let cluster = PrivateCluster::start();
    let mut admin = PgConnection::establish(&cluster.url("postgres")).expect("connect");
    admin
        .batch_execute("CREATE DATABASE tb_sync")
        .expect("a database");
    let provider = FakeProvider::start(10).await;
    let service = start_service_with(&cluster.url("tb_sync"), &provider.url, &[]).await;
    let client = reqwest::Client::new();
    let base = &service.base;
    let (account, key) = funded_kiosk(
        &client,
        base,
        json!({"name": "sync"}),
        json!({"amount": 100, "external_ref": "sync-before"}),
    )
    .await;
    let accounts = format!("{base}/v1/accounts/{account}");

    // From now on every commit waits for a standby that never comes.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
        .expect("name a synchronous standby");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .expect("reload");
    let request_id = Uuid::new_v4();
    let reserve = json!({"request_id": request_id, "amount": 3});
    let timeout = Duration::from_millis(token_billing::config::DB_STATEMENT_TIMEOUT_MS)
        + Duration::from_secs(5);
    let started = Instant::now();
    let answer = client
        .post(format!("{accounts}/reservations"))
        .bearer_auth(&key)
        .json(&reserve)
        .timeout(timeout)
        .send()
        .await;
    let waited = started.elapsed();
    match answer {
        Err(error) if error.is_timeout() => {}
        Err(error) => panic!("the reserve failed otherwise: {error}"),
        // A refusal (503) acknowledges nothing and is allowed; a success
        // is the hole.
        Ok(response) => {
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert!(
                !status.is_success(),
                "a reserve was acknowledged after {waited:?} with no standby: {status} {body}"
            );
        }
    }
    assert!(
        waited >= Duration::from_millis(token_billing::config::DB_STATEMENT_TIMEOUT_MS),
        "the answer came after {waited:?}, before the statement timeout"
    );
    // It waited for the standby, past the statement timeout, and was never
    // cancelled: the commit is still waiting.
    let waiting = count(
        &mut admin,
        "SELECT count(*) AS count FROM pg_stat_activity \
         WHERE datname = 'tb_sync' AND wait_event = 'SyncRep'",
    );
    assert!(waiting >= 1, "no commit waits for the standby");

    // The standby requirement lifted (as Patroni does when the standby is
    // gone): the waiting commit completes, and the kiosk's retry of the
    // same press finds that one reservation.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''")
        .expect("lift the requirement");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .expect("reload");
    let retry = client
        .post(format!("{accounts}/reservations"))
        .bearer_auth(&key)
        .json(&reserve)
        .send()
        .await
        .expect("the retry is answered");
    let status = retry.status();
    let body: Value = retry.json().await.expect("json");
    assert!(
        status == StatusCode::CREATED || status == StatusCode::OK,
        "{status} {body}"
    );
    let mut books = PgConnection::establish(&cluster.url("tb_sync")).expect("connect");
    assert_eq!(
        count(
            &mut books,
            &format!(
                "SELECT count(*) AS count FROM reservations WHERE request_id = '{request_id}'"
            )
        ),
        1,
        "the press is one reservation"
    );
    let account: Uuid = account.parse().expect("a uuid");
    crate::helpers::assert_account_invariants(&mut books, account);
}
