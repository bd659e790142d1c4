//! Reservations as the API shows them, and the read. Every change of a
//! reservation — reserve, commit (full or partial), release, extend,
//! expire — is the money engine's (`crate::engine`, and the
//! `money_engine` migration): one conditional rule each, account row
//! locked first, the ledger written in the same transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::db::models::ReservationRow;
use crate::db::states::ReservationState;
use crate::domain::paging::page_of;
use crate::engine::types::{AccountId, RequestId, ReservationId};
use crate::error::ApiError;

/// A reservation as the API and `reservation.expired` show it: the engine
/// writes it (`engine_reservation_json`, src/engine/sql/05_views.sql) for
/// the reads and the event. The answers of reserve, commit, release and
/// extend come from the engine's row (`From<ReservationRow>`, the same
/// fields; tests/api/representations.rs holds the two to each other).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReservationView {
    pub reservation_id: ReservationId,
    pub account_id: AccountId,
    pub request_id: RequestId,
    pub amount: i64,
    /// `held`, `committed`, `released` or `expired`.
    #[schema(value_type = String, example = "held")]
    pub state: ReservationState,
    pub committed_amount: i64,
    #[serde(with = "crate::time::micros")]
    pub expires_at: DateTime<Utc>,
    pub job_id: Option<Uuid>,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros_option")]
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

/// Reservations as the engine shows them (`engine_reservation_json`, the
/// representation `reservation.expired` carries too): an account's, one by
/// id or a page newest first.
fn shown_reservations(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: Option<ReservationId>,
    state: Option<ReservationState>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<ReservationView>, ApiError> {
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = Jsonb)]
        reservation: serde_json::Value,
    }
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT engine_reservation_json(to_jsonb(r)) AS reservation FROM reservations r \
         WHERE r.account_id = $1 AND ($2::uuid IS NULL OR r.id = $2) \
           AND ($3::text IS NULL OR r.state = $3) AND ($4::uuid IS NULL OR r.id < $4) \
         ORDER BY r.id DESC LIMIT $5",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<Nullable<SqlUuid>, _>(reservation.map(|id| id.0))
    .bind::<Nullable<Text>, _>(state.map(ReservationState::as_str))
    .bind::<Nullable<SqlUuid>, _>(after)
    .bind::<BigInt, _>(limit)
    .load(conn)?;
    shown
        .into_iter()
        .map(|shown| {
            crate::engine::decode::<ReservationView>(
                shown.reservation,
                "a reservation as the engine shows it",
            )
        })
        .collect()
}

pub fn get_reservation(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
) -> Result<ReservationView, ApiError> {
    shown_reservations(conn, account, Some(reservation), None, None, 1)?
        .pop()
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
    let shown = shown_reservations(conn, account, None, state, after, limit + 1)?;
    let (reservations, next_after) =
        page_of(shown, limit, |view: &ReservationView| view.reservation_id.0);
    Ok(ReservationPage {
        reservations,
        next_after,
    })
}
