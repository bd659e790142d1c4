//! Events as the document types them: one schema per event type, its `type`
//! a single value and its `data` the members that type carries, joined in
//! `EventView` as a `oneOf` discriminated by `type` (the feed's items and
//! every webhook's body). A generated client narrows `data` by `type`, and
//! refuses a misspelled type at compile time.
//!
//! The members are the ones the writers put in `data` (docs/webhooks.md):
//! the engine's SQL (`engine_event_balances` and the events of
//! `engine_record`, `engine_grant_notices`, `engine_job_finished_events`,
//! the top-up functions), the reaper (`invariant.violated`) and webhook
//! delivery (`endpoint.disabled`). Each resource in `data` is the API's own
//! view of it, written by the same engine function (tests/api/representations.rs).

use serde_json::{json, Map, Value};

use crate::db::states::EventType;

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn nullable(schema: Value) -> Value {
    json!({"oneOf": [schema, {"type": "null"}]})
}

/// The component that names one event type: `account.balance_low` →
/// `AccountBalanceLowEvent`.
pub fn component_name(event_type: EventType) -> String {
    let mut name = String::new();
    for word in event_type.as_str().split(['.', '_']) {
        let mut letters = word.chars();
        if let Some(first) = letters.next() {
            name.extend(first.to_uppercase());
            name.push_str(letters.as_str());
        }
    }
    name.push_str("Event");
    name
}

