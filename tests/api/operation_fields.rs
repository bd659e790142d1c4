//! The fields each operation must carry, and may not carry, at the
//! engine's boundary (`engine_op_incomplete`, `src/engine/sql/70_apply.sql`;
//! the list at `engine_apply`): a complete operation of every kind is
//! accepted, and leaving out any field its kind needs, or adding one it may
//! not carry, is refused. The expectations are written here from that
//! list, not read from the function.

use diesel::prelude::*;
use diesel::sql_types::{Bool, Nullable, Text};
use serde_json::{json, Map, Value};

use token_billing::engine::install::SCHEMA;

use crate::helpers::TestDatabase;

/// A complete operation of each kind (fields by name, the others NULL),
/// and the fields of it that its kind needs.
fn complete() -> Vec<(Value, Vec<&'static str>)> {
    let id = "6f2c8e4a-3c1d-4b7e-9a55-0d1e2f3a4b5c";
    let common = json!({"account": id, "actor": "test", "authorized": true});
    let with = |fields: Value| changed(&common, fields);
    let need = |own: &[&'static str]| [&["account", "actor", "authorized"], own].concat();
    vec![
        (
            with(json!({"op": "reserve", "request": id, "amount": 5, "ttl": 60, "new_id": id})),
            need(&["request", "amount", "ttl", "new_id"]),
        ),
        (
            with(
                json!({"op": "create_job", "request": id, "amount": 5, "ttl": 60,
                        "new_id": id, "job": id, "hash": "\\x00", "kind": "image",
                        "params": {}}),
            ),
            need(&[
                "request", "amount", "ttl", "new_id", "job", "hash", "kind", "params",
            ]),
        ),
        (
            with(json!({"op": "commit", "reservation": id, "amount": 3})),
            need(&["reservation", "amount"]),
        ),
        (
            with(json!({"op": "commit_all", "reservation": id})),
            need(&["reservation"]),
        ),
        (
            with(json!({"op": "release", "reservation": id})),
            need(&["reservation"]),
        ),
        (
            with(json!({"op": "extend", "reservation": id, "ttl": 60})),
            need(&["reservation", "ttl"]),
        ),
        (
            with(json!({"op": "expire", "reservation": id})),
            need(&["reservation"]),
        ),
        (
            with(
                json!({"op": "credit", "new_id": id, "amount": 5, "external_ref": "r",
                        "priority": 0}),
            ),
            need(&["new_id", "amount", "external_ref", "priority"]),
        ),
        (
            with(
                json!({"op": "adjust", "new_id": id, "amount": 5, "external_ref": "r",
                        "reason": "why", "priority": 0}),
            ),
            need(&["new_id", "amount", "external_ref", "reason", "priority"]),
        ),
        (
            with(json!({"op": "finish_job", "job": id, "lease_token": 1,
                        "status": "succeeded", "result": {}})),
            need(&["job", "lease_token", "status", "result"]),
        ),
    ]
}

/// engine_op_incomplete of `op` (NULL answers are refusals too: the
/// entry point refuses when the answer IS NOT FALSE).
fn refused(conn: &mut PgConnection, op: &Value) -> bool {
    #[derive(QueryableByName)]
    struct Answer {
        #[diesel(sql_type = Nullable<Bool>)]
        incomplete: Option<bool>,
    }
    let answer: Answer = diesel::sql_query(format!(
        "SELECT {SCHEMA}.engine_op_incomplete(
                    jsonb_populate_record(NULL::{SCHEMA}.engine_request, $1::jsonb)) AS incomplete"
    ))
    .bind::<Text, _>(op.to_string())
    .get_result(conn)
    .expect("engine_op_incomplete");
    answer.incomplete != Some(false)
}

fn changed(op: &Value, fields: Value) -> Value {
    let mut op: Map<String, Value> = op.as_object().expect("object").clone();
    op.extend(fields.as_object().expect("object").clone());
    Value::Object(op)
}

#[test]
fn each_operation_needs_its_fields_and_carries_no_other() {
    let database = TestDatabase::create();
    let mut conn = database.connect();
    for (op, needed) in complete() {
        assert!(!refused(&mut conn, &op), "complete, accepted: {op}");
        for field in needed {
            let without = changed(&op, json!({ field: null }));
            assert!(refused(&mut conn, &without), "without {field}: {without}");
        }
        let kind = op["op"].as_str().expect("op").to_owned();
        // A caller's key, instead of the service's word: only a spend or a
        // settlement by the API may carry one, and then both its parts.
        let keyed = changed(
            &op,
            json!({"authorized": false, "key_id": op["account"], "key_hash": "\\x01"}),
        );
        let by_key = [
            "reserve",
            "create_job",
            "commit",
            "commit_all",
            "release",
            "extend",
        ];
        assert_eq!(
            refused(&mut conn, &keyed),
            !by_key.contains(&kind.as_str()),
            "with a key: {keyed}"
        );
        if by_key.contains(&kind.as_str()) {
            let half = changed(&keyed, json!({"key_hash": null}));
            assert!(refused(&mut conn, &half), "half a key: {half}");
        }
        // A grant's expiry and price: only a credit or a positive adjustment.
        let grant = ["credit", "adjust"].contains(&kind.as_str());
        for extra in [
            json!({"expires_at": "2027-01-01T00:00:00Z"}),
            json!({"amount_paid": 100, "currency": "EUR"}),
        ] {
            let with_extra = changed(&op, extra);
            assert_eq!(
                refused(&mut conn, &with_extra),
                !grant,
                "grant fields: {with_extra}"
            );
        }
        // A price is an amount and its currency, both or neither.
        let half_price = changed(&op, json!({"amount_paid": 100}));
        assert!(
            refused(&mut conn, &half_price),
            "half a price: {half_price}"
        );
    }
    let ops = complete();
    let find = |kind: &str| {
        ops.iter()
            .find(|(op, _)| op["op"] == kind)
            .expect("kind")
            .0
            .clone()
    };
    for (op, refuse, why) in [
        (
            changed(&find("release"), json!({"op": "refund"})),
            true,
            "an unknown kind",
        ),
        (
            changed(&find("release"), json!({"op": null})),
            true,
            "no kind",
        ),
        (
            changed(&find("commit_all"), json!({"amount": 3})),
            true,
            "commit_all with an amount",
        ),
        (
            changed(&find("adjust"), json!({"amount": -5})),
            true,
            "a removal with a priority",
        ),
        (
            changed(&find("adjust"), json!({"amount": -5, "priority": null})),
            false,
            "a removal without one",
        ),
        (
            changed(&find("finish_job"), json!({"status": "running"})),
            true,
            "an unfinished status",
        ),
        (
            changed(&find("finish_job"), json!({"status": "failed"})),
            true,
            "a failure with a result",
        ),
        (
            changed(
                &find("finish_job"),
                json!({"status": "failed", "result": null}),
            ),
            false,
            "a failure without one",
        ),
        (
            changed(&find("finish_job"), json!({"status": null})),
            true,
            "no status",
        ),
        (
            changed(
                &find("commit"),
                json!({"authorized": false, "key_id": find("commit")["account"],
                       "key_hash": "\\x01", "job": find("commit")["account"]}),
            ),
            true,
            "a job's settlement by a key",
        ),
    ] {
        assert_eq!(refused(&mut conn, &op), refuse, "{why}: {op}");
    }
}
