//! Credit grants as the API shows them, and their read. Every credit and
//! every positive adjustment makes a grant; reservations and removals draw
//! from an account's grants in draw order — priority (0 first), then the
//! soonest expiry (grants that never expire last), then creation order.
//! Every movement of a grant's tokens is the money engine's
//! (`src/engine/sql`), with a ledger entry naming the grant.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::db::schema::credit_grants;
pub use crate::db::states::GrantStatus;
use crate::domain::paging::page_of;
use crate::engine::types::AccountId;
use crate::error::ApiError;

/// Grants per page by default, and at most.
pub const GRANT_PAGE_DEFAULT: i64 = 100;
pub const GRANT_PAGE_MAX: i64 = 1_000;

/// A grant as the engine shows it (`engine_grant_json`, which the
/// `grant.expired` and `grant.expiring` events carry too).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GrantView {
    /// The grant; a credit's or a positive adjustment's grant has its id.
    pub grant_id: Uuid,
    /// The account whose tokens it holds.
    pub account_id: AccountId,
    /// Tokens the grant was made with.
    pub amount: i64,
    /// What can still be drawn (until it lapses).
    pub remaining: i64,
    /// What held reservations have drawn and not yet settled.
    pub reserved: i64,
    /// When it lapses; null: never.
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// 0 … 100; lower is drawn first.
    pub priority: i16,
    /// `expired` once `expires_at` has passed, else `active` while it holds
    /// tokens (remaining or reserved), else `depleted`.
    #[schema(value_type = String, example = "active")]
    pub status: GrantStatus,
    /// The credit's or adjustment's `external_ref`; null for the grant the
    /// upgrade to grants made of an account's earlier balance.
    pub external_ref: Option<String>,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    /// When its lapse was written to the ledger (by the reaper, or by the
    /// first spend on the account after `expires_at`); null before. An
    /// expired grant whose lapse is not written yet still shows what it
    /// held: nothing can draw it.
    #[serde(with = "crate::time::micros_option")]
    pub expired_at: Option<DateTime<Utc>>,
    /// The top-up rule whose firing made it (docs/topups.md); null for a
    /// credit or adjustment made by hand.
    pub topup_rule_id: Option<Uuid>,
    /// What was paid for the grant's tokens, in minor units of `currency`
    /// (0: promotional); null: unpriced (docs/finance.md, "Money").
    pub amount_paid: Option<i64>,
    /// ISO 4217 code of `amount_paid`; null exactly when it is null.
    pub currency: Option<String>,
    /// The lapsed grant whose unused tokens a rollover carried into this
    /// one (docs/topups.md, "Rollover"); null for any other grant.
    pub rolled_over_from: Option<Uuid>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GrantPage {
    pub grants: Vec<GrantView>,
    /// The next page's `after`; null on the last page.
    pub next_after: Option<Uuid>,
}

/// An account's grants in creation order, after the grant `after` (the
/// previous page's `next_after`, which must be one of this account's
/// grants), in `status` (as `engine_grant_status` decides it now).
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
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = Jsonb)]
        grant: serde_json::Value,
    }
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT engine_grant_json(to_jsonb(g)) AS grant FROM credit_grants g \
         WHERE g.account_id = $1 AND g.seq > $2 \
           AND ($3::text IS NULL \
                OR engine_grant_status(g.expires_at, g.remaining, g.reserved, now()) = $3) \
         ORDER BY g.seq LIMIT $4",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<BigInt, _>(after_seq)
    .bind::<Nullable<Text>, _>(status.map(GrantStatus::as_str))
    .bind::<BigInt, _>(limit + 1)
    .load(conn)?;
    let views = shown
        .into_iter()
        .map(|shown| {
            crate::engine::decode::<GrantView>(shown.grant, "a grant as the engine shows it")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (grants, next_after) = page_of(views, limit, |view: &GrantView| view.grant_id);
    Ok(GrantPage { grants, next_after })
}
