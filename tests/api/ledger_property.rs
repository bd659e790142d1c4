//! Property test: any sequence of credits, adjustments, reserves, commits,
//! partial commits, releases and expiries keeps `credited + adjusted =
//! available + reserved + used`, and the ledger replays to the balances.

use diesel::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use uuid::Uuid;

use token_billing::domain::accounts::create_account;
use token_billing::domain::credits::{adjust, credit};
use token_billing::domain::reservations::{reserve, resolve, ReserveRequest};
use token_billing::domain::types::{
    AccountId, ExternalRef, Name, Reason, RequestId, ReservationId, SignedTokens, Tokens,
};
use token_billing::error::ApiError;

use crate::helpers::{assert_account_invariants, TestDatabase};

#[derive(Clone, Debug)]
enum Step {
    Credit(i64),
    Adjust(i64),
    Reserve(i64),
    /// Commit the n-th held reservation (modulo), optionally partially.
    Commit(usize, Option<i64>),
    Release(usize),
    /// Push the n-th held reservation past its expiry, then touch it.
    Expire(usize),
    /// Replay the n-th reservation request.
    ReplayReserve(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1i64..20).prop_map(Step::Credit),
        prop_oneof![-15i64..0, 1i64..15].prop_map(Step::Adjust),
        (1i64..8).prop_map(Step::Reserve),
        (0usize..8, proptest::option::of(1i64..8)).prop_map(|(n, amount)| Step::Commit(n, amount)),
        (0usize..8).prop_map(Step::Release),
        (0usize..8).prop_map(Step::Expire),
        (0usize..8).prop_map(Step::ReplayReserve),
    ]
}

/// Errors a step may legitimately meet (refusals); anything else fails.
fn refusal_ok(result: Result<(), ApiError>) {
    match result {
        Ok(())
        | Err(ApiError::InsufficientTokens { .. })
        | Err(ApiError::ReservationNotHeld { .. })
        | Err(ApiError::InvalidRequest(_)) => {}
        Err(other) => panic!("unexpected error: {other:?}"),
    }
}

fn fresh_reference() -> ExternalRef {
    ExternalRef::try_from(format!("ref-{}", Uuid::new_v4())).expect("valid reference")
}

fn run(conn: &mut PgConnection, steps: &[Step]) {
    let account = AccountId(
        create_account(
            conn,
            &Name::try_from("property".to_owned()).expect("name"),
            0,
        )
        .expect("account")
        .id,
    );
    let mut requests: Vec<(RequestId, Tokens)> = Vec::new();
    let mut reservations: Vec<ReservationId> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let pick = |n: usize| reservations.get(n % reservations.len().max(1)).copied();
        let result = match step {
            Step::Credit(amount) => {
                let external_ref = fresh_reference();
                credit(
                    conn,
                    account,
                    Tokens::parse(*amount).expect("amount"),
                    &external_ref,
                    None,
                    "test",
                )
                .map(|_| ())
            }
            Step::Adjust(amount) => {
                let external_ref = fresh_reference();
                let reason = Reason::try_from("correction".to_owned()).expect("reason");
                adjust(
                    conn,
                    account,
                    SignedTokens::try_from(*amount).expect("amount"),
                    &reason,
                    &external_ref,
                    "test",
                )
                .map(|_| ())
            }
            Step::Reserve(amount) => {
                let request = ReserveRequest {
                    request_id: RequestId(Uuid::new_v4()),
                    amount: Tokens::parse(*amount).expect("amount"),
                    ttl_seconds: None,
                };
                reserve(conn, account, &request, 300, "test").map(|(row, _)| {
                    requests.push((request.request_id, request.amount));
                    reservations.push(ReservationId(row.id));
                })
            }
            Step::ReplayReserve(n) => match requests.get(n % requests.len().max(1)) {
                Some((request_id, amount)) => {
                    let request = ReserveRequest {
                        request_id: *request_id,
                        amount: *amount,
                        ttl_seconds: None,
                    };
                    reserve(conn, account, &request, 300, "test").map(|_| ())
                }
                None => Ok(()),
            },
            Step::Commit(n, amount) => match pick(*n) {
                Some(id) => resolve(
                    conn,
                    account,
                    id,
                    amount.map(|a| Tokens::parse(a).expect("amount")),
                    false,
                    "test",
                )
                .map(|_| ()),
                None => Ok(()),
            },
            Step::Release(n) => match pick(*n) {
                Some(id) => resolve(conn, account, id, None, true, "test").map(|_| ()),
                None => Ok(()),
            },
            Step::Expire(n) => match pick(*n) {
                Some(id) => {
                    diesel::sql_query("UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1 AND state = 'held'")
                        .bind::<diesel::sql_types::Uuid, _>(id.0)
                        .execute(conn)
                        .expect("age reservation");
                    resolve(conn, account, id, None, true, "test").map(|_| ())
                }
                None => Ok(()),
            },
        };
        refusal_ok(result);
        let balances = assert_account_invariants(conn, account.0);
        assert!(
            balances.available >= 0 && balances.reserved >= 0 && balances.used >= 0,
            "step {index}: {balances:?}"
        );
    }
}

#[test]
fn random_histories_conserve_tokens_and_replay_exactly() {
    let database = TestDatabase::create();
    let conn = std::cell::RefCell::new(database.connect());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(step(), 1..40), |steps| {
            run(&mut conn.borrow_mut(), &steps);
            Ok(())
        })
        .expect("property holds");
}
