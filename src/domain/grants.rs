//! Credit grants as the API shows them, and their read. Every credit and
//! every positive adjustment makes a grant; reservations and removals draw
//! from an account's grants in draw order — priority (0 first), then the
//! soonest expiry (grants that never expire last), then creation order.
//! Every movement of a grant's tokens is the money engine's
//! (`src/engine/sql`), with a ledger entry naming the grant.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::CreditGrantRow;
use crate::db::schema::credit_grants;
pub use crate::db::states::GrantStatus;
use crate::domain::paging::page_of;
use crate::domain::types::AccountId;
use crate::error::ApiError;

/// Grants per page by default, and at most.
pub const GRANT_PAGE_DEFAULT: i64 = 100;
pub const GRANT_PAGE_MAX: i64 = 1_000;

impl GrantStatus {
    /// A grant's status: active while it holds tokens.
    pub fn of(row: &CreditGrantRow) -> GrantStatus {
        if row.remaining + row.reserved > 0 {
            GrantStatus::Active
        } else {
            GrantStatus::Depleted
        }
    }
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct GrantView {
    /// The grant; a credit's or a positive adjustment's grant has its id.
    pub grant_id: Uuid,
    /// Tokens the grant was made with.
    pub amount: i64,
    /// What can still be drawn.
    pub remaining: i64,
    /// What held reservations have drawn and not yet settled.
    pub reserved: i64,
    /// When it lapses; always null for now (grants never expire).
    pub expires_at: Option<DateTime<Utc>>,
    /// 0 … 100; lower is drawn first.
    pub priority: i16,
    /// `active` (holds tokens) or `depleted`.
    #[schema(value_type = String, example = "active")]
    pub status: GrantStatus,
    /// The credit's or adjustment's `external_ref`; null for the grant the
    /// upgrade to grants made of an account's earlier balance.
    pub external_ref: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When it lapsed; always null for now.
    pub expired_at: Option<DateTime<Utc>>,
}

impl From<CreditGrantRow> for GrantView {
    fn from(row: CreditGrantRow) -> Self {
        GrantView {
            grant_id: row.id,
            amount: row.amount,
            remaining: row.remaining,
            reserved: row.reserved,
            expires_at: row.expires_at,
            priority: row.priority,
            status: GrantStatus::of(&row),
            external_ref: row.external_ref.clone(),
            created_at: row.created_at,
            expired_at: None,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GrantPage {
    pub grants: Vec<GrantView>,
    /// The next page's `after`; null on the last page.
    pub next_after: Option<Uuid>,
}

/// An account's grants in creation order, after the grant `after` (the
/// previous page's `next_after`, which must be one of this account's
/// grants).
pub fn list_grants(
    conn: &mut PgConnection,
    account: AccountId,
    status: Option<GrantStatus>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<GrantPage, ApiError> {
    let after_seq = match after {
        None => 0,
        Some(after) => credit_grants::table
            .filter(credit_grants::id.eq(after))
            .filter(credit_grants::account_id.eq(account.0))
            .select(credit_grants::seq)
            .first::<i64>(conn)
            .optional()?
            .ok_or_else(|| {
                ApiError::InvalidRequest("after must be a grant_id of this account".into())
            })?,
    };
    if status == Some(GrantStatus::Expired) {
        return Ok(GrantPage {
            grants: Vec::new(),
            next_after: None,
        });
    }
    let mut query = credit_grants::table
        .filter(credit_grants::account_id.eq(account.0))
        .filter(credit_grants::seq.gt(after_seq))
        .select(CreditGrantRow::as_select())
        .order(credit_grants::seq.asc())
        .limit(limit + 1)
        .into_boxed();
    // `GrantStatus::of` in SQL: active while it holds tokens.
    let holds_tokens = (credit_grants::remaining + credit_grants::reserved).gt(0);
    match status {
        Some(GrantStatus::Active) => query = query.filter(holds_tokens),
        Some(GrantStatus::Depleted) => query = query.filter(diesel::dsl::not(holds_tokens)),
        Some(GrantStatus::Expired) | None => {}
    }
    let (rows, next_after) = page_of(query.load(conn)?, limit, |row: &CreditGrantRow| row.id);
    Ok(GrantPage {
        grants: rows.into_iter().map(GrantView::from).collect(),
        next_after,
    })
}