/// What an event of this type carries in `data` besides the account's
/// common members (`account_id`, `balances`, `low_balance_threshold`),
/// whether it carries those, and when it is sent. Every member listed is
/// always written (as `null` where the schema says so). No wildcard: a new
/// event type does not compile until it is described here.
fn data_of(event_type: EventType) -> (bool, &'static str, Vec<(&'static str, Value)>) {
    let entry = || ("entry", reference("LedgerEntryView"));
    match event_type {
        EventType::BalanceLow => (
            true,
            "`available` went below the account's `low_balance_threshold` (once per \
             crossing); `entry` is the ledger entry that crossed, null for a threshold change.",
            vec![("entry", nullable(reference("LedgerEntryView")))],
        ),
        EventType::BalanceRecovered => (
            true,
            "`available` is back at or above the threshold; `entry` null for a threshold \
             change.",
            vec![("entry", nullable(reference("LedgerEntryView")))],
        ),
        EventType::BalanceDepleted => (true, "`available` reached 0.", vec![entry()]),
        EventType::CreditCreated => (
            true,
            "A credit (a top-up) was booked.",
            vec![("credit", reference("CreditView")), entry()],
        ),
        EventType::AdjustmentCreated => (
            true,
            "An adjustment was booked.",
            vec![("adjustment", reference("AdjustmentView")), entry()],
        ),
        EventType::ReservationExpired => (
            true,
            "A reservation expired unused; `entry` is its last return (`expire` or \
             `grant_expire`).",
            vec![("reservation", reference("ReservationView")), entry()],
        ),
        EventType::GrantExpired => (
            true,
            "Tokens of a credit grant lapsed (one per `grant_expire` entry).",
            vec![
                ("grant_id", json!({"type": "string", "format": "uuid"})),
                ("amount", json!({"type": "integer", "format": "int64"})),
                ("grant", reference("GrantView")),
                entry(),
            ],
        ),
        EventType::GrantExpiring => (
            true,
            "A grant lapses within GRANT_EXPIRING_NOTICE_HOURS and still holds tokens \
             (`amount`: remaining + reserved); once per grant.",
            vec![
                ("grant_id", json!({"type": "string", "format": "uuid"})),
                ("amount", json!({"type": "integer", "format": "int64"})),
                (
                    "expires_at",
                    json!({"type": "string", "format": "date-time"}),
                ),
                ("grant", reference("GrantView")),
            ],
        ),
        EventType::GrantRolledOver => (
            true,
            "A top-up rule's grant lapsed holding `unused` tokens and its rule's `rollover` \
             carried `tokens` = min(unused, `max_tokens`) into a new grant (`credit`); the \
             lapse itself is the `grant.expired` before it. Once per lapsed grant.",
            vec![
                ("grant_id", json!({"type": "string", "format": "uuid"})),
                ("unused", json!({"type": "integer", "format": "int64"})),
                ("tokens", json!({"type": "integer", "format": "int64"})),
                ("max_tokens", json!({"type": "integer", "format": "int64"})),
                ("grant", reference("GrantView")),
                ("credit", reference("CreditView")),
            ],
        ),
        EventType::TopupGranted => (
            true,
            "A top-up rule in mode `grant` credited the account.",
            vec![
                ("rule", reference("TopupRuleView")),
                ("firing", reference("TopupFiringView")),
                ("credit", reference("CreditView")),
            ],
        ),
        EventType::TopupRequested => (
            true,
            "A top-up rule in mode `request` asks the customer's billing to credit \
             `request.tokens` with `external_ref` = `request.firing_id`.",
            vec![
                ("rule", reference("TopupRuleView")),
                ("request", reference("TopupFiringView")),
            ],
        ),
        EventType::TopupRequestExpired => (
            true,
            "A top-up request got no credit within its rule's `request_ttl`; `next`: \
             `ask_again` (the next movement below the line asks again) or `none`; `rule` is \
             null once the rule is deleted.",
            vec![
                ("rule", nullable(reference("TopupRuleView"))),
                ("request", reference("TopupFiringView")),
                (
                    "next",
                    json!({"type": "string", "enum": ["ask_again", "none"]}),
                ),
            ],
        ),
        EventType::TopupCapReached => (
            true,
            "A top-up rule's firing would have passed its daily or monthly cap, so it added \
             nothing; once per rule and period.",
            vec![
                ("rule", reference("TopupRuleView")),
                (
                    "cap",
                    json!({
                        "type": "object",
                        "required": ["per", "period", "max_tokens", "used_tokens", "tokens"],
                        "properties": {
                            "per": {"type": "string", "enum": ["day", "month"]},
                            "period": {
                                "type": "string",
                                "description": "`day:YYYY-MM-DD` or `month:YYYY-MM`, in the \
                                    rule's time zone.",
                                "examples": ["day:2026-12-05"]
                            },
                            "max_tokens": {"type": "integer", "format": "int64"},
                            "used_tokens": {"type": "integer", "format": "int64"},
                            "tokens": {"type": "integer", "format": "int64"}
                        }
                    }),
                ),
            ],
        ),
        EventType::JobSucceeded => (
            true,
            "A generation job succeeded; its cost was committed.",
            vec![("job", reference("JobView"))],
        ),
        EventType::JobFailed => (
            true,
            "A generation job failed; its tokens were released.",
            vec![("job", reference("JobView"))],
        ),
        EventType::InvariantViolated => (
            false,
            "The reaper found the account's books not balancing (once per transition).",
            vec![
                ("account_id", json!({"type": "string", "format": "uuid"})),
                (
                    "discrepancies",
                    json!({"type": "array", "items": reference("Discrepancy")}),
                ),
            ],
        ),
        EventType::KeyBudgetLow | EventType::KeyBudgetExhausted => (
            false,
            if event_type == EventType::KeyBudgetLow {
                "A kiosk key spent `budget_low_percent` of its budget in the current period \
                 (once a period)."
            } else {
                "A kiosk key spent all of its budget in the current period (once a period): \
                 its reserves are refused with `key_budget_exhausted` until it resets."
            },
            vec![
                ("account_id", json!({"type": "string", "format": "uuid"})),
                ("key_id", json!({"type": "string", "format": "uuid"})),
                ("label", json!({"type": "string"})),
                ("budget", reference("KeyBudget")),
            ],
        ),
        EventType::EndpointDisabled => (
            false,
            "A webhook endpoint was disabled (410, or failing for \
             WEBHOOK_DISABLE_AFTER_HOURS); no account.",
            vec![
                ("endpoint_id", json!({"type": "string", "format": "uuid"})),
                (
                    "url",
                    json!({"type": "string",
                           "description": "`scheme://host[:port]/[redacted]`"}),
                ),
                ("reason", json!({"type": ["string", "null"]})),
                (
                    "failing_since",
                    json!({"type": ["string", "null"], "format": "date-time"}),
                ),
                ("last_status_code", json!({"type": ["integer", "null"]})),
                ("last_error", json!({"type": ["string", "null"]})),
            ],
        ),
    }
}

