//! What a batch decides on is read after its accounts' locks
//! (`engine_lock_accounts`, `src/engine/sql/70_apply.sql`): the keys it
//! presents and the grants it draws from are read once for the batch, in a
//! statement that starts once the locks are held, so a batch that waited
//! for an account sees what the transaction it waited for wrote. A read in
//! the statement that waited would see the database as it was before the
//! wait: a key's budget already spent, a grant already drawn.
//!
//! Within a batch, each operation decides on what the ones before it did
//! (`engine_apply`): reserves take consecutive tokens, tokens given back
//! are drawn again in draw order, and a credit or a lapse met mid-batch is
//! written after the batch's pending writes and seen by what follows.

use std::sync::Arc;

use diesel::connection::SimpleConnection;
use diesel::{PgConnection, RunQueryDsl};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::api_keys::Credentials;

use crate::helpers::{
    applied_in_an_open_transaction, until_a_session_waits_for_a_lock, TestApp, ADMIN_KEY,
};

/// A reserve of `amount` on `account` as the engine's request (the
/// service's own when `key` is None, else by the kiosk key presented).
fn reserve_op(account: Uuid, amount: i64, key: Option<&str>) -> Value {
    let mut op = json!({"op": "reserve", "account": account, "actor": "holder",
                        "authorized": true, "request": Uuid::new_v4(), "amount": amount,
                        "ttl": 300, "new_id": Uuid::new_v4()});
    if let Some(presented) = key {
        let Some(Credentials::Key { id, secret_hash }) = Credentials::parse(presented) else {
            panic!("a kiosk key: {presented}");
        };
        op["authorized"] = json!(false);
        op["key_id"] = json!(id);
        op["key_hash"] = json!(format!("\\x{}", hex::encode(secret_hash)));
    }
    op
}

/// A kiosk's reserve of one token on `account` with `key`, sent while
/// `holder` holds the account in its open transaction: once the reserve
/// waits for the lock, the holder commits. The reserve's answer.
async fn reserve_behind(
    app: &Arc<TestApp>,
    mut holder: PgConnection,
    account: Uuid,
    key: String,
) -> (StatusCode, Value) {
    let reserving = {
        let app = Arc::clone(app);
        tokio::spawn(async move { app.reserve(account, &key, Uuid::new_v4(), 1).await })
    };
    until_a_session_waits_for_a_lock(app).await;
    holder.batch_execute("COMMIT").expect("commit");
    let response = reserving.await.expect("reserve");
    let status = response.status();
    (status, response.json().await.expect("json"))
}

/// A reserve that waited for its account draws from the grants as the
/// transaction it waited for left them: the promotional grant (drawn
/// first) was emptied meanwhile, so it draws from the paid one. Read before
/// the wait, the draw would name the empty grant and the write would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_that_waited_draws_from_the_grants_as_they_were_left() {
    let app = Arc::new(TestApp::spawn().await);
    let (account, grants) = promo_and_paid(&app, [5, 5]).await;
    let key = app.kiosk_key(account).await;
    let holder = applied_in_an_open_transaction(&app, &reserve_op(account, 5, None));
    let (status, body) = reserve_behind(&app, holder, account, key).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["draws"],
        json!([{"grant_id": grants[1], "amount": 1}]),
        "drawn from the paid grant, the promotional one being empty: {body}"
    );
    app.assert_invariants(account);
}

/// A reserve that waited for its account is decided against its key's
/// budget as the transaction it waited for left it: that transaction spent
/// the whole budget with the same key, so the reserve is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_that_waited_sees_the_budget_spent_meanwhile() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(100).await;
    let response = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "booth 7",
                    "budget": {"budget_tokens": 10, "budget_period": "total"}}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("json");
    let secret = created["key"].as_str().expect("key").to_owned();
    let holder = applied_in_an_open_transaction(&app, &reserve_op(account, 10, Some(&secret)));
    let (status, body) = reserve_behind(&app, holder, account, secret).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert_eq!(body["code"], "key_budget_exhausted", "{body}");
    assert_eq!(app.account(account).await["reserved"], 10);
}

/// The grant a credit of `body` to `account` made.
async fn granted(app: &TestApp, account: Uuid, body: Value) -> Value {
    let response = app
        .post(&format!("/v1/accounts/{account}/credits"), ADMIN_KEY, &body)
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    body["grant_id"].clone()
}

/// A new account holding two grants of `tokens` tokens each: a
/// promotional one (priority 0, drawn first) and a paid one (priority 50).
/// The account and the two grants' ids.
async fn promo_and_paid(app: &TestApp, tokens: [i64; 2]) -> (Uuid, [Value; 2]) {
    let account = app.create_account(0).await;
    let promo = json!({"amount": tokens[0], "external_ref": "promo", "priority": 0});
    let paid = json!({"amount": tokens[1], "external_ref": "paid", "priority": 50});
    let grants = [
        granted(app, account, promo).await,
        granted(app, account, paid).await,
    ];
    (account, grants)
}

