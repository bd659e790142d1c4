//! Top-ups and adjustments (admin only).

use actix_web::{post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{created, replayed, JsonObject, State};
use crate::domain::api_keys::Caller;
use crate::domain::credits::{AdjustmentView, CreditView};
use crate::engine::types::{
    AccountId, Currency, ExternalRef, GrantExpiry, MinorUnits, Note, Price, Priority, Reason,
    SignedTokens, Tokens,
};
use crate::engine::{Authority, Op, Operation, Replay};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(create_credit).service(create_adjustment);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateCredit {
    amount: Tokens,
    /// The payment's reference: the idempotency key of this credit.
    external_ref: ExternalRef,
    note: Option<Note>,
    /// The priority of the grant this credit makes: 0 … 100, default 50;
    /// grants of a lower priority are drawn first.
    priority: Option<Priority>,
    /// When the grant lapses (RFC 3339, in the future, within 10 years);
    /// omitted or null: never. What it still holds then leaves the account
    /// (ledger kind `grant_expire`).
    expires_at: Option<GrantExpiry>,
    /// What the customer paid for these tokens, in minor units of
    /// `currency` (cents; 0 for a promotional grant). With `currency`, or
    /// neither: an unpriced grant, which the revenue report counts in
    /// tokens and never values.
    amount_paid: Option<MinorUnits>,
    /// ISO 4217 code of `amount_paid`.
    currency: Option<Currency>,
}

/// Adds tokens (a top-up) as a new grant.
///
/// Idempotent on `external_ref` (the priority, the expiry and the price
/// are part of the compared body). A price (`amount_paid` with
/// `currency`) values the grant's tokens in the revenue report.
/// Reservations draw from the account's grants by priority (0 first), then
/// the soonest expiry (grants that never expire last), then creation
/// order.
#[utoipa::path(
    tag = "credits",
    params(("account_id" = Uuid, Path, description = "The account")),
    request_body = CreateCredit,
    responses(
        (status = 201, description = "Credited", body = CreditView,
         headers(("Location" = String, description = "The account's ledger"))),
        (status = 200, description = "A replay of the same credit: nothing new was credited",
         body = CreditView,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, description = "Invalid JSON, path, amount, priority, expires_at or text",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`external_ref` already used for a different credit",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/credits")]
async fn create_credit(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<CreateCredit>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateCredit {
        amount,
        external_ref,
        note,
        priority,
        expires_at,
        amount_paid,
        currency,
    } = body.into_inner();
    let op = Op::Credit {
        amount,
        external_ref,
        note,
        priority: priority.unwrap_or_default(),
        expires_at,
        price: Price::of(amount_paid, currency).map_err(ApiError::InvalidRequest)?,
    };
    let (operation, answer) = state
        .coalescer
        .submit(admin_operation(&caller, account, op))
        .await;
    let (credit, replay) = answer?.into_credit(&operation)?;
    Ok(respond(account, &credit, replay))
}

/// An operation of an admin already authorised here (its key verified by
/// the `Caller` extractor), with this request's id for its audit event.
fn admin_operation(caller: &Caller, account: AccountId, op: Op) -> Operation {
    Operation {
        account,
        authority: Authority::Request {
            actor: caller.actor(),
            request_id: crate::telemetry::current_request_id(),
            key: caller.key_id.map(|key| key.0),
        },
        op,
    }
}

fn respond(account: AccountId, view: &impl serde::Serialize, replay: Replay) -> HttpResponse {
    match replay {
        Replay::Created => created(format!("/v1/accounts/{account}/ledger"), view),
        Replay::Replayed => replayed(view),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateAdjustment {
    amount: SignedTokens,
    reason: Reason,
    /// The idempotency key of this adjustment.
    external_ref: ExternalRef,
    /// A positive adjustment only: the priority of the grant it makes,
    /// 0 … 100, default 50.
    priority: Option<Priority>,
    /// A positive adjustment only: when the grant it makes lapses (as for
    /// a credit); omitted or null: never.
    expires_at: Option<GrantExpiry>,
    /// A positive adjustment only: the value of the grant it makes, in
    /// minor units of `currency` (as for a credit); omitted: unpriced. A
    /// removal takes its value from the grants it draws.
    amount_paid: Option<MinorUnits>,
    /// A positive adjustment only: ISO 4217 code of `amount_paid`.
    currency: Option<Currency>,
}

/// Adds or removes tokens, with a reason.
///
/// Never drives `available` below 0. A positive adjustment makes a grant;
/// a removal draws from the grants in draw order (one ledger entry per
/// grant).
#[utoipa::path(
    tag = "credits",
    params(("account_id" = Uuid, Path, description = "The account")),
    request_body = CreateAdjustment,
    responses(
        (status = 201, description = "Adjusted", body = AdjustmentView,
         headers(("Location" = String, description = "The account's ledger"))),
        (status = 200, description = "A replay of the same adjustment: nothing new was adjusted",
         body = AdjustmentView,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, description = "Invalid JSON, path, amount, priority or expires_at (a removal takes neither) or text",
         body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "A removal larger than the available tokens",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`external_ref` already used for a different adjustment",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/adjustments")]
async fn create_adjustment(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<CreateAdjustment>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateAdjustment {
        amount,
        reason,
        external_ref,
        priority,
        expires_at,
        amount_paid,
        currency,
    } = body.into_inner();
    let price = Price::of(amount_paid, currency).map_err(ApiError::InvalidRequest)?;
    let priority = if amount.get() > 0 {
        Some(priority.unwrap_or_default())
    } else if priority.is_some() || expires_at.is_some() || price.is_some() {
        return Err(ApiError::InvalidRequest(
            "priority, expires_at, amount_paid and currency apply to a positive adjustment only (a removal makes no grant)"
                .into(),
        ));
    } else {
        None
    };
    let op = Op::Adjust {
        amount,
        reason,
        external_ref,
        priority,
        expires_at,
        price,
    };
    let (operation, answer) = state
        .coalescer
        .submit(admin_operation(&caller, account, op))
        .await;
    let (adjustment, replay) = answer?.into_adjustment(&operation)?;
    Ok(respond(account, &adjustment, replay))
}
