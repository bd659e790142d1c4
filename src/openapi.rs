//! The OpenAPI 3.1 document of the HTTP API, generated at compile time from
//! the handlers' `#[utoipa::path]` annotations and the types' `ToSchema`.
//!
//! Rules: every route that `routes::configure` registers is listed in
//! `paths(...)`, and nothing else (tests/api/openapi.rs checks both ways);
//! every `/v1` operation requires the `bearer` scheme and documents its 401
//! and each other status it can answer, errors as `Problem`. Request bodies
//! are private to their route files and reach `components` through the
//! paths that use them; the public response types are listed here.

use std::sync::LazyLock;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::domain::{
    accounts, api_keys, audit, checks, credits, events, history, idempotency, jobs, ledger,
};
use crate::domain::{
    grants, key_budgets, reconciliation, reservations, revenue, system, topups, usage,
};
use crate::engine::types;
use crate::error::{ApiError, ExistingBooking, Problem, ProblemCode};
use crate::routes;
use crate::webhooks::endpoints;

mod event_schemas;
mod problems;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "token-billing",
        version = env!("CARGO_PKG_VERSION"),
        description = "Prepaid token billing for AI photo kiosks: reserve, commit, release, \
            with an append-only ledger.\n\n\
            Every `/v1` endpoint takes `Authorization: Bearer <key>`: the bootstrap \
            `ADMIN_API_KEY`, or a key from `POST /v1/api-keys` (admin, finance) or \
            `POST /v1/accounts/{account_id}/api-keys` (kiosk). A kiosk key sees only its \
            own account: any other account id is 404. Errors are RFC 9457 \
            `application/problem+json`; branch on `code`.",
    ),
    paths(
        routes::health::healthz,
        routes::health::readyz,
        routes::health::metrics_endpoint,
        routes::docs::openapi_json,
        routes::docs::swagger_ui,
        routes::docs::swagger_ui_asset,
        routes::accounts::create_account,
        routes::accounts::list_accounts,
        routes::accounts::get_account,
        routes::accounts::update_account,
        routes::accounts::create_kiosk_key,
        routes::accounts::list_ledger,
        routes::accounts::list_grants,
        routes::api_keys::create_key,
        routes::api_keys::list_keys,
        routes::api_keys::revoke_key,
        routes::audit::list_audit_events,
        routes::credits::create_credit,
        routes::credits::create_adjustment,
        routes::topups::create_rule,
        routes::topups::list_rules,
        routes::topups::get_rule,
        routes::topups::update_rule,
        routes::topups::delete_rule,
        routes::reservations::create_reservation,
        routes::reservations::get_reservation,
        routes::reservations::commit_reservation,
        routes::reservations::release_reservation,
        routes::reservations::extend_reservation,
        routes::jobs::create_job,
        routes::jobs::get_job,
        routes::jobs::list_jobs,
        routes::reconciliation::get_reconciliation,
        routes::revenue::get_revenue,
        routes::api_keys::update_key,
        routes::revenue::get_deferred,
        routes::usage::get_usage,
        routes::events::list_events,
        routes::webhooks::create_endpoint,
        routes::webhooks::list_endpoints,
        routes::webhooks::get_endpoint,
        routes::webhooks::update_endpoint,
        routes::webhooks::delete_endpoint,
        routes::webhooks::rotate_secret,
        routes::webhooks::list_attempts,
        routes::webhooks::redeliver,
        routes::reservations::list_reservations,
        routes::system::system_summary,
        routes::system::who_am_i,
        routes::console::console_page,
        routes::console::console_asset,
    ),
    components(schemas(
        Problem,
        ExistingBooking,
        ProblemCode,
        accounts::AccountView,
        accounts::Warning,
        accounts::AccountPage,
        history::BalancesAsOf,
        history::BalancesAsOfPage,
        api_keys::CreatedApiKey,
        idempotency::ReplayedApiKey,
        api_keys::Scope,
        api_keys::ApiKeyView,
        api_keys::ApiKeyPage,
        audit::AuditEventView,
        audit::AuditPage,
        credits::CreditView,
        credits::AdjustmentView,
        ledger::LedgerPage,
        ledger::LedgerEntryView,
        reservations::ReservationView,
        reservations::ReservationPage,
        reservations::Draw,
        grants::GrantView,
        grants::GrantPage,
        topups::TopupRuleBody,
        topups::TopupRuleView,
        topups::Rollover,
        topups::TopupFiringView,
        topups::TopupRulePage,
        topups::Trigger,
        topups::Period,
        topups::Method,
        topups::Mode,
        topups::RuleStatus,
        system::DatabaseSummary,
        routes::system::SystemSummary,
        routes::system::ReplicaSummary,
        routes::system::WhoAmI,
        jobs::JobView,
        jobs::JobReservation,
        jobs::JobPage,
        reconciliation::Report,
        reconciliation::InstantParam,
        reconciliation::AccountLine,
        reconciliation::Totals,
        reconciliation::RuleCredits,
        revenue::RevenueReport,
        key_budgets::KeyBudget,
        key_budgets::BudgetSpec,
        key_budgets::BudgetPeriod,
        revenue::RevenueAccount,
        revenue::CurrencyLine,
        revenue::TokenFigures,
        revenue::DayLine,
        revenue::DeferredReport,
        revenue::DeferredLine,
        revenue::DeferredTotal,
        usage::UsageReport,
        usage::UsageLine,
        usage::UsageFigures,
        usage::GroupBy,
        checks::Discrepancy,
        events::EventView,
        events::EventPage,
        endpoints::EndpointView,
        endpoints::EndpointWithSecret,
        endpoints::EndpointPage,
        endpoints::AttemptView,
        endpoints::AttemptPage,
        endpoints::DeliveryView,
        types::AccountId,
        types::ReservationId,
        types::RequestId,
        types::ApiKeyId,
        types::Tokens,
        types::SignedTokens,
        types::TtlSeconds,
        types::Priority,
        types::Name,
        types::Label,
        types::ExternalRef,
        types::Reason,
        types::Note,
    )),
    modifiers(&BearerScheme, &Links),
    tags(
        (name = "accounts", description = "Accounts, their balances and their ledger"),
        (name = "api-keys", description = "Admin, finance and kiosk keys"),
        (name = "events", description = "The event feed: what happened to the money"),
        (name = "webhooks", description = "Webhook endpoints, signed deliveries, the delivery log"),
        (name = "credits", description = "Top-ups and adjustments (admin)"),
        (name = "topups", description = "Automatic top-up rules: a threshold or a schedule credits the account, or asks the customer's billing to (docs/topups.md)"),
        (name = "audit", description = "Who changed what (admin, finance)"),
        (name = "reservations", description = "Reserve, commit, release, extend"),
        (name = "jobs", description = "Generation jobs paid from a reservation"),
        (name = "reconciliation", description = "Finance reports"),
        (name = "system", description = "The state of the service (admin, finance)"),
        (name = "console", description = "The operator and finance console, no key to load it"),
        (name = "health", description = "Probes and metrics, no key"),
        (name = "docs", description = "This document and Swagger UI, no key"),
    ),
)]
pub struct ApiDoc;

