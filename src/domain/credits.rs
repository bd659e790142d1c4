//! Top-ups (credits) and signed corrections (adjustments).
//!
//! Both are movements of the money engine (`engine_credit`,
//! `engine_adjust`), idempotent on `external_ref`. A replay answers with
//! the balances recorded in the original ledger entry, so it is the same
//! answer; a reuse with a different body is refused and changes nothing.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AdjustmentRow, CreditGrantRow, CreditRow, LedgerEntryRow};
use crate::domain::types::AccountId;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreditView {
    pub credit_id: Uuid,
    pub account_id: AccountId,
    pub amount: i64,
    pub external_ref: String,
    pub note: Option<String>,
    pub created_at: DateTime<Utc>,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub ledger_entry_id: i64,
    /// The grant this credit made (its id is the credit's).
    pub grant_id: Uuid,
    /// When the grant lapses; null: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// The grant's priority (0 is drawn first).
    pub priority: i16,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AdjustmentView {
    pub adjustment_id: Uuid,
    pub account_id: AccountId,
    pub amount: i64,
    pub reason: String,
    pub external_ref: String,
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
    pub expires_at: Option<DateTime<Utc>>,
    /// That grant's priority; null for a removal.
    pub priority: Option<i16>,
}

impl CreditView {
    /// The credit with the balances of its ledger entry, so a replay
    /// answers exactly as the first request did.
    pub fn new(row: CreditRow, entry: LedgerEntryRow, grant: CreditGrantRow) -> CreditView {
        CreditView {
            credit_id: row.id,
            account_id: AccountId(row.account_id),
            amount: row.amount,
            external_ref: row.external_ref,
            note: row.note,
            created_at: row.created_at,
            available: entry.available_after,
            reserved: entry.reserved_after,
            used: entry.used_after,
            ledger_entry_id: entry.id,
            grant_id: grant.id,
            expires_at: grant.expires_at,
            priority: grant.priority,
        }
    }
}

impl AdjustmentView {
    /// The adjustment with the balances of its ledger entry.
    pub fn new(
        row: AdjustmentRow,
        entry: LedgerEntryRow,
        grant: Option<CreditGrantRow>,
    ) -> AdjustmentView {
        AdjustmentView {
            adjustment_id: row.id,
            account_id: AccountId(row.account_id),
            amount: row.amount,
            reason: row.reason,
            external_ref: row.external_ref,
            created_at: row.created_at,
            available: entry.available_after,
            reserved: entry.reserved_after,
            used: entry.used_after,
            ledger_entry_id: entry.id,
            grant_id: grant.as_ref().map(|grant| grant.id),
            expires_at: grant.as_ref().and_then(|grant| grant.expires_at),
            priority: grant.as_ref().map(|grant| grant.priority),
        }
    }
}