/// A settlement (`op`: commit_all, release …) of `reservation` on
/// `account` as the engine's request, the service's own.
fn settle_op(op: &str, account: Uuid, reservation: &Value) -> Value {
    json!({"op": op, "account": account, "actor": "holder", "authorized": true,
           "reservation": reservation})
}

/// `batch` (the engine's requests, as JSON) through `engine_apply` in one
/// transaction: each operation's outcome and object, in order.
fn applied(app: &TestApp, batch: &Value) -> Vec<(String, Value)> {
    #[derive(diesel::QueryableByName)]
    struct Answer {
        #[diesel(sql_type = diesel::sql_types::Text)]
        outcome: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
        object: Option<Value>,
    }
    let mut conn = app.conn();
    let schema = token_billing::engine::install::SCHEMA;
    conn.batch_execute(&format!("SET search_path TO {schema}, public"))
        .expect("search path");
    diesel::sql_query(
        "SELECT outcome, object FROM engine_apply(ARRAY(\
             SELECT jsonb_populate_record(NULL::engine_request, o) \
             FROM jsonb_array_elements($1::jsonb) o)) ORDER BY op_position",
    )
    .bind::<diesel::sql_types::Text, _>(batch.to_string())
    .load::<Answer>(&mut conn)
    .expect("engine_apply")
    .into_iter()
    .map(|answer| (answer.outcome, answer.object.unwrap_or(Value::Null)))
    .collect()
}

/// The kinds of `account`'s ledger entries, in order.
fn ledger_kinds(app: &TestApp, account: Uuid) -> Vec<String> {
    crate::helpers::ledger_of(&mut app.conn(), account)
        .into_iter()
        .map(|(kind, ..)| kind)
        .collect()
}

/// The outcomes of `applied`'s answers.
fn outcomes(answers: &[(String, Value)]) -> Vec<&str> {
    answers
        .iter()
        .map(|(outcome, _)| outcome.as_str())
        .collect()
}

/// Each of `applied`'s answers as its outcome and its object's draws.
fn draws(answers: &[(String, Value)]) -> Vec<(&str, Value)> {
    answers
        .iter()
        .map(|(outcome, object)| (outcome.as_str(), object["draws"].clone()))
        .collect()
}

/// A batch that gives tokens back and then spends on the same account
/// draws in draw order from the grants as the give-back left them: the
/// release returns the promotional grant's token (drawn first), and the
/// reserve after it in the same batch draws that token again, not the paid
/// grant's. Decided on the grants as the batch read them, the reserve would
/// draw the paid token and leave the promotional one unspent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_after_a_release_in_one_batch_draws_the_returned_tokens_first() {
    let app = TestApp::spawn().await;
    let (account, grants) = promo_and_paid(&app, [1, 1]).await;
    let first = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");
    assert_eq!(
        first["draws"],
        json!([{"grant_id": grants[0], "amount": 1}])
    );
    let release = settle_op("release", account, &first["reservation_id"]);
    let answers = applied(&app, &json!([release, reserve_op(account, 1, None)]));
    assert_eq!(outcomes(&answers), ["released", "created"]);
    assert_eq!(
        answers[1].1["draws"],
        json!([{"grant_id": grants[0], "amount": 1}]),
        "the returned promotional token is drawn first: {}",
        answers[1].1
    );
    app.assert_invariants(account);
}

/// Reserves on one account in one batch take consecutive tokens in draw
/// order: the first takes the promotional grant's only token, the second
/// the paid grant's first, and so on. (Two of them deciding on the same
/// tokens would draw the promotional grant twice, and the batch's write
/// would fail: the service would then retry its operations one at a time,
/// hiding it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserves_on_one_account_in_one_batch_take_consecutive_tokens() {
    let app = TestApp::spawn().await;
    let (account, grants) = promo_and_paid(&app, [1, 5]).await;
    let batch: Vec<Value> = [1, 2, 1]
        .map(|amount| reserve_op(account, amount, None))
        .into();
    let answers = applied(&app, &Value::Array(batch));
    assert_eq!(
        draws(&answers),
        [
            ("created", json!([{"grant_id": grants[0], "amount": 1}])),
            ("created", json!([{"grant_id": grants[1], "amount": 2}])),
            ("created", json!([{"grant_id": grants[1], "amount": 1}])),
        ]
    );
    app.assert_invariants(account);
}

/// Reserves on two accounts in one batch each draw from their own
/// account's grants only: the batch reads the grants of every account it
/// spends on together, and each spend takes from its own account's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserves_on_two_accounts_in_one_batch_draw_each_from_its_own_grants() {
    let app = TestApp::spawn().await;
    let (first, second) = (app.create_account(0).await, app.create_account(0).await);
    let grants = [
        granted(&app, first, json!({"amount": 3, "external_ref": "a"})).await,
        granted(&app, second, json!({"amount": 3, "external_ref": "b"})).await,
    ];
    let batch = [(second, 2), (first, 2), (second, 1)]
        .map(|(account, amount)| reserve_op(account, amount, None));
    let answers = applied(&app, &json!(batch));
    assert_eq!(
        draws(&answers),
        [
            ("created", json!([{"grant_id": grants[1], "amount": 2}])),
            ("created", json!([{"grant_id": grants[0], "amount": 2}])),
            ("created", json!([{"grant_id": grants[1], "amount": 1}])),
        ]
    );
    app.assert_invariants(first);
    app.assert_invariants(second);
}