/// The `bearer` scheme that every `/v1` operation names in its `security`.
/// Keys are opaque strings, not JWTs, hence no `bearerFormat`.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        // What every /v1 operation can answer, documented once here rather
        // than on each handler: 401, 429 (every key is rate limited), 500, 503.
        let problem = |description: &str| {
            ResponseBuilder::new().description(description).content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
        };
        let retry_after = || {
            utoipa::openapi::header::Header::new(
                utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::Type::Integer),
            )
        };
        let common = [
            (
                "401",
                problem("Missing, unknown or revoked API key").build(),
            ),
            (
                "500",
                problem("Internal error; nothing was changed").build(),
            ),
            (
                "503",
                problem("Database unreachable, switching to a new primary or unable to write (a full disk); retry the same request (idempotent)")
                    .header("Retry-After", retry_after())
                    .build(),
            ),
        ];
        let rate_limited = ResponseBuilder::new()
            .description("`rate_limited`: this API key is over its request rate; retry after `Retry-After` seconds")
            .header("Retry-After", utoipa::openapi::header::Header::new(utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::Type::Integer)))
            .content(
                "application/problem+json",
                ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
            )
            .build();
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                let responses = &mut operation.responses.responses;
                responses
                    .entry("429".to_owned())
                    .or_insert_with(|| rate_limited.clone().into());
                for (status, response) in &common {
                    responses
                        .entry((*status).to_owned())
                        .or_insert_with(|| response.clone().into());
                }
            }
        }
    }
}

