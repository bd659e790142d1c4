//! The books' identity — credited + adjusted − grant_expired = available +
//! reserved + used — is enforced by the database on every write of an
//! account row (`accounts_books_identity` in the accounts' row rules,
//! `migrations/2026-12-05-000001_accounts_books_identity`), not only
//! audited afterwards: a movement that would break it cannot commit, and
//! the engine's whole batch rolls back with it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

use token_billing::engine::install::SCHEMA;

use crate::helpers::TestApp;

/// A deliberate bug in the write path's arithmetic (a commit that adds one
/// token more to `used` than it takes from `reserved`) fails the commit's
/// transaction: the answer is an error, the reservation stays held, and no
/// entry or balance of the commit is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_movement_that_breaks_the_books_cannot_commit() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let key = app.kiosk_key(account).await;
    let reserve = app
        .post(
            &format!("/v1/accounts/{account}/reservations"),
            &key,
            &json!({"request_id": uuid::Uuid::new_v4(), "amount": 4}),
        )
        .await;
    assert_eq!(reserve.status(), StatusCode::CREATED);
    let reservation: Value = reserve.json().await.expect("json");
    let id = reservation["reservation_id"]
        .as_str()
        .expect("id")
        .to_owned();

    // The bug: engine_deltas (the arithmetic every movement's balances come
    // from) with a commit's `used` one too many.
    app.conn()
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION {SCHEMA}.engine_deltas(p_kind text, p_amount bigint,
                 p_reservation uuid)
             RETURNS {SCHEMA}.engine_balances
             LANGUAGE sql IMMUTABLE AS $$
                 SELECT ROW(0, CASE WHEN p_kind = 'commit' THEN -p_amount ELSE 0 END,
                            CASE WHEN p_kind = 'commit' THEN p_amount + 1 ELSE 0 END,
                            0, 0, 0)::{SCHEMA}.engine_balances
             $$"
        ))
        .expect("install the bug");

    let commit = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/commit"),
            &key,
            &json!({"amount": 4}),
        )
        .await;
    assert_eq!(commit.status(), StatusCode::INTERNAL_SERVER_ERROR);

    let mut conn = app.conn();
    #[derive(QueryableByName)]
    struct Seen {
        #[diesel(sql_type = diesel::sql_types::Text)]
        state: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        used: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        reserved: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        commits: i64,
    }
    let seen: Seen = diesel::sql_query(
        "SELECT r.state, a.used, a.reserved,
                (SELECT count(*) FROM ledger_entries e
                 WHERE e.account_id = a.id AND e.kind = 'commit') AS commits
         FROM reservations r JOIN accounts a ON a.id = r.account_id
         WHERE r.id = $1::uuid",
    )
    .bind::<diesel::sql_types::Text, _>(&id)
    .get_result(&mut conn)
    .expect("the books after the refused commit");
    assert_eq!(
        (seen.state.as_str(), seen.used, seen.reserved, seen.commits),
        ("held", 0, 4, 0),
        "the commit left nothing behind"
    );

    // And the guard names the rule: the same broken write by hand.
    let error = conn
        .batch_execute(&format!(
            "UPDATE accounts SET used = used + 1 WHERE id = '{account}'"
        ))
        .expect_err("the database refuses broken books");
    assert!(
        error.to_string().contains("accounts_books_identity"),
        "{error}"
    );
}
