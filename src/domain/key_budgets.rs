//! Key budgets: a kiosk key's spending limit, `budget_tokens` per
//! `budget_period` (day, week from Monday, month, or total) in a time zone.
//!
//! The money engine decides and counts them (src/engine/sql/20_keys.sql:
//! `engine_key_budget_left`, `engine_spend_refusal`'s
//! `key_budget_exhausted`, `engine_record`'s count), in the transaction of
//! the reserve, under the account's row lock. This module sets a budget,
//! under the same lock, and shows it (`engine_key_budget_json`).

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Jsonb, Nullable, SmallInt, Text, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::domain::audit::{self, Audit};
use crate::engine::types::{AccountId, ApiKeyId};
use crate::error::ApiError;

/// Tokens a budget may allow per period, at most.
pub const BUDGET_TOKENS_MAX: i64 = 1_000_000_000;

/// How long a budget's count runs before it starts again from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    /// A calendar day in the budget's time zone.
    Day,
    /// A week from Monday 00:00 in the budget's time zone.
    Week,
    /// A calendar month in the budget's time zone.
    Month,
    /// Never starts again.
    Total,
}

impl BudgetPeriod {
    fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
            BudgetPeriod::Total => "total",
        }
    }
}

/// A kiosk key's budget as a request sets it.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Tokens the key's reservations may hold or use per period,
    /// 1 … 1,000,000,000. A reserve that would pass it is refused (402
    /// `key_budget_exhausted`).
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub budget_tokens: i64,
    pub budget_period: BudgetPeriod,
    /// The periods' time zone, an IANA name (`Europe/Berlin`); default UTC.
    pub budget_time_zone: Option<String>,
    /// `key.budget_low` is sent once a period when this percentage of the
    /// budget is spent, 1 … 100; default 80.
    #[schema(minimum = 1, maximum = 100)]
    pub budget_low_percent: Option<i64>,
}

/// A key's budget as the API and the `key.budget_*` events show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyBudget {
    pub budget_tokens: i64,
    pub budget_period: BudgetPeriod,
    pub budget_time_zone: String,
    pub budget_low_percent: i16,
    /// Tokens the key's reservations hold or used in the current period
    /// (what a release, an expiry or a partial commit did not use went
    /// back).
    pub spent: i64,
    /// `budget_tokens − spent`, never below 0.
    pub remaining: i64,
    /// When the period ends and the count starts again (RFC 3339); null
    /// for `total`.
    pub resets_at: Option<String>,
}

/// The budgets of the keys `ids` that have one, as they stand now.
pub fn budgets_of(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, KeyBudget>, ApiError> {
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
        #[diesel(sql_type = Jsonb)]
        budget: Value,
    }
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT k.id, engine_key_budget_json(k.budget_tokens, k.budget_period, \
                k.budget_time_zone, k.budget_low_percent, k.budget_spent, \
                k.budget_period_start, now()) AS budget FROM api_keys k \
         WHERE k.id = ANY ($1) AND k.budget_tokens IS NOT NULL",
    )
    .bind::<Array<SqlUuid>, _>(ids)
    .load(conn)?;
    shown
        .into_iter()
        .map(|row| {
            let budget =
                crate::engine::decode(row.budget, "a key's budget as the engine shows it")?;
            Ok((row.id, budget))
        })
        .collect()
}

/// Checks a budget a request sets: its bounds and its time zone.
pub fn check(conn: &mut PgConnection, spec: &BudgetSpec) -> Result<(), ApiError> {
    if !(1..=BUDGET_TOKENS_MAX).contains(&spec.budget_tokens) {
        return Err(ApiError::InvalidRequest(format!(
            "budget_tokens must be between 1 and {BUDGET_TOKENS_MAX}, got {}",
            spec.budget_tokens
        )));
    }
    if let Some(percent) = spec.budget_low_percent {
        if !(1..=100).contains(&percent) {
            return Err(ApiError::InvalidRequest(format!(
                "budget_low_percent must be between 1 and 100, got {percent}"
            )));
        }
    }
    if let Some(zone) = &spec.budget_time_zone {
        crate::domain::topups::check_time_zone(conn, zone)?;
    }
    Ok(())
}

/// Writes a kiosk key's budget (`None`: removes it), in the caller's
/// transaction, which holds the key's account's row lock. A budget of the
/// same period and time zone keeps the period's count; another starts a
/// new count (the reservations counted before give nothing back to it).
/// The period's events may be sent again under the new limit.
pub(crate) fn write(
    conn: &mut PgConnection,
    key: Uuid,
    spec: Option<&BudgetSpec>,
) -> Result<(), ApiError> {
    diesel::sql_query(
        "UPDATE api_keys SET \
            budget_spent = CASE WHEN (budget_period, budget_time_zone) \
                                     IS NOT DISTINCT FROM ($2, COALESCE($3, 'UTC')) \
                                THEN budget_spent ELSE 0 END, \
            budget_period_start = CASE WHEN (budget_period, budget_time_zone) \
                                            IS NOT DISTINCT FROM ($2, COALESCE($3, 'UTC')) \
                                       THEN budget_period_start END, \
            budget_notified = NULL, \
            budget_tokens = $1, budget_period = $2, budget_time_zone = COALESCE($3, 'UTC'), \
            budget_low_percent = COALESCE($4, 80) \
         WHERE id = $5",
    )
    .bind::<Nullable<BigInt>, _>(spec.map(|spec| spec.budget_tokens))
    .bind::<Nullable<Text>, _>(spec.map(|spec| spec.budget_period.as_str()))
    .bind::<Nullable<Text>, _>(spec.and_then(|spec| spec.budget_time_zone.clone()))
    .bind::<Nullable<SmallInt>, _>(
        spec.and_then(|spec| spec.budget_low_percent)
            .map(|percent| i16::try_from(percent).unwrap_or(80)),
    )
    .bind::<SqlUuid, _>(key)
    .execute(conn)?;
    Ok(())
}

/// Sets (`Some`) or removes (`None`) a kiosk key's budget (admin), with
/// its audit event `api_key.budget_changed`. Answers the budget now.
pub fn set_budget(
    conn: &mut PgConnection,
    by: &Audit,
    key: ApiKeyId,
    spec: Option<BudgetSpec>,
) -> Result<Option<KeyBudget>, ApiError> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = Text)]
        scope: String,
        #[diesel(sql_type = Nullable<SqlUuid>)]
        account_id: Option<Uuid>,
    }
    if let Some(spec) = &spec {
        check(conn, spec)?;
    }
    conn.transaction(|conn| {
        let found: Found =
            diesel::sql_query("SELECT scope, account_id FROM api_keys WHERE id = $1")
                .bind::<SqlUuid, _>(key.0)
                .get_result(conn)
                .optional()?
                .ok_or(ApiError::NotFound("api key"))?;
        let Some(account) = found.account_id.filter(|_| found.scope == "kiosk") else {
            return Err(ApiError::InvalidRequest(
                "only a kiosk key has a budget: admin and finance keys spend nothing".into(),
            ));
        };
        // The engine counts a budget under the account's row lock.
        crate::domain::topups::lock_account(conn, AccountId(account))?;
        let before = budgets_of(conn, &[key.0])?.remove(&key.0);
        write(conn, key.0, spec.as_ref())?;
        let now = budgets_of(conn, &[key.0])?.remove(&key.0);
        audit::record(
            conn,
            by,
            "api_key.budget_changed",
            &format!("api_key:{}", key.0),
            Some(serde_json::json!({"budget": before})),
            Some(serde_json::json!({"budget": now})),
        )?;
        Ok(now)
    })
}