/// OpenAPI links: from what a creation answers to the operations that take
/// it next (a reservation → get, commit, release, extend; a job → its
/// status; an account → its balance, credits, keys, ledger; a key → its
/// revocation), so that generated clients and stateful testers can follow
/// them. Each entry: (path, method, statuses, link name, target operation
/// id, [(target parameter, runtime expression)]).
type LinkSpec = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const ACCOUNT_FROM_BODY: (&str, &str) = ("account_id", "$response.body#/account_id");
const RESERVATION_FROM_BODY: [(&str, &str); 2] = [
    ACCOUNT_FROM_BODY,
    ("reservation_id", "$response.body#/reservation_id"),
];
const KEY_FROM_BODY: [(&str, &str); 1] = [("key_id", "$response.body#/key_id")];

pub const LINKS: &[LinkSpec] = &[
    (
        "/v1/accounts/{account_id}/reservations",
        "post",
        &["201", "200"],
        "GetReservation",
        "get_reservation",
        &RESERVATION_FROM_BODY,
    ),
    (
        "/v1/accounts/{account_id}/reservations",
        "post",
        &["201", "200"],
        "CommitReservation",
        "commit_reservation",
        &RESERVATION_FROM_BODY,
    ),
    (
        "/v1/accounts/{account_id}/reservations",
        "post",
        &["201", "200"],
        "ReleaseReservation",
        "release_reservation",
        &RESERVATION_FROM_BODY,
    ),
    (
        "/v1/accounts/{account_id}/reservations",
        "post",
        &["201", "200"],
        "ExtendReservation",
        "extend_reservation",
        &RESERVATION_FROM_BODY,
    ),
    (
        "/v1/accounts/{account_id}/jobs",
        "post",
        &["201", "200"],
        "GetJob",
        "get_job",
        &[
            ACCOUNT_FROM_BODY,
            ("request_id", "$response.body#/request_id"),
        ],
    ),
    (
        "/v1/accounts",
        "post",
        &["201", "200"],
        "GetAccount",
        "get_account",
        &[ACCOUNT_FROM_BODY],
    ),
    (
        "/v1/accounts",
        "post",
        &["201", "200"],
        "UpdateAccount",
        "update_account",
        &[ACCOUNT_FROM_BODY],
    ),
    (
        "/v1/accounts",
        "post",
        &["201", "200"],
        "CreateCredit",
        "create_credit",
        &[ACCOUNT_FROM_BODY],
    ),
    (
        "/v1/accounts",
        "post",
        &["201", "200"],
        "CreateKioskKey",
        "create_kiosk_key",
        &[ACCOUNT_FROM_BODY],
    ),
    (
        "/v1/accounts",
        "post",
        &["201", "200"],
        "ListLedger",
        "list_ledger",
        &[ACCOUNT_FROM_BODY],
    ),
    (
        "/v1/api-keys",
        "post",
        &["201", "200"],
        "RevokeKey",
        "revoke_key",
        &KEY_FROM_BODY,
    ),
    (
        "/v1/accounts/{account_id}/api-keys",
        "post",
        &["201", "200"],
        "RevokeKey",
        "revoke_key",
        &KEY_FROM_BODY,
    ),
];

struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::link::LinkBuilder;
        use utoipa::openapi::RefOr;
        for (path, method, statuses, name, target, parameters) in LINKS {
            let Some(item) = openapi.paths.paths.get_mut(*path) else {
                continue;
            };
            let operation = match *method {
                "post" => item.post.as_mut(),
                "get" => item.get.as_mut(),
                _ => None,
            };
            let Some(operation) = operation else {
                continue;
            };
            for status in *statuses {
                if let Some(RefOr::T(response)) = operation.responses.responses.get_mut(*status) {
                    let link = parameters
                        .iter()
                        .fold(
                            LinkBuilder::new().operation_id(*target),
                            |link, (parameter, expression)| link.parameter(*parameter, *expression),
                        )
                        .build();
                    response.links.insert((*name).to_owned(), RefOr::T(link));
                }
            }
        }
    }
}

/// The document is the same for the life of the process: built and
/// serialized once, on first request.
static DOCUMENT: LazyLock<Result<String, String>> = LazyLock::new(|| {
    let mut document =
        serde_json::to_value(ApiDoc::openapi()).map_err(|error| error.to_string())?;
    camel_case_links(&mut document);
    for_generators(&mut document);
    event_schemas::add(&mut document);
    problems::add(&mut document);
    always_sent_required(&mut document);
    if let Some(document) = document.as_object_mut() {
        // Relative: the service that serves this document. Generators
        // (hey-api) type the client's base URL from it.
        document.insert(
            "servers".to_owned(),
            serde_json::json!([{
                "url": "/",
                "description": "The service that serves this document; a client is given its \
                    deployment's base URL (such as http://127.0.0.1:8080)"
            }]),
        );
    }
    // An adjustment is never 0; utoipa's schema builder has no `not`.
    if let Some(signed) = document
        .pointer_mut("/components/schemas/SignedTokens")
        .and_then(serde_json::Value::as_object_mut)
    {
        signed.insert("not".to_owned(), serde_json::json!({"const": 0}));
    }
    serde_json::to_string(&document).map_err(|error| error.to_string())
});

