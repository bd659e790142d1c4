//! What the console (and anyone with a finance or admin key) reads to see
//! the state of the whole service in one request, and who a key is.

use std::collections::BTreeMap;

use actix_web::{get, web, HttpResponse};
use serde::Serialize;

use super::State;
use crate::db::{migrations_applied, run_blocking};
use crate::domain::api_keys::{Caller, Scope};
use crate::domain::key_budgets::{budgets_of, KeyBudget};
use crate::domain::system::{database_summary, DatabaseSummary};
use crate::engine::types::{AccountId, ApiKeyId};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config.service(system_summary).service(who_am_i);
}

/// Counters of the replica that answered, since it started.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReplicaSummary {
    /// The service version.
    pub version: &'static str,
    /// Provider requests by outcome (`ok`, or the error's kind).
    pub provider_requests: BTreeMap<String, u64>,
    /// Share of provider requests that did not answer `ok`; null before
    /// the first request.
    pub provider_error_ratio: Option<f64>,
    /// Jobs finished by this replica, by status.
    pub jobs_finished: BTreeMap<String, u64>,
    /// Repairs made by this replica's reaper passes, by kind.
    pub repairs: BTreeMap<String, u64>,
}

/// The state of the service (admin, finance).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SystemSummary {
    /// True when this replica would answer `/readyz` with 200.
    pub ready: bool,
    /// `ready`, `shutting down` or `migrations pending`.
    pub readiness: &'static str,
    /// `ok` when the reaper's last pass found no account breaking an
    /// invariant, `violated` when it found some, `unknown` before any pass.
    pub invariant_status: &'static str,
    pub database: DatabaseSummary,
    pub replica: ReplicaSummary,
}

/// The state of the service in one read (finance or admin).
///
/// Readiness, the reaper's last pass and the invariant, reservations and
/// jobs in flight (shared by every replica), and the answering replica's
/// provider, job and repair counters since it started.
#[utoipa::path(
    tag = "system",
    responses(
        (status = 200, description = "The summary", body = SystemSummary),
        (status = 403, description = "A kiosk key",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/system/summary")]
async fn system_summary(caller: Caller, state: State) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let (applied, database) = run_blocking(&state.pool, |conn| {
        Ok((migrations_applied(conn)?, database_summary(conn)?))
    })
    .await?;
    let readiness = if !state.is_accepting() {
        "shutting down"
    } else if !applied {
        "migrations pending"
    } else {
        "ready"
    };
    let invariant_status = match database.invariant_violations {
        None => "unknown",
        Some(0) => "ok",
        Some(_) => "violated",
    };
    let metrics = &state.metrics;
    let provider_requests = metrics.counts_by_label(&metrics.provider_requests_total);
    let total: u64 = provider_requests.values().sum();
    let failed = total - provider_requests.get("ok").copied().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let provider_error_ratio = (total > 0).then(|| failed as f64 / total as f64);
    Ok(HttpResponse::Ok().json(SystemSummary {
        ready: readiness == "ready",
        readiness,
        invariant_status,
        database,
        replica: ReplicaSummary {
            version: env!("CARGO_PKG_VERSION"),
            provider_requests,
            provider_error_ratio,
            jobs_finished: metrics.counts_by_label(&metrics.jobs_total),
            repairs: metrics.counts_by_label(&metrics.consistency_repairs_total),
        },
    }))
}

/// Who the presented key is.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// The key's id; null for the bootstrap `ADMIN_API_KEY`.
    pub key_id: Option<ApiKeyId>,
    pub scope: Scope,
    /// The account of a kiosk key; null for the others.
    pub account_id: Option<AccountId>,
    /// A kiosk key's spending limit and what it spent in the current
    /// period (a booth reads its own); null: none.
    pub budget: Option<KeyBudget>,
}

/// The calling key's scope, account and budget (any valid key).
///
/// Lets a client, such as the console, show only what the key may do, and
/// a booth how much of its budget is left.
#[utoipa::path(
    tag = "api-keys",
    responses((status = 200, description = "The calling key", body = WhoAmI)),
    security(("bearer" = [])),
)]
#[get("/v1/me")]
async fn who_am_i(caller: Caller, state: State) -> Result<HttpResponse, ApiError> {
    let budget = match caller.key_id {
        Some(key) if caller.scope == Scope::Kiosk => {
            run_blocking(&state.pool, move |conn| {
                budgets_of(conn, &[key.0]).map(|mut budgets| budgets.remove(&key.0))
            })
            .await?
        }
        _ => None,
    };
    Ok(HttpResponse::Ok().json(WhoAmI {
        key_id: caller.key_id,
        scope: caller.scope,
        account_id: caller.account_id,
        budget,
    }))
}
