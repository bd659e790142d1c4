//! Property test: any sequence of credits, adjustments, reserves, commits,
//! partial commits, releases and expiries keeps `credited + adjusted =
//! available + reserved + used`, and the ledger replays to the balances.

use diesel::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use uuid::Uuid;

use token_billing::domain::accounts::create_account;
use token_billing::engine::types::{
    AccountId, ExternalRef, Name, Reason, RequestId, ReservationId, SignedTokens, Tokens,
};
use token_billing::error::ApiError;

use token_billing::engine::{CommitAmount, Op};

use crate::helpers::{assert_account_invariants, engine, property_config, TestDatabase};

fn reserve_op(request_id: RequestId, amount: Tokens) -> Op {
    Op::Reserve {
        request_id,
        amount,
        ttl_seconds: None,
        effective_ttl_seconds: 300,
    }
}

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
            Step::Credit(amount) => engine(
                conn,
                account,
                Op::Credit {
                    amount: Tokens::parse(*amount).expect("amount"),
                    external_ref: fresh_reference(),
                    note: None,
                    priority: Default::default(),
                    expires_at: None,
                    price: None,
                },
            )
            .map(|_| ()),
            Step::Adjust(amount) => engine(
                conn,
                account,
                Op::Adjust {
                    amount: SignedTokens::try_from(*amount).expect("amount"),
                    reason: Reason::try_from("correction".to_owned()).expect("reason"),
                    external_ref: fresh_reference(),
                    priority: (*amount > 0).then(Default::default),
                    expires_at: None,
                    price: None,
                },
            )
            .map(|_| ()),
            Step::Reserve(amount) => {
                let (request_id, amount) = (
                    RequestId(Uuid::new_v4()),
                    Tokens::parse(*amount).expect("amount"),
                );
                engine(conn, account, reserve_op(request_id, amount)).map(|row| {
                    let id = row.and_then(|row| row["id"].as_str().map(str::to_owned));
                    requests.push((request_id, amount));
                    reservations.push(ReservationId(
                        Uuid::parse_str(&id.expect("reservation id")).expect("uuid"),
                    ));
                })
            }
            Step::ReplayReserve(n) => match requests.get(n % requests.len().max(1)) {
                Some((request_id, amount)) => {
                    engine(conn, account, reserve_op(*request_id, *amount)).map(|_| ())
                }
                None => Ok(()),
            },
            Step::Commit(n, amount) => match pick(*n) {
                Some(reservation) => engine(
                    conn,
                    account,
                    Op::Commit {
                        reservation,
                        amount: amount.map_or(CommitAmount::All, |a| {
                            CommitAmount::Exactly(Tokens::parse(a).expect("amount"))
                        }),
                    },
                )
                .map(|_| ()),
                None => Ok(()),
            },
            Step::Release(n) => match pick(*n) {
                Some(reservation) => engine(conn, account, Op::Release { reservation }).map(|_| ()),
                None => Ok(()),
            },
            Step::Expire(n) => match pick(*n) {
                Some(reservation) => {
                    diesel::sql_query("UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1 AND state = 'held'")
                        .bind::<diesel::sql_types::Uuid, _>(reservation.0)
                        .execute(conn)
                        .expect("age reservation");
                    engine(conn, account, Op::Release { reservation }).map(|_| ())
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
    let mut runner = TestRunner::new(property_config(cases));
    runner
        .run(&proptest::collection::vec(step(), 1..40), |steps| {
            run(&mut conn.borrow_mut(), &steps);
            Ok(())
        })
        .expect("property holds");
}