/// Settlements of two reservations on one grant in one batch each move the
/// grant: the batch's one write adds up what every movement does to a grant
/// (`engine_grant_moved`), so the grant ends with both commits consumed and
/// the released rest back in remaining. (Kept from one movement only, the
/// grant's books would not add up and the batch's write would fail; the
/// service would then retry its operations one at a time, hiding it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_on_one_grant_in_one_batch_each_move_it() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let grant = granted(&app, account, json!({"amount": 10, "external_ref": "one"})).await;
    let made = applied(
        &app,
        &json!([2, 3].map(|amount| reserve_op(account, amount, None))),
    );
    assert_eq!(outcomes(&made), ["created", "created"]);
    let answers = applied(
        &app,
        &json!([
            settle_op("commit_all", account, &made[0].1["id"]),
            settle_op("commit_all", account, &made[1].1["id"]),
        ]),
    );
    assert_eq!(outcomes(&answers), ["committed", "committed"]);
    #[derive(diesel::QueryableByName, Debug, PartialEq)]
    struct Grant {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        remaining: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        reserved: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        consumed: i64,
    }
    let grant: Grant = diesel::sql_query(
        "SELECT remaining, reserved, consumed FROM credit_grants WHERE id = $1::uuid",
    )
    .bind::<diesel::sql_types::Text, _>(grant.as_str().expect("grant id"))
    .get_result(&mut app.conn())
    .expect("the grant");
    assert_eq!(
        grant,
        Grant {
            remaining: 5,
            reserved: 0,
            consumed: 5
        }
    );
    app.assert_invariants(account);
}

/// A batch whose reserve finds a grant due to lapse writes what the batch
/// did before it first: the commit's entry comes before the lapse's.
/// (Lapsed before the batch's pending writes, the grant's lapse would come
/// first in the ledger, and the reserve would be judged on the account
/// without the commit. A release would not tell: tokens given back flush
/// the pending writes before a reserve anyway.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_met_mid_batch_is_written_after_what_the_batch_did_before_it() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let paid = json!({"amount": 2, "external_ref": "paid", "priority": 50});
    let paid = granted(&app, account, paid).await;
    let held = app.reserve(account, ADMIN_KEY, Uuid::new_v4(), 1).await;
    assert_eq!(held.status(), StatusCode::CREATED);
    let held: Value = held.json().await.expect("json");
    let in_an_hour = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let promo = json!({"amount": 1, "external_ref": "promo", "priority": 0,
                       "expires_at": in_an_hour});
    let promo = granted(&app, account, promo).await;
    // The promotional grant lapses now; nothing has written its lapse.
    app.conn()
        .batch_execute(&format!(
            "UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = '{}'",
            promo.as_str().expect("grant id")
        ))
        .expect("aged");
    let commit = settle_op("commit_all", account, &held["reservation_id"]);
    let answers = applied(&app, &json!([commit, reserve_op(account, 1, None)]));
    assert_eq!(outcomes(&answers), ["committed", "created"]);
    assert_eq!(
        answers[1].1["draws"],
        json!([{"grant_id": paid, "amount": 1}])
    );
    let kinds = ledger_kinds(&app, account);
    assert_eq!(
        kinds,
        [
            "credit",
            "reserve",
            "credit",
            "commit",
            "grant_expire",
            "reserve"
        ]
    );
    app.assert_invariants(account);
}

/// A credit in the middle of a batch writes after what the batch did
/// before it, and what comes after it sees it: the first reserve takes the
/// promotional token, the credit is booked after that reserve, the second
/// reserve takes the paid token and the third the credited one (without
/// the credit, the account would have none left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credit_mid_batch_comes_after_the_reserves_before_it_and_is_drawn_by_those_after() {
    let app = TestApp::spawn().await;
    let (account, [promo, paid]) = promo_and_paid(&app, [1, 1]).await;
    let credit = json!({"op": "credit", "account": account, "actor": "holder",
                        "authorized": true, "new_id": Uuid::new_v4(), "amount": 1,
                        "external_ref": "top-up", "priority": 50});
    let reserve = || reserve_op(account, 1, None);
    let answers = applied(&app, &json!([reserve(), credit, reserve(), reserve()]));
    assert_eq!(
        outcomes(&answers),
        ["created", "created", "created", "created"]
    );
    let credited = answers[1].1["credit"]["grant_id"].clone();
    assert!(credited.is_string(), "{}", answers[1].1);
    let draws: Vec<Value> = [0, 2, 3].map(|i| answers[i].1["draws"].clone()).into();
    assert_eq!(
        draws,
        [promo, paid, credited].map(|grant| json!([{"grant_id": grant, "amount": 1}]))
    );
    let kinds = ledger_kinds(&app, account);
    assert_eq!(
        kinds,
        ["credit", "credit", "reserve", "credit", "reserve", "reserve"]
    );
    app.assert_invariants(account);
}