/// Adds the balances, one schema per event type and their union
/// `EventView` (replacing the open envelope), and the document's
/// `webhooks` entry: a delivery's body is an `EventView`.
pub fn add(document: &mut Value) {
    let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    schemas.insert(
        "EventBalances".to_owned(),
        json!({
            "type": "object",
            "description": "The account's balances after the movement the event reports.",
            "required": ["available", "reserved", "used", "credited", "adjusted"],
            "properties": {
                "available": {"type": "integer", "format": "int64"},
                "reserved": {"type": "integer", "format": "int64"},
                "used": {"type": "integer", "format": "int64"},
                "credited": {"type": "integer", "format": "int64"},
                "adjusted": {"type": "integer", "format": "int64"}
            }
        }),
    );
    let mut variants = Vec::new();
    let mut mapping = Map::new();
    for event_type in EventType::ALL {
        let (account, description, members) = data_of(*event_type);
        let mut properties = Map::new();
        let mut required = Vec::new();
        if account {
            for (name, schema) in [
                ("account_id", json!({"type": "string", "format": "uuid"})),
                ("balances", reference("EventBalances")),
                (
                    "low_balance_threshold",
                    json!({"type": "integer", "format": "int64"}),
                ),
            ] {
                properties.insert(name.to_owned(), schema);
                required.push(name);
            }
        }
        for (name, schema) in members {
            properties.insert(name.to_owned(), schema);
            required.push(name);
        }
        let name = component_name(*event_type);
        schemas.insert(
            name.clone(),
            json!({
                "type": "object",
                "description": format!("`{}`: {description}", event_type.as_str()),
                "required": ["id", "type", "created_at", "data"],
                "properties": {
                    "id": {
                        "type": "string", "format": "uuid",
                        "description": "The event's id: `webhook-id` of every delivery of it."
                    },
                    "type": {"type": "string", "enum": [event_type.as_str()]},
                    "created_at": {"type": "string", "format": "date-time"},
                    "data": {
                        "type": "object",
                        "required": required,
                        "properties": properties,
                        "additionalProperties": true
                    }
                }
            }),
        );
        let target = format!("#/components/schemas/{name}");
        mapping.insert(event_type.as_str().to_owned(), json!(target));
        variants.push(json!({"$ref": target}));
    }
    schemas.insert(
        "EventView".to_owned(),
        json!({
            "description": "One event, as the feed lists it and a webhook delivers it: one \
                schema per `type` (docs/webhooks.md). New members may be added to `data`.",
            "oneOf": variants,
            "discriminator": {"propertyName": "type", "mapping": mapping}
        }),
    );
    if let Some(document) = document.as_object_mut() {
        document.insert(
            "webhooks".to_owned(),
            json!({
                "event": {
                    "post": {
                        "summary": "An event, delivered to a webhook endpoint",
                        "description": "POSTed to each endpoint subscribed to its type, signed \
                            as Standard Webhooks says (docs/webhooks.md). Answer 2xx; anything \
                            else is retried, 410 disables the endpoint.",
                        "parameters": [
                            {"name": "webhook-id", "in": "header", "required": true,
                             "description": "The event's `id`, the same on every attempt.",
                             "schema": {"type": "string", "format": "uuid"}},
                            {"name": "webhook-timestamp", "in": "header", "required": true,
                             "description": "Unix seconds of this attempt.",
                             "schema": {"type": "string", "pattern": "^[0-9]+$"}},
                            {"name": "webhook-signature", "in": "header", "required": true,
                             "description": "`v1,<base64 HMAC-SHA256>`; during a rotation two, \
                                space-separated.",
                             "schema": {"type": "string"}}
                        ],
                        "requestBody": {
                            "required": true,
                            "content": {"application/json": {"schema": reference("EventView")}}
                        },
                        "responses": {
                            "2XX": {"description": "Delivered."},
                            "410": {"description": "Disables the endpoint."}
                        }
                    }
                }
            }),
        );
    }
}
