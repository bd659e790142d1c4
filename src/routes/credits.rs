//! Top-ups and adjustments (admin only).

use actix_web::{post, web, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{created, replayed, State};
use crate::db::run_blocking;
use crate::domain::api_keys::Caller;
use crate::domain::credits::{self, Outcome};
use crate::domain::types::{AccountId, ExternalRef, Note, Reason, SignedTokens, Tokens};
use crate::error::ApiError;

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(create_credit).service(create_adjustment);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateCredit {
    amount: Tokens,
    external_ref: ExternalRef,
    note: Option<Note>,
}

/// Adds tokens; idempotent on `external_ref`.
#[post("/v1/accounts/{account_id}/credits")]
async fn create_credit(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: web::Json<CreateCredit>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateCredit {
        amount,
        external_ref,
        note,
    } = body.into_inner();
    let actor = caller.actor();
    let metrics = std::sync::Arc::clone(&state.metrics);
    let (view, outcome) = run_blocking(&state.pool, move |conn| {
        let result = credits::credit(conn, account, amount, &external_ref, note.as_ref(), &actor)?;
        if result.1 == Outcome::Created {
            metrics.tokens("credited", amount.get());
        }
        Ok(result)
    })
    .await?;
    Ok(match outcome {
        Outcome::Created => created(format!("/v1/accounts/{account}/ledger"), &view),
        Outcome::Replayed => replayed(&view),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateAdjustment {
    amount: SignedTokens,
    reason: Reason,
    external_ref: ExternalRef,
}

/// Adds or removes tokens with a reason; never drives `available` below 0.
#[post("/v1/accounts/{account_id}/adjustments")]
async fn create_adjustment(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: web::Json<CreateAdjustment>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateAdjustment {
        amount,
        reason,
        external_ref,
    } = body.into_inner();
    let actor = caller.actor();
    let metrics = std::sync::Arc::clone(&state.metrics);
    let (view, outcome) = run_blocking(&state.pool, move |conn| {
        let result = credits::adjust(conn, account, amount, &reason, &external_ref, &actor)?;
        if result.1 == Outcome::Created {
            // Counters only grow: adjustments count by absolute amount.
            metrics.tokens("adjusted", amount.get().abs());
        }
        Ok(result)
    })
    .await?;
    Ok(match outcome {
        Outcome::Created => created(format!("/v1/accounts/{account}/ledger"), &view),
        Outcome::Replayed => replayed(&view),
    })
}
