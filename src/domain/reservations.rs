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
}

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
