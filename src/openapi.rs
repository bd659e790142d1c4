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
use crate::domain::{grants, reconciliation, reservations, system, types};
use crate::error::{ApiError, ExistingBooking, Problem, ProblemCode};
use crate::routes;
use crate::webhooks::endpoints;

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
        routes::reservations::create_reservation,
        routes::reservations::get_reservation,
        routes::reservations::commit_reservation,
        routes::reservations::release_reservation,
        routes::reservations::extend_reservation,
        routes::jobs::create_job,
        routes::jobs::get_job,
        routes::jobs::list_jobs,
        routes::reconciliation::get_reconciliation,
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
                problem("Database unreachable or switching to a new primary; retry the same request (idempotent)")
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
    // An adjustment is never 0; utoipa's schema builder has no `not`.
    if let Some(signed) = document
        .pointer_mut("/components/schemas/SignedTokens")
        .and_then(serde_json::Value::as_object_mut)
    {
        signed.insert("not".to_owned(), serde_json::json!({"const": 0}));
    }
    serde_json::to_string(&document).map_err(|error| error.to_string())
});

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

/// The document as this replica serves it: a job's `kind` is one of the
/// kinds of its `PRICE_LIST`, which only the running service knows.
pub fn document_with_prices(prices: &crate::config::PriceList) -> Result<String, ApiError> {
    let mut document: serde_json::Value = serde_json::from_str(document_json()?)
        .map_err(|error| ApiError::Internal(format!("reading the OpenAPI document: {error}")))?;
    if let Some(kind) = document
        .pointer_mut("/components/schemas/CreateJob/properties/kind")
        .and_then(serde_json::Value::as_object_mut)
    {
        kind.insert("enum".to_owned(), prices.keys().cloned().collect());
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