/// The states clients branch on, each a string with its values listed:
/// (component name, description, values).
fn state_enums() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    use crate::db::states::{AccountStatus, EventType, JobStatus, ReservationState};
    use crate::domain::grants::GrantStatus;
    fn texts<T: Copy + Into<&'static str>>(all: &[T]) -> Vec<&'static str> {
        all.iter().map(|value| (*value).into()).collect()
    }
    vec![
        (
            "JobStatus",
            "A job's status: `queued` → `running` → `succeeded` or `failed` (the last two are \
             final).",
            texts(JobStatus::ALL),
        ),
        (
            "ReservationState",
            "Where a reservation's tokens are: `held` until exactly one of commit \
             (`committed`), release (`released`) or expiry (`expired`).",
            texts(ReservationState::ALL),
        ),
        (
            "AccountStatus",
            "Whether an account may spend.",
            texts(AccountStatus::ALL),
        ),
        (
            "GrantStatus",
            "`active` while a grant holds tokens, `depleted` once spent, `expired` once lapsed.",
            texts(GrantStatus::ALL),
        ),
        (
            "EventType",
            "What an event reports (docs/webhooks.md).",
            texts(EventType::ALL),
        ),
    ]
}

/// Where the states are used: (schema, property, state component).
const STATE_PROPERTIES: [(&str, &str, &str); 8] = [
    ("Problem", "state", "ReservationState"),
    ("ReplayedApiKey", "scope", "Scope"),
    ("JobView", "status", "JobStatus"),
    ("JobReservation", "state", "ReservationState"),
    ("ReservationView", "state", "ReservationState"),
    ("AccountView", "status", "AccountStatus"),
    ("UpdateAccount", "status", "AccountStatus"),
    ("GrantView", "status", "GrantStatus"),
];

/// Closed sets of strings written by the service itself, each in one
/// place of the code or a `CHECK` (the comment names it): (schema,
/// property, values).
const CLOSED_STRINGS: [(&str, &str, &[&str]); 12] = [
    // topup_firings.outcome and .state CHECKs.
    (
        "TopupFiringView",
        "outcome",
        &["granted", "requested", "cap_reached", "skipped"],
    ),
    (
        "TopupFiringView",
        "state",
        &["open", "fulfilled", "expired"],
    ),
    // domain::reconciliation (a report and each account line).
    ("Report", "status", &["ok", "mismatch"]),
    ("AccountLine", "status", &["ok", "mismatch"]),
    ("RevenueReport", "status", &["ok", "mismatch"]),
    ("RevenueAccount", "status", &["ok", "mismatch"]),
    ("DeferredReport", "status", &["ok", "mismatch"]),
    // webhook_deliveries.status CHECK; webhooks::delivery's outcomes.
    (
        "DeliveryView",
        "status",
        &["pending", "delivered", "failed"],
    ),
    (
        "AttemptView",
        "outcome",
        &["delivered", "retrying", "exhausted", "endpoint_gone"],
    ),
    // ledger_entries.kind CHECK.
    (
        "LedgerEntryView",
        "kind",
        &[
            "credit",
            "adjustment",
            "reserve",
            "commit",
            "release",
            "expire",
            "grant_expire",
        ],
    ),
    // routes::health, routes::system.
    ("ProbeStatus", "status", &["ok", "ready"]),
    (
        "SystemSummary",
        "invariant_status",
        &["unknown", "ok", "violated"],
    ),
];

/// Query parameters that take a state: (path, parameter, state component).
const STATE_PARAMETERS: [(&str, &str, &str); 5] = [
    ("/v1/accounts/{account_id}/grants", "status", "GrantStatus"),
    ("/v1/accounts/{account_id}/jobs", "status", "JobStatus"),
    (
        "/v1/accounts/{account_id}/reservations",
        "state",
        "ReservationState",
    ),
    ("/v1/accounts", "status", "AccountStatus"),
    ("/v1/events", "type", "EventType"),
];

