//! Top-ups (credits) and signed corrections (adjustments).
//!
//! Both are idempotent on `external_ref`: the row is inserted first with
//! `ON CONFLICT DO NOTHING`, so a concurrent duplicate waits on the unique
//! index and then finds the first one. A replay answers with the balances
//! recorded in the original ledger entry, so it is byte-for-byte the same
//! answer; a reuse with a different body is refused and changes nothing.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AdjustmentRow, CreditRow, LedgerEntryRow};
use crate::db::schema::{accounts, adjustments, credits, ledger_entries};
use crate::domain::ledger::{self, Balances, EntryKind, Movement};
use crate::domain::types::{AccountId, ExternalRef, Note, Reason, SignedTokens, Tokens};
use crate::error::ApiError;

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
    pub ledger_entry_id: i64,
}

/// Whether the answer comes from this request or an earlier identical one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replayed,
}

/// A foreign-key violation on insert means the account does not exist.
fn account_must_exist(error: DieselError) -> ApiError {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::ForeignKeyViolation, _) => {
            ApiError::NotFound("account")
        }
        other => other.into(),
    }
}

/// The ledger entry written for a credit or adjustment.
fn entry_for(
    conn: &mut PgConnection,
    kind: EntryKind,
    external_ref: &str,
) -> Result<LedgerEntryRow, ApiError> {
    Ok(ledger_entries::table
        .filter(ledger_entries::external_ref.eq(external_ref))
        .filter(ledger_entries::kind.eq(kind.as_str()))
        .select(LedgerEntryRow::as_select())
        .first(conn)?)
}

pub fn credit(
    conn: &mut PgConnection,
    account: AccountId,
    amount: Tokens,
    external_ref: &ExternalRef,
    note: Option<&Note>,
    actor: &str,
) -> Result<(CreditView, Outcome), ApiError> {
    conn.transaction(|conn| {
        let inserted: Option<CreditRow> = diesel::insert_into(credits::table)
            .values(CreditRow {
                id: Uuid::now_v7(),
                account_id: account.0,
                amount: amount.get(),
                external_ref: external_ref.as_str().to_owned(),
                note: note.map(|note| note.as_str().to_owned()),
                actor: actor.to_owned(),
                created_at: Utc::now(), // not inserted: the column default (database clock) wins
            })
            .on_conflict(credits::external_ref)
            .do_nothing()
            .returning(CreditRow::as_returning())
            .get_result(conn)
            .optional()
            .map_err(account_must_exist)?;
        let (row, outcome) = match inserted {
            Some(row) => {
                let after: Balances = diesel::update(accounts::table.find(account.0))
                    .set((
                        accounts::available.eq(accounts::available + amount.get()),
                        accounts::credited.eq(accounts::credited + amount.get()),
                        accounts::version.eq(accounts::version + 1),
                        accounts::updated_at.eq(diesel::dsl::now),
                    ))
                    .returning((accounts::available, accounts::reserved, accounts::used))
                    .get_result(conn)?;
                ledger::append(
                    conn,
                    Movement {
                        account,
                        kind: EntryKind::Credit,
                        amount: amount.get(),
                        after,
                        reservation_id: None,
                        job_id: None,
                        external_ref: Some(external_ref.as_str()),
                        reason: None,
                        actor,
                    },
                )?;
                (row, Outcome::Created)
            }
            None => {
                let existing: CreditRow = credits::table
                    .filter(credits::external_ref.eq(external_ref.as_str()))
                    .select(CreditRow::as_select())
                    .first(conn)?;
                let same = existing.account_id == account.0
                    && existing.amount == amount.get()
                    && existing.note.as_deref() == note.map(Note::as_str);
                if !same {
                    return Err(ApiError::IdempotencyKeyReused(format!(
                        "external_ref {:?} was already used for a different credit",
                        external_ref.as_str()
                    )));
                }
                (existing, Outcome::Replayed)
            }
        };
        let entry = entry_for(conn, EntryKind::Credit, &row.external_ref)?;
        Ok((
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
            },
            outcome,
        ))
    })
}

pub fn adjust(
    conn: &mut PgConnection,
    account: AccountId,
    amount: SignedTokens,
    reason: &Reason,
    external_ref: &ExternalRef,
    actor: &str,
) -> Result<(AdjustmentView, Outcome), ApiError> {
    conn.transaction(|conn| {
        let inserted: Option<AdjustmentRow> = diesel::insert_into(adjustments::table)
            .values(AdjustmentRow {
                id: Uuid::now_v7(),
                account_id: account.0,
                amount: amount.get(),
                reason: reason.as_str().to_owned(),
                external_ref: external_ref.as_str().to_owned(),
                actor: actor.to_owned(),
                created_at: Utc::now(), // not inserted: the column default (database clock) wins
            })
            .on_conflict(adjustments::external_ref)
            .do_nothing()
            .returning(AdjustmentRow::as_returning())
            .get_result(conn)
            .optional()
            .map_err(account_must_exist)?;
        let (row, outcome) = match inserted {
            Some(row) => {
                // Never drives `available` below zero: a negative adjustment
                // larger than what is available is refused, not clamped.
                let after: Option<Balances> = diesel::update(
                    accounts::table
                        .find(account.0)
                        .filter((accounts::available + amount.get()).ge(0)),
                )
                .set((
                    accounts::available.eq(accounts::available + amount.get()),
                    accounts::adjusted.eq(accounts::adjusted + amount.get()),
                    accounts::version.eq(accounts::version + 1),
                    accounts::updated_at.eq(diesel::dsl::now),
                ))
                .returning((accounts::available, accounts::reserved, accounts::used))
                .get_result(conn)
                .optional()?;
                let Some(after) = after else {
                    let balances: Balances = accounts::table
                        .find(account.0)
                        .select((accounts::available, accounts::reserved, accounts::used))
                        .first(conn)?;
                    return Err(ApiError::InsufficientTokens {
                        available: balances.available,
                        reserved: balances.reserved,
                    });
                };
                ledger::append(
                    conn,
                    Movement {
                        account,
                        kind: EntryKind::Adjustment,
                        amount: amount.get(),
                        after,
                        reservation_id: None,
                        job_id: None,
                        external_ref: Some(external_ref.as_str()),
                        reason: Some(reason.as_str()),
                        actor,
                    },
                )?;
                (row, Outcome::Created)
            }
            None => {
                let existing: AdjustmentRow = adjustments::table
                    .filter(adjustments::external_ref.eq(external_ref.as_str()))
                    .select(AdjustmentRow::as_select())
                    .first(conn)?;
                let same = existing.account_id == account.0
                    && existing.amount == amount.get()
                    && existing.reason == reason.as_str();
                if !same {
                    return Err(ApiError::IdempotencyKeyReused(format!(
                        "external_ref {:?} was already used for a different adjustment",
                        external_ref.as_str()
                    )));
                }
                (existing, Outcome::Replayed)
            }
        };
        let entry = entry_for(conn, EntryKind::Adjustment, &row.external_ref)?;
        Ok((
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
            },
            outcome,
        ))
    })
}
