//! Row structs: what the tables hold, one struct per table (plus `New*`
//! structs for inserts). The JSON representations live in `domain`.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use uuid::Uuid;

use crate::db::states::{AccountStatus, JobStatus, ReservationState};

use super::schema::{
    accounts, adjustments, api_keys, audit_events, credit_grants, credits, generation_jobs,
    ledger_entries, reservations,
};

#[derive(Clone, Debug, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = accounts, check_for_backend(diesel::pg::Pg))]
pub struct AccountRow {
    pub id: Uuid,
    pub name: String,
    pub status: AccountStatus,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub credited: i64,
    pub adjusted: i64,
    pub active_reservations: i32,
    pub max_active_reservations: i32,
    pub version: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub low_balance_threshold: i64,
    pub balance_low: bool,
    /// Tokens that left by a grant's lapse (running total).
    pub grant_expired: i64,
}

#[derive(Insertable)]
#[diesel(table_name = accounts)]
pub struct NewAccount<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub max_active_reservations: i32,
    pub low_balance_threshold: i64,
}

#[derive(Clone, Debug, Queryable, Selectable)]
#[diesel(table_name = api_keys, check_for_backend(diesel::pg::Pg))]
pub struct ApiKeyRow {
    pub id: Uuid,
    pub secret_hash: Vec<u8>,
    pub scope: String,
    pub account_id: Option<Uuid>,
    pub label: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

#[derive(Insertable)]
#[diesel(table_name = api_keys)]
pub struct NewApiKey<'a> {
    pub id: Uuid,
    pub secret_hash: &'a [u8],
    pub scope: &'a str,
    pub account_id: Option<Uuid>,
    pub label: &'a str,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Queryable, Selectable)]
#[diesel(table_name = audit_events, check_for_backend(diesel::pg::Pg))]
pub struct AuditEventRow {
    pub id: i64,
    pub event_id: Uuid,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
    pub request_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Insertable)]
#[diesel(table_name = audit_events)]
pub struct NewAuditEvent<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
    pub request_id: Option<&'a str>,
}

#[derive(Clone, Debug, serde::Deserialize, Queryable, Selectable, Insertable)]
#[diesel(table_name = credits, check_for_backend(diesel::pg::Pg))]
pub struct CreditRow {
    pub id: Uuid,
    pub account_id: Uuid,
    pub amount: i64,
    pub external_ref: String,
    pub note: Option<String>,
    pub actor: String,
    /// The database's clock (column default), never a replica's.
    #[diesel(skip_insertion)]
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, serde::Deserialize, Queryable, Selectable, Insertable)]
#[diesel(table_name = adjustments, check_for_backend(diesel::pg::Pg))]
pub struct AdjustmentRow {
    pub id: Uuid,
    pub account_id: Uuid,
    pub amount: i64,
    pub reason: String,
    pub external_ref: String,
    pub actor: String,
    /// The database's clock (column default), never a replica's.
    #[diesel(skip_insertion)]
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, serde::Deserialize, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = reservations, check_for_backend(diesel::pg::Pg))]
pub struct ReservationRow {
    pub id: Uuid,
    pub account_id: Uuid,
    pub request_id: Uuid,
    pub amount: i64,
    pub requested_ttl_seconds: Option<i32>,
    pub state: ReservationState,
    pub committed_amount: i64,
    pub expires_at: DateTime<Utc>,
    pub job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// `[{"grant_id", "amount"}]` in draw order.
    pub draws: serde_json::Value,
}

#[derive(Clone, Debug, serde::Deserialize, Queryable, Selectable)]
#[diesel(table_name = ledger_entries, check_for_backend(diesel::pg::Pg))]
pub struct LedgerEntryRow {
    pub id: i64,
    pub account_id: Uuid,
    pub kind: String,
    pub amount: i64,
    pub available_after: i64,
    pub reserved_after: i64,
    pub used_after: i64,
    pub reservation_id: Option<Uuid>,
    pub job_id: Option<Uuid>,
    pub external_ref: Option<String>,
    pub reason: Option<String>,
    pub actor: String,
    pub created_at: DateTime<Utc>,
    pub grant_id: Option<Uuid>,
    pub api_key_id: Option<Uuid>,
}

#[derive(Clone, Debug, serde::Deserialize, Queryable, Selectable)]
#[diesel(table_name = credit_grants, check_for_backend(diesel::pg::Pg))]
pub struct CreditGrantRow {
    pub id: Uuid,
    pub account_id: Uuid,
    pub seq: i64,
    pub source: String,
    pub amount: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub consumed: i64,
    pub debited: i64,
    pub priority: i16,
    pub expires_at: Option<DateTime<Utc>>,
    pub external_ref: Option<String>,
    pub opening_reserved: i64,
    pub created_at: DateTime<Utc>,
    /// What lapsed (remaining + reserved + consumed + debited + expired =
    /// amount).
    pub expired: i64,
    /// When its lapse was written; null before.
    pub expired_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = generation_jobs, check_for_backend(diesel::pg::Pg))]
pub struct JobRow {
    pub id: Uuid,
    pub account_id: Uuid,
    pub request_id: Uuid,
    pub request_hash: Vec<u8>,
    pub kind: String,
    pub params: serde_json::Value,
    pub cost: i64,
    pub status: JobStatus,
    pub reservation_id: Uuid,
    pub lease_owner: Option<String>,
    pub lease_token: i64,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub provider_job_id: Option<String>,
    pub result: Option<serde_json::Value>,
    pub error: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}