/// Makes the document one that code generators (openapi-typescript,
/// @hey-api/openapi-ts, openapi-generator) read as the service behaves:
/// every state is an `enum` component (a misspelled status does not
/// compile); an object whose members are the client's or the provider's
/// (`params`, a job's `output`, an event's `data`, an audit event's
/// `before`) says `additionalProperties: true`, since generators read a
/// bare `{"type": "object"}` as an object with nothing in it; a job's
/// `result` and `error` have their own schemas; a replayable creation's
/// 200 declares `Idempotent-Replayed`, and every 429 and 503 `Retry-After`.
fn for_generators(document: &mut serde_json::Value) {
    use serde_json::{json, Value};
    let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, description, values) in state_enums() {
        schemas.insert(
            name.to_owned(),
            json!({"type": "string", "description": description, "enum": values}),
        );
    }
    schemas.insert(
        "JobResult".to_owned(),
        json!({
            "type": "object",
            "description": "What a succeeded job produced.",
            "required": ["output"],
            "properties": {
                "output": {
                    "description": "The provider's output as it answered it (typically the \
                        image URL or a list of them); any JSON value."
                },
                "provider_job_id": {
                    "type": "string",
                    "description": "The provider's id of the generation."
                }
            },
            "additionalProperties": true
        }),
    );
    schemas.insert(
        "JobError".to_owned(),
        json!({
            "type": "object",
            "description": "Why a failed job failed; its tokens were released, never charged.",
            "required": ["code", "message"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "`provider_timeout`, `provider_rejected`, `provider_failed`, \
                        `provider_unavailable`, `attempts_exhausted`, `reservation_expired`; \
                        new codes may appear: treat an unknown one as a failure.",
                    "examples": ["provider_rejected"]
                },
                "message": {
                    "type": "string",
                    "description": "What a kiosk may show; never the provider's internals."
                }
            },
            "additionalProperties": true
        }),
    );
    for (schema, property, state) in STATE_PROPERTIES {
        if let Some(slot) = schemas
            .get_mut(schema)
            .and_then(|schema| schema.get_mut("properties"))
            .and_then(|properties| properties.get_mut(property))
        {
            let description = slot.get("description").cloned();
            let nullable = slot
                .get("type")
                .and_then(Value::as_array)
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "null"));
            let state = json!({"$ref": format!("#/components/schemas/{state}")});
            // An optional member stays nullable: a PATCH's `"status": null`
            // leaves the status as it is, as for its other members.
            let mut reference = if nullable {
                json!({"oneOf": [state, {"type": "null"}]})
            } else {
                state
            };
            if let Some(description) = description {
                // OpenAPI 3.1: a $ref may have a description beside it.
                reference["description"] = description;
            }
            *slot = reference;
        }
    }
    for (schema, property, values) in CLOSED_STRINGS {
        if let Some(slot) = schemas
            .get_mut(schema)
            .and_then(|schema| schema.get_mut("properties"))
            .and_then(|properties| properties.get_mut(property))
            .and_then(Value::as_object_mut)
        {
            let nullable = slot
                .get("type")
                .and_then(Value::as_array)
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "null"));
            let mut listed: Vec<Value> = values.iter().map(|value| json!(value)).collect();
            if nullable {
                listed.push(Value::Null);
            }
            slot.insert("enum".to_owned(), Value::Array(listed));
        }
    }
    for (property, component) in [("result", "JobResult"), ("error", "JobError")] {
        if let Some(slot) = schemas
            .get_mut("JobView")
            .and_then(|schema| schema.get_mut("properties"))
            .and_then(|properties| properties.get_mut(property))
        {
            let description = slot.get("description").cloned();
            let mut nullable = json!({"oneOf": [
                {"$ref": format!("#/components/schemas/{component}")},
                {"type": "null"}
            ]});
            if let Some(description) = description {
                nullable["description"] = description;
            }
            *slot = nullable;
        }
    }
    open_objects(document);
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, parameter, state) in STATE_PARAMETERS {
        let parameters = paths
            .get_mut(path)
            .and_then(|item| item.get_mut("get"))
            .and_then(|operation| operation.get_mut("parameters"))
            .and_then(Value::as_array_mut);
        for slot in parameters.into_iter().flatten() {
            if slot["name"] == parameter {
                slot["schema"] = json!({"$ref": format!("#/components/schemas/{state}")});
            }
        }
    }
    // As the wire has it (a header is text): a string of digits, seconds.
    let seconds_header = |description: &str| {
        json!({"description": description, "schema": {
            "type": "string", "pattern": "^[0-9]+$", "examples": ["1"]
        }})
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for (method, operation) in item.iter_mut() {
            let Some(responses) = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            let replayable =
                method == "post" && responses.contains_key("201") && responses.contains_key("200");
            for (status, response) in responses.iter_mut() {
                let Some(response) = response.as_object_mut() else {
                    continue;
                };
                let headers = response
                    .entry("headers")
                    .or_insert_with(|| json!({}))
                    .as_object_mut();
                let Some(headers) = headers else { continue };
                if replayable && status == "200" {
                    headers.insert(
                        "Idempotent-Replayed".to_owned(),
                        json!({
                            "description": "`true`: this answers an earlier identical request; \
                                nothing new was created.",
                            "schema": {"type": "string", "enum": ["true"]}
                        }),
                    );
                }
                if status == "429" || status == "503" {
                    headers.insert(
                        "Retry-After".to_owned(),
                        seconds_header(
                            "Seconds to wait before retrying the same request (digits).",
                        ),
                    );
                }
                if headers.is_empty() {
                    response.remove("headers");
                }
            }
        }
    }
}

