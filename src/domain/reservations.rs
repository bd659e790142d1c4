//! Reservations as the API shows them, and the read. Every change of a
//! reservation — reserve, commit (full or partial), release, extend,
//! expire — is the money engine's (`crate::engine`, and the
//! `money_engine` migration): one conditional rule each, account row
//! locked first, the ledger written in the same transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::ReservationRow;
use crate::db::schema::reservations;
use crate::domain::paging::page_of;
use crate::domain::states::ReservationState;
use crate::domain::types::{AccountId, RequestId, ReservationId};
use crate::error::ApiError;

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ReservationView {
    pub reservation_id: ReservationId,
    pub account_id: AccountId,
    pub request_id: RequestId,
    pub amount: i64,
    /// `held`, `committed`, `released` or `expired`.
    #[schema(value_type = String, example = "held")]
    pub state: ReservationState,
    pub committed_amount: i64,
    pub expires_at: DateTime<Utc>,
    pub job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// The grants its tokens were drawn from, in draw order (amounts sum
    /// to `amount`).
    pub draws: Vec<Draw>,
}

pub use crate::engine::types::{draws_of, Draw};

impl From<ReservationRow> for ReservationView {
    fn from(row: ReservationRow) -> Self {
        ReservationView {
            reservation_id: ReservationId(row.id),
            account_id: AccountId(row.account_id),
            request_id: RequestId(row.request_id),
            amount: row.amount,
            state: row.state,
            committed_amount: row.committed_amount,
            expires_at: row.expires_at,
            job_id: row.job_id,
            created_at: row.created_at,
            resolved_at: row.resolved_at,
            draws: draws_of(&row.draws),
        }
    }
}

pub fn get_reservation(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
) -> Result<ReservationRow, ApiError> {
    reservations::table
        .filter(reservations::id.eq(reservation.0))
        .filter(reservations::account_id.eq(account.0))
        .select(ReservationRow::as_select())
        .first(conn)
        .optional()?
        .ok_or(ApiError::NotFound("reservation"))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReservationPage {
    pub reservations: Vec<ReservationView>,
    /// The next page's `after`; null on the last page.
    pub next_after: Option<Uuid>,
}

/// An account's reservations, newest first (ids are UUIDv7, so id order is
/// creation order); `after` is the last reservation_id of the previous page.
pub fn list_reservations(
    conn: &mut PgConnection,
    account: AccountId,
    state: Option<ReservationState>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<ReservationPage, ApiError> {
    let mut query = reservations::table
        .filter(reservations::account_id.eq(account.0))
        .select(ReservationRow::as_select())
        .order(reservations::id.desc())
        .limit(limit + 1)
        .into_boxed();
    if let Some(state) = state {
        query = query.filter(reservations::state.eq(state));
    }
    if let Some(after) = after {
        query = query.filter(reservations::id.lt(after));
    }
    let (rows, next_after) = page_of(query.load(conn)?, limit, |row: &ReservationRow| row.id);
    Ok(ReservationPage {
        reservations: rows.into_iter().map(ReservationView::from).collect(),
        next_after,
    })
}
