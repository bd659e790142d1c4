//! Top-ups (credits) and signed corrections (adjustments) as the engine
//! shows them (`engine_external_json`): the API's
//! answers and the `credit.created` / `adjustment.created` events.
//!
//! Both are movements of the money engine (`engine_credit`,
//! `engine_adjust`), idempotent on `external_ref`. A replay answers with
//! the balances recorded in the original ledger entry, so it is the same
//! answer; a reuse with a different body is refused and changes nothing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::types::AccountId;

/// A credit as the API and `credit.created` show it, with the balances of
/// its ledger entry (a replay answers exactly as the first request did):
/// the engine writes it (`engine_external_json`, src/engine/sql/05_views.sql).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreditView {
    pub credit_id: Uuid,
    pub account_id: AccountId,
    pub amount: i64,
    pub external_ref: String,
    pub note: Option<String>,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub ledger_entry_id: i64,
    /// The grant this credit made (its id is the credit's).
    pub grant_id: Uuid,
    /// When the grant lapses; null: never.
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The grant's priority (0 is drawn first).
    pub priority: i16,
    /// The top-up rule it answers or made (docs/topups.md): a credit whose
    /// `external_ref` is a top-up request's id, or a rule's own grant; else
    /// null.
    pub topup_rule_id: Option<Uuid>,
    /// The grant's price in minor units of `currency`; null: unpriced.
    pub amount_paid: Option<i64>,
    /// ISO 4217 code of `amount_paid`; null exactly when it is null.
    pub currency: Option<String>,
}

/// An adjustment as the API and `adjustment.created` show it
/// (`engine_external_json`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdjustmentView {
    pub adjustment_id: Uuid,
    pub account_id: AccountId,
    pub amount: i64,
    pub reason: String,
    pub external_ref: String,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    /// The adjustment's last ledger entry (a removal drawing from several
    /// grants writes one entry per grant).
    pub ledger_entry_id: i64,
    /// The grant a positive adjustment made (its id is the adjustment's);
    /// null for a removal.
    pub grant_id: Option<Uuid>,
    /// When that grant lapses; null: never (or a removal).
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// That grant's priority; null for a removal.
    pub priority: Option<i16>,
    /// That grant's price in minor units of `currency`; null: unpriced (or
    /// a removal).
    pub amount_paid: Option<i64>,
    /// ISO 4217 code of `amount_paid`; null exactly when it is null.
    pub currency: Option<String>,
}