/// The schemas of answers only (reached from a response, never from a
/// request body or parameter, `Problem` aside: its members are sent only
/// when they apply): every nullable member is always sent — as `null` when
/// it has no value — so it is `required` too, and a generator types it
/// `T | null`, not `T | null | undefined`. A member the service omits
/// (`skip_serializing_if`) is not nullable in the document, so it stays
/// optional.
fn always_sent_required(document: &mut serde_json::Value) {
    use serde_json::Value;
    use std::collections::BTreeSet;

    fn references(value: &Value, into: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    if let Some(name) = target.strip_prefix("#/components/schemas/") {
                        into.insert(name.to_owned());
                    }
                }
                map.values().for_each(|value| references(value, into));
            }
            Value::Array(items) => items.iter().for_each(|value| references(value, into)),
            _ => {}
        }
    }
    fn closure(document: &Value, mut names: BTreeSet<String>) -> BTreeSet<String> {
        let mut queue: Vec<String> = names.iter().cloned().collect();
        while let Some(name) = queue.pop() {
            let mut found = BTreeSet::new();
            if let Some(schema) = document.pointer(&format!("/components/schemas/{name}")) {
                references(schema, &mut found);
            }
            for name in found {
                if names.insert(name.clone()) {
                    queue.push(name);
                }
            }
        }
        names
    }
    fn nullable(property: &Value) -> bool {
        let null_type = |kind: &Value| {
            kind == "null"
                || kind
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "null"))
        };
        property.get("type").is_some_and(null_type)
            || ["oneOf", "anyOf"].iter().any(|key| {
                property
                    .get(*key)
                    .and_then(Value::as_array)
                    .is_some_and(|options| {
                        options.iter().any(|o| o.get("type").is_some_and(null_type))
                    })
            })
    }

    let (mut answers, mut asked) = (BTreeSet::new(), BTreeSet::new());
    if let Some(paths) = document.get("paths").and_then(Value::as_object) {
        for operation in paths
            .values()
            .filter_map(Value::as_object)
            .flat_map(|item| item.values())
        {
            if let Some(responses) = operation.get("responses") {
                references(responses, &mut answers);
            }
            for part in ["requestBody", "parameters"] {
                if let Some(part) = operation.get(part) {
                    references(part, &mut asked);
                }
            }
        }
    }
    let answers = closure(document, answers);
    let asked = closure(document, asked);
    let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for name in answers.difference(&asked) {
        if name == "Problem" {
            continue;
        }
        let Some(schema) = schemas.get_mut(name).and_then(Value::as_object_mut) else {
            continue;
        };
        let always: Vec<String> = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|properties| {
                properties
                    .iter()
                    .filter(|(_, property)| nullable(property))
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default();
        if always.is_empty() {
            continue;
        }
        let required = schema
            .entry("required")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(required) = required.as_array_mut() {
            for name in always {
                if !required.iter().any(|listed| listed == name.as_str()) {
                    required.push(Value::String(name));
                }
            }
        }
    }
}

/// `additionalProperties: true` on every object schema that names no
/// property: its members are the caller's or the provider's.
fn open_objects(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let is_object = match map.get("type") {
                Some(Value::String(kind)) => kind == "object",
                Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
                _ => false,
            };
            if is_object
                && !map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !map.contains_key("$ref")
            {
                map.insert("additionalProperties".to_owned(), Value::Bool(true));
            }
            for child in map.values_mut() {
                open_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(open_objects),
        _ => {}
    }
}

