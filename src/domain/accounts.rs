//! Accounts: creation, lookup, status and limits.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AccountRow, NewAccount};
use crate::db::schema::accounts;
use crate::domain::types::{AccountId, Name};
use crate::error::ApiError;

/// Default `max_active_reservations` of a new account (DESIGN §2).
pub const DEFAULT_MAX_ACTIVE_RESERVATIONS: i32 = 10;
/// Upper bound on `max_active_reservations` (0 means unlimited).
pub const MAX_ACTIVE_RESERVATIONS_LIMIT: i32 = 100_000;

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AccountView {
    pub account_id: AccountId,
    pub name: String,
    /// `active` or `suspended`.
    pub status: String,
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
}

impl From<AccountRow> for AccountView {
    fn from(row: AccountRow) -> Self {
        AccountView {
            account_id: AccountId(row.id),
            name: row.name,
            status: row.status,
            available: row.available,
            reserved: row.reserved,
            used: row.used,
            credited: row.credited,
            adjusted: row.adjusted,
            active_reservations: row.active_reservations,
            max_active_reservations: row.max_active_reservations,
            version: row.version,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

pub fn parse_max_active_reservations(value: Option<i64>) -> Result<i32, ApiError> {
    let value = value.unwrap_or(i64::from(DEFAULT_MAX_ACTIVE_RESERVATIONS));
    i32::try_from(value)
        .ok()
        .filter(|limit| (0..=MAX_ACTIVE_RESERVATIONS_LIMIT).contains(limit))
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "max_active_reservations must be between 0 (unlimited) and \
                 {MAX_ACTIVE_RESERVATIONS_LIMIT}, got {value}"
            ))
        })
}

pub fn create_account(
    conn: &mut PgConnection,
    name: &Name,
    max_active_reservations: i32,
) -> Result<AccountRow, ApiError> {
    Ok(diesel::insert_into(accounts::table)
        .values(NewAccount {
            id: Uuid::now_v7(),
            name: name.as_str(),
            max_active_reservations,
        })
        .returning(AccountRow::as_returning())
        .get_result(conn)?)
}

pub fn get_account(conn: &mut PgConnection, account: AccountId) -> Result<AccountRow, ApiError> {
    accounts::table
        .find(account.0)
        .select(AccountRow::as_select())
        .first(conn)
        .optional()?
        .ok_or(ApiError::NotFound("account"))
}

/// Changes status and/or the reservation limit. Suspending stops new
/// reservations; reservations already held can still be committed or
/// released, so no token is stranded.
pub fn update_account(
    conn: &mut PgConnection,
    account: AccountId,
    status: Option<&str>,
    max_active_reservations: Option<i32>,
) -> Result<AccountRow, ApiError> {
    if let Some(status) = status {
        if status != "active" && status != "suspended" {
            return Err(ApiError::InvalidRequest(format!(
                "status must be \"active\" or \"suspended\", got {status:?}"
            )));
        }
    }
    let row = diesel::update(accounts::table.find(account.0))
        .set((
            status.map(|status| accounts::status.eq(status)),
            max_active_reservations.map(|limit| accounts::max_active_reservations.eq(limit)),
            accounts::version.eq(accounts::version + 1),
            accounts::updated_at.eq(diesel::dsl::now),
        ))
        .returning(AccountRow::as_returning())
        .get_result(conn)
        .optional()?;
    row.ok_or(ApiError::NotFound("account"))
}