/// utoipa 5 writes a Link Object's fields in snake case (`operation_id`);
/// OpenAPI names them `operationId`, `operationRef`, `requestBody`.
fn camel_case_links(document: &mut serde_json::Value) {
    let Some(paths) = document
        .get_mut("paths")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    let links = paths
        .values_mut()
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses"))
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|responses| responses.values_mut())
        .filter_map(|response| response.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|links| links.values_mut())
        .filter_map(serde_json::Value::as_object_mut);
    for link in links {
        for (snake, camel) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(value) = link.remove(snake) {
                link.insert(camel.to_owned(), value);
            }
        }
    }
}

/// Path templates and their methods, for telling 405 from 404.
static ROUTES: LazyLock<Vec<(Vec<String>, Vec<&'static str>)>> = LazyLock::new(|| {
    ApiDoc::openapi()
        .paths
        .paths
        .iter()
        .map(|(path, item)| {
            let methods = [
                ("GET", item.get.is_some()),
                ("POST", item.post.is_some()),
                ("PUT", item.put.is_some()),
                ("PATCH", item.patch.is_some()),
                ("DELETE", item.delete.is_some()),
            ];
            let segments = path.split('/').map(str::to_owned).collect();
            (
                segments,
                methods
                    .into_iter()
                    .filter(|(_, present)| *present)
                    .map(|(method, _)| method)
                    .collect(),
            )
        })
        .collect()
});

/// The methods a path accepts, when some route matches it.
pub fn allowed_methods(path: &str) -> Option<Vec<&'static str>> {
    let segments: Vec<&str> = path.split('/').collect();
    ROUTES.iter().find_map(|(template, methods)| {
        let matches = template.len() == segments.len()
            && template.iter().zip(&segments).all(|(expected, actual)| {
                if expected.starts_with('{') {
                    !actual.is_empty()
                } else {
                    expected == actual
                }
            });
        matches.then(|| methods.clone())
    })
}

/// The document as this replica serves it: a job's `kind` stays a string
/// (a client generated against one deployment must accept another's
/// kinds), and its description lists the kinds of this replica's
/// `PRICE_LIST` with their costs, as `examples` do.
pub fn document_with_prices(prices: &crate::config::PriceList) -> Result<String, ApiError> {
    let mut document: serde_json::Value = serde_json::from_str(document_json()?)
        .map_err(|error| ApiError::Internal(format!("reading the OpenAPI document: {error}")))?;
    if let Some(kind) = document
        .pointer_mut("/components/schemas/CreateJob/properties/kind")
        .and_then(serde_json::Value::as_object_mut)
    {
        let listed: Vec<String> = prices
            .iter()
            .map(|(kind, cost)| {
                format!(
                    "`{kind}` ({cost} token{})",
                    if *cost == 1 { "" } else { "s" }
                )
            })
            .collect();
        let described = kind
            .get("description")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        kind.insert(
            "description".to_owned(),
            format!(
                "{described}\n\nThis replica's kinds: {}. Another deployment may price other \
                 kinds: an unknown kind is 400 `invalid_request`.",
                listed.join(", ")
            )
            .into(),
        );
        kind.insert("examples".to_owned(), prices.keys().cloned().collect());
    }
    serde_json::to_string(&document)
        .map_err(|error| ApiError::Internal(format!("serializing the OpenAPI document: {error}")))
}

/// The serialized document, for `GET /openapi.json`.
pub fn document_json() -> Result<&'static str, ApiError> {
    DOCUMENT
        .as_deref()
        .map_err(|error| ApiError::Internal(format!("serializing the OpenAPI document: {error}")))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::config::{
        AMOUNT_MAX, JOB_PAGE_MAX, JOB_WAIT_SECONDS_MAX, LEDGER_PAGE_MAX, NAME_LENGTH_MAX,
        REASON_LENGTH_MAX, TTL_SECONDS_MAX,
    };
    use crate::domain::accounts::MAX_ACTIVE_RESERVATIONS_LIMIT;

    fn document() -> Value {
        serde_json::from_str(document_json().expect("document serializes")).expect("JSON")
    }

    fn query_parameter<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
        doc["paths"][path][method]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|parameter| parameter["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
    }

    fn as_i64(value: &Value) -> i64 {
        value
            .as_i64()
            .or_else(|| value.as_f64().map(|number| number as i64))
            .unwrap_or_else(|| panic!("{value} is a number"))
    }

    /// Bounds that `#[schema]`/`#[param]` can only take as literals must
    /// still equal the constants the handlers enforce.
    #[test]
    fn literal_bounds_match_the_enforced_limits() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for body in ["CreateAccount", "UpdateAccount"] {
            assert_eq!(
                as_i64(&schemas[body]["properties"]["max_active_reservations"]["maximum"]),
                i64::from(MAX_ACTIVE_RESERVATIONS_LIMIT),
                "{body}"
            );
        }
        let ledger = "/v1/accounts/{account_id}/ledger";
        let limit = query_parameter(&doc, ledger, "get", "limit");
        assert_eq!(as_i64(&limit["schema"]["maximum"]), LEDGER_PAGE_MAX);
        let jobs = "/v1/accounts/{account_id}/jobs";
        let limit = query_parameter(&doc, jobs, "get", "limit");
        assert_eq!(as_i64(&limit["schema"]["maximum"]), JOB_PAGE_MAX);
        let job = "/v1/accounts/{account_id}/jobs/{request_id}";
        let wait = query_parameter(&doc, job, "get", "wait_seconds");
        assert_eq!(
            as_i64(&wait["schema"]["maximum"]),
            i64::try_from(JOB_WAIT_SECONDS_MAX).expect("small")
        );
    }

    /// Every link leads from an operation that exists to one that exists,
    /// filling exactly the target's path parameters from fields the
    /// response has.
    #[test]
    fn links_lead_to_real_operations_and_parameters() {
        let doc = document();
        let mut targets = std::collections::BTreeMap::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for operation in item.as_object().expect("item").values() {
                if let Some(id) = operation["operationId"].as_str() {
                    let parameters: Vec<String> = operation["parameters"]
                        .as_array()
                        .map(|parameters| {
                            parameters
                                .iter()
                                .filter(|p| p["in"] == "path")
                                .map(|p| p["name"].as_str().expect("name").to_owned())
                                .collect()
                        })
                        .unwrap_or_default();
                    targets.insert(id.to_owned(), (path.clone(), parameters));
                }
            }
        }
        let mut checked = 0;
        for (path, method, statuses, name, target, parameters) in LINKS {
            let (_, wanted) = targets
                .get(*target)
                .unwrap_or_else(|| panic!("{name}: no operation {target}"));
            let mut given: Vec<String> = parameters.iter().map(|(p, _)| (*p).to_owned()).collect();
            given.sort();
            let mut wanted = wanted.clone();
            wanted.sort();
            assert_eq!(
                given, wanted,
                "{name} fills the path parameters of {target}"
            );
            for status in *statuses {
                let response = &doc["paths"][path][method]["responses"][status];
                let link = &response["links"][name];
                assert_eq!(
                    link["operationId"], *target,
                    "{method} {path} {status} {name}"
                );
                let schema_name = response["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .and_then(|r| r.rsplit('/').next())
                    .unwrap_or_else(|| panic!("{method} {path} {status} has a JSON body"));
                for (_, expression) in *parameters {
                    let field = expression.trim_start_matches("$response.body#/");
                    assert!(
                        doc["components"]["schemas"][schema_name]["properties"][field].is_object(),
                        "{name}: {schema_name} has no {field}"
                    );
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 24);
    }

    #[test]
    fn newtypes_document_their_bounds() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(as_i64(&schemas["Tokens"]["minimum"]), 1);
        assert_eq!(as_i64(&schemas["Tokens"]["maximum"]), AMOUNT_MAX);
        assert_eq!(as_i64(&schemas["SignedTokens"]["minimum"]), -AMOUNT_MAX);
        assert_eq!(
            as_i64(&schemas["TtlSeconds"]["maximum"]),
            i64::from(TTL_SECONDS_MAX)
        );
        assert_eq!(schemas["AccountId"]["format"], "uuid");
        let name_max = i64::try_from(NAME_LENGTH_MAX).expect("small");
        let reason_max = i64::try_from(REASON_LENGTH_MAX).expect("small");
        for (text, max) in [
            ("Name", name_max),
            ("Label", name_max),
            ("ExternalRef", name_max),
            ("Reason", reason_max),
            ("Note", reason_max),
        ] {
            assert_eq!(as_i64(&schemas[text]["maxLength"]), max, "{text}");
        }
    }
}
