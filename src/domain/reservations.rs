//! The three-phase token lifecycle: reserve (available → reserved), then
//! exactly one of commit (reserved → used, the rest back to available),
//! release (reserved → available) or expire (the reaper's release).
//!
//! Rules:
//! - every move is one conditional `UPDATE`; the state transition of a
//!   reservation is `WHERE state = 'held'`, so exactly one resolution wins;
//! - the balance change and its ledger entries commit in one transaction;
//! - locks are taken reservation first, account second, and never held
//!   beyond the transaction;
//! - expiry uses the database clock (`now()`), never the replica's.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Bool, Bytea, Integer, Nullable, Text, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AccountRow, ReservationRow};
use crate::db::prepared;
use crate::db::schema::{accounts, reservations};
use crate::domain::api_keys::{key_may_spend_sql, Credentials};
use crate::domain::ledger::{self, Balances, EntryKind, Movement};
use crate::domain::types::{AccountId, RequestId, ReservationId, Tokens, TtlSeconds};
use crate::error::ApiError;

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ReservationView {
    pub reservation_id: ReservationId,
    pub account_id: AccountId,
    pub request_id: RequestId,
    pub amount: i64,
    /// `held`, `committed`, `released` or `expired`.
    pub state: String,
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

/// Whether an answer comes from this request or an identical earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replayed,
}

pub struct ReserveRequest {
    pub request_id: RequestId,
    pub amount: Tokens,
    pub ttl_seconds: Option<TtlSeconds>,
}

/// The reserve move, with `$account` and `$amount` numbered by the caller:
/// tokens from available to reserved, atomic against the availability
/// check, the account status and the active-reservation limit. Every path
/// that reserves (one-by-one, one-statement, jobs) uses this text; callers
/// may add conditions (`AND …`) before their `RETURNING`.
pub fn reserve_update_sql(account: u8, amount: u8) -> String {
    format!(
        "UPDATE accounts \
         SET available = available - ${amount}, reserved = reserved + ${amount}, \
             active_reservations = active_reservations + 1, \
             version = version + 1, updated_at = now() \
         WHERE id = ${account} AND status = 'active' AND available >= ${amount} \
           AND (max_active_reservations = 0 OR active_reservations < max_active_reservations)"
    )
}

static RESERVE_TOKENS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} RETURNING available, reserved, used",
        reserve_update_sql(1, 2)
    )
});

/// Moves `amount` tokens from available to reserved (`reserve_update_sql`).
/// Returns the account's balances after the move, or `None` when refused.
pub fn reserve_tokens(
    conn: &mut PgConnection,
    account: AccountId,
    amount: i64,
) -> Result<Option<Balances>, ApiError> {
    Ok(prepared(RESERVE_TOKENS_SQL.as_str())
        .bind::<SqlUuid, _>(account.0)
        .bind::<BigInt, _>(amount)
        .get_result::<Balances>(conn)
        .optional()?)
}

/// Why `reserve_tokens` refused: read after the fact, inside the same
/// (to be rolled back) transaction.
pub fn refusal_reason(conn: &mut PgConnection, account: AccountId, amount: i64) -> ApiError {
    let row: Result<Option<AccountRow>, _> = accounts::table
        .find(account.0)
        .select(AccountRow::as_select())
        .first(conn)
        .optional();
    match row {
        Err(error) => error.into(),
        Ok(None) => ApiError::NotFound("account"),
        Ok(Some(row)) if row.status != "active" => ApiError::AccountSuspended,
        Ok(Some(row)) if row.available < amount => ApiError::InsufficientTokens {
            available: row.available,
            reserved: row.reserved,
        },
        Ok(Some(row)) => ApiError::TooManyActiveReservations {
            limit: row.max_active_reservations,
        },
    }
}

/// A new reservation in one statement, which is its own transaction and
/// one round trip: verify the key, move the tokens (the same conditional
/// `UPDATE` as [`reserve_tokens`]), insert the reservation and its ledger
/// entry. The account row is locked first, then the request_id claimed.
static RESERVE_FAST_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH moved AS ( \
             {reserve} \
               AND {key_may_spend} \
               AND NOT EXISTS (SELECT 1 FROM reservations \
                               WHERE account_id = $1 AND request_id = $4 AND job_id IS NULL) \
             RETURNING available, reserved, used \
         ), held AS ( \
             INSERT INTO reservations \
                 (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) \
             SELECT $2, $1, $4, $3, $5, 'held', now() + make_interval(secs => $6) FROM moved \
             RETURNING * \
         ), entry AS ( \
             INSERT INTO ledger_entries (account_id, kind, amount, available_after, \
                 reserved_after, used_after, reservation_id, actor) \
             SELECT $1, 'reserve', $3, moved.available, moved.reserved, moved.used, held.id, $10 \
             FROM moved, held \
         ) \
         SELECT * FROM held",
        reserve = reserve_update_sql(1, 3),
        key_may_spend = key_may_spend_sql(7, 8, 9, 1),
    )
});

/// The SQL of [`reserve_fast`] (for the pgbench twin of the benchmark).
pub fn reserve_fast_sql() -> &'static str {
    RESERVE_FAST_SQL.as_str()
}

/// The common case of a reservation — a valid key, a new request_id,
/// enough tokens — in one statement. `None` when it does not apply (a bad
/// key, a refusal, a request_id already used): then the statement changed
/// nothing and the caller takes the full path, [`reserve`], which answers
/// the replay or explains the refusal.
pub fn reserve_fast(
    conn: &mut PgConnection,
    credentials: &Credentials,
    account: AccountId,
    request: &ReserveRequest,
    default_ttl_seconds: i32,
) -> Result<Option<ReservationRow>, ApiError> {
    let ttl = request
        .ttl_seconds
        .map_or(default_ttl_seconds, TtlSeconds::get);
    let (bootstrap, key_id, secret_hash) = credentials.spend_check_binds();
    let result = prepared(RESERVE_FAST_SQL.as_str())
        .bind::<SqlUuid, _>(account.0)
        .bind::<SqlUuid, _>(Uuid::now_v7())
        .bind::<BigInt, _>(request.amount.get())
        .bind::<SqlUuid, _>(request.request_id.0)
        .bind::<Nullable<Integer>, _>(request.ttl_seconds.map(TtlSeconds::get))
        .bind::<Integer, _>(ttl)
        .bind::<Bool, _>(bootstrap)
        .bind::<SqlUuid, _>(key_id)
        .bind::<Bytea, _>(secret_hash)
        .bind::<Text, _>(credentials.actor())
        .get_result::<ReservationRow>(conn)
        .optional();
    match result {
        Ok(row) => Ok(row),
        Err(error) if undone_by_conflict(&error) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// A one-statement path lost a race and PostgreSQL undid the statement:
/// the request_id was taken meanwhile (unique violation), or the statement
/// was chosen as a deadlock victim. The full path then answers.
pub fn undone_by_conflict(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _) => true,
        DieselError::DatabaseError(_, info) => info.message().contains("deadlock detected"),
        _ => false,
    }
}

/// Locks the account row as its balance `UPDATE` will (a no-op for an
/// unknown account: the insert that follows then reports it).
pub fn lock_account(conn: &mut PgConnection, account: AccountId) -> Result<(), ApiError> {
    prepared("SELECT 1 AS locked FROM accounts WHERE id = $1 FOR NO KEY UPDATE")
        .bind::<SqlUuid, _>(account.0)
        .execute(conn)?;
    Ok(())
}

/// Creates a reservation, idempotent on `(account, request_id)`.
pub fn reserve(
    conn: &mut PgConnection,
    account: AccountId,
    request: &ReserveRequest,
    default_ttl_seconds: i32,
    actor: &str,
) -> Result<(ReservationRow, Outcome), ApiError> {
    let ttl = request
        .ttl_seconds
        .map_or(default_ttl_seconds, TtlSeconds::get);
    // A replay is answered without locking anything.
    if let Some(existing) = find_reservation(conn, account, request.request_id)? {
        return replay_of(existing, request);
    }
    conn.transaction(|conn| {
        // Lock the account row first, as `reserve_fast` does, so the two
        // paths cannot deadlock on (account row, request_id).
        lock_account(conn, account)?;
        // Claim the request_id: a concurrent duplicate blocks here on the
        // unique index until this transaction ends, then sees our row.
        let inserted: Option<ReservationRow> = prepared(
            "INSERT INTO reservations \
                 (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) \
             VALUES ($1, $2, $3, $4, $5, 'held', now() + make_interval(secs => $6)) \
             ON CONFLICT (account_id, request_id) WHERE job_id IS NULL DO NOTHING \
             RETURNING *",
        )
        .bind::<SqlUuid, _>(Uuid::now_v7())
        .bind::<SqlUuid, _>(account.0)
        .bind::<SqlUuid, _>(request.request_id.0)
        .bind::<BigInt, _>(request.amount.get())
        .bind::<Nullable<Integer>, _>(request.ttl_seconds.map(TtlSeconds::get))
        .bind::<Integer, _>(ttl)
        .get_result(conn)
        .optional()
        .map_err(|error| match error {
            DieselError::DatabaseError(DatabaseErrorKind::ForeignKeyViolation, _) => {
                ApiError::NotFound("account")
            }
            other => other.into(),
        })?;
        let Some(reservation) = inserted else {
            let existing = find_reservation(conn, account, request.request_id)?
                .ok_or_else(|| ApiError::Internal("a claimed request_id has no row".into()))?;
            return replay_of(existing, request);
        };
        let Some(after) = reserve_tokens(conn, account, request.amount.get())? else {
            return Err(refusal_reason(conn, account, request.amount.get()));
        };
        ledger::append(
            conn,
            Movement {
                account,
                kind: EntryKind::Reserve,
                amount: request.amount.get(),
                after,
                reservation_id: Some(reservation.id),
                job_id: None,
                external_ref: None,
                reason: None,
                actor,
            },
        )?;
        Ok((reservation, Outcome::Created))
    })
}

/// The API-owned reservation made for `request_id`, if any.
fn find_reservation(
    conn: &mut PgConnection,
    account: AccountId,
    request_id: RequestId,
) -> Result<Option<ReservationRow>, ApiError> {
    Ok(reservations::table
        .filter(reservations::account_id.eq(account.0))
        .filter(reservations::request_id.eq(request_id.0))
        .filter(reservations::job_id.is_null())
        .select(ReservationRow::as_select())
        .first(conn)
        .optional()?)
}

/// The answer to a request_id seen before: a replay if the request is the
/// same, else 422.
fn replay_of(
    existing: ReservationRow,
    request: &ReserveRequest,
) -> Result<(ReservationRow, Outcome), ApiError> {
    let same = existing.amount == request.amount.get()
        && existing.requested_ttl_seconds == request.ttl_seconds.map(TtlSeconds::get);
    if !same {
        return Err(ApiError::IdempotencyKeyReused(format!(
            "request_id {} was already used for a different reservation",
            request.request_id
        )));
    }
    Ok((existing, Outcome::Replayed))
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

/// How a held reservation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Spend this many tokens (≤ held); the rest goes back to available.
    Commit(i64),
    Release,
    /// The reaper's release of a reservation past `expires_at`.
    Expire,
}

/// Applies a resolution to the account and the ledger after the reservation
/// row has been moved out of `held` by this transaction. Returns the
/// balances after. `reason` and `job_id` go to the ledger.
pub fn settle(
    conn: &mut PgConnection,
    reservation: &ReservationRow,
    resolution: Resolution,
    reason: Option<&str>,
    actor: &str,
) -> Result<Balances, ApiError> {
    let committed = match resolution {
        Resolution::Commit(amount) => amount,
        Resolution::Release | Resolution::Expire => 0,
    };
    let returned = reservation.amount - committed;
    debug_assert!(
        committed >= 0 && returned >= 0,
        "resolution within the held amount"
    );
    let after: Balances = prepared(
        "UPDATE accounts \
         SET reserved = reserved - $2, used = used + $3, available = available + $4, \
             active_reservations = active_reservations - 1, \
             version = version + 1, updated_at = now() \
         WHERE id = $1 \
         RETURNING available, reserved, used",
    )
    .bind::<SqlUuid, _>(reservation.account_id)
    .bind::<BigInt, _>(reservation.amount)
    .bind::<BigInt, _>(committed)
    .bind::<BigInt, _>(returned)
    .get_result(conn)?;
    let account = AccountId(reservation.account_id);
    let movement = |kind, amount, after| Movement {
        account,
        kind,
        amount,
        after,
        reservation_id: Some(reservation.id),
        job_id: reservation.job_id,
        external_ref: None,
        reason,
        actor,
    };
    if committed > 0 {
        // The commit entry's balances-after are those before the release of
        // the remainder, so a replay of the entries passes through them.
        let after_commit = Balances {
            available: after.available - returned,
            reserved: after.reserved + returned,
            used: after.used,
        };
        ledger::append(conn, movement(EntryKind::Commit, committed, after_commit))?;
    }
    if returned > 0 {
        let kind = if resolution == Resolution::Expire {
            EntryKind::Expire
        } else {
            EntryKind::Release
        };
        ledger::append(conn, movement(kind, returned, after))?;
    }
    Ok(after)
}

/// What a request (or the expiry on access) asks of a held reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wanted {
    /// Spend this many tokens, or all held (`None`).
    Commit(Option<i64>),
    Release,
    Expire,
}

/// Moves a held, unexpired reservation to its final state. `None` when the
/// reservation is not (or no longer) held, or the commit exceeds it.
fn transition_held(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
    wanted: Wanted,
) -> Result<Option<ReservationRow>, ApiError> {
    let (state, committed) = match wanted {
        Wanted::Commit(amount) => ("committed", amount),
        Wanted::Release => ("released", None),
        Wanted::Expire => ("expired", None),
    };
    let expiry_condition = if wanted == Wanted::Expire {
        "expires_at <= now()"
    } else {
        "expires_at > now()"
    };
    // A commit without an amount spends all that is held ($4 NULL).
    Ok(prepared(format!(
        "UPDATE reservations \
         SET state = $3, resolved_at = now(), \
             committed_amount = CASE WHEN $3 = 'committed' THEN COALESCE($4, amount) ELSE 0 END \
         WHERE id = $1 AND account_id = $2 AND state = 'held' AND {expiry_condition} \
           AND amount >= COALESCE($4, 0) \
         RETURNING *"
    ))
    .bind::<SqlUuid, _>(reservation.0)
    .bind::<SqlUuid, _>(account.0)
    .bind::<Text, _>(state)
    .bind::<Nullable<BigInt>, _>(committed)
    .get_result(conn)
    .optional()?)
}

/// Why a reservation could not be resolved or extended as asked: replay,
/// not found, wrong state, or past expiry (`ExpiredUnreaped`).
enum Refusal {
    Replay(ReservationRow),
    Error(ApiError),
    ExpiredUnreaped,
}

fn classify_refusal(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
    wanted: Option<Wanted>,
) -> Result<Refusal, ApiError> {
    let row = get_reservation(conn, account, reservation)?;
    if row.job_id.is_some() {
        return Ok(Refusal::Error(ApiError::ReservationOwnedByJob));
    }
    let same_resolution = match (wanted, row.state.as_str()) {
        (Some(Wanted::Commit(amount)), "committed") => {
            row.committed_amount == amount.unwrap_or(row.amount)
        }
        (Some(Wanted::Release), "released") => true,
        _ => false,
    };
    if same_resolution {
        return Ok(Refusal::Replay(row));
    }
    if row.state == "held" {
        if let Some(Wanted::Commit(Some(amount))) = wanted {
            if amount > row.amount {
                return Ok(Refusal::Error(ApiError::InvalidRequest(format!(
                    "amount {amount} exceeds the {} tokens held by this reservation",
                    row.amount
                ))));
            }
        }
        return Ok(Refusal::ExpiredUnreaped);
    }
    Ok(Refusal::Error(ApiError::ReservationNotHeld {
        state: row.state,
    }))
}

/// A commit or release in one statement (its own transaction, one round
/// trip): verify the key, move the reservation out of `held` (the same
/// conditional `UPDATE` as `transition_held`, and only a reservation no job
/// owns), move the tokens and write the ledger entries exactly as
/// [`settle`] does — the commit entry first, then the release of the rest.
static RESOLVE_FAST_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH settled AS ( \
             UPDATE reservations \
             SET state = $3, resolved_at = now(), \
                 committed_amount = CASE WHEN $3 = 'committed' THEN COALESCE($4, amount) ELSE 0 END \
             WHERE id = $1 AND account_id = $2 AND state = 'held' AND expires_at > now() \
               AND job_id IS NULL AND amount >= COALESCE($4, 0) \
               AND {key_may_spend} \
             RETURNING * \
         ), moved AS ( \
             UPDATE accounts \
             SET reserved = accounts.reserved - settled.amount, \
                 used = accounts.used + settled.committed_amount, \
                 available = accounts.available + (settled.amount - settled.committed_amount), \
                 active_reservations = accounts.active_reservations - 1, \
                 version = accounts.version + 1, updated_at = now() \
             FROM settled WHERE accounts.id = settled.account_id \
             RETURNING accounts.available, accounts.reserved, accounts.used, \
                 settled.committed_amount AS committed, \
                 settled.amount - settled.committed_amount AS returned \
         ), entries AS ( \
             INSERT INTO ledger_entries (account_id, kind, amount, available_after, \
                 reserved_after, used_after, reservation_id, actor) \
             SELECT $2, entry.kind, entry.amount, entry.available_after, \
                 entry.reserved_after, moved.used, $1, $8 \
             FROM moved, LATERAL (VALUES \
                 (1, 'commit', moved.committed, \
                  moved.available - moved.returned, moved.reserved + moved.returned), \
                 (2, 'release', moved.returned, moved.available, moved.reserved) \
             ) AS entry (position, kind, amount, available_after, reserved_after) \
             WHERE entry.amount > 0 \
             ORDER BY entry.position \
         ) \
         SELECT * FROM settled",
        key_may_spend = key_may_spend_sql(5, 6, 7, 2),
    )
});

/// The SQL of [`resolve_fast`] (for the pgbench twin of the benchmark).
pub fn resolve_fast_sql() -> &'static str {
    RESOLVE_FAST_SQL.as_str()
}

/// The common case of a commit or release — a valid key, a held unexpired
/// reservation no job owns — in one statement. `None` when it does not
/// apply; then nothing changed and the caller takes the full path,
/// [`resolve`], which answers the replay or explains the refusal.
pub fn resolve_fast(
    conn: &mut PgConnection,
    credentials: &Credentials,
    account: AccountId,
    reservation: ReservationId,
    commit_amount: Option<Tokens>,
    release: bool,
) -> Result<Option<ReservationRow>, ApiError> {
    let (state, committed) = if release {
        ("released", None)
    } else {
        ("committed", commit_amount.map(Tokens::get))
    };
    let (bootstrap, key_id, secret_hash) = credentials.spend_check_binds();
    Ok(prepared(RESOLVE_FAST_SQL.as_str())
        .bind::<SqlUuid, _>(reservation.0)
        .bind::<SqlUuid, _>(account.0)
        .bind::<Text, _>(state)
        .bind::<Nullable<BigInt>, _>(committed)
        .bind::<Bool, _>(bootstrap)
        .bind::<SqlUuid, _>(key_id)
        .bind::<Bytea, _>(secret_hash)
        .bind::<Text, _>(credentials.actor())
        .get_result::<ReservationRow>(conn)
        .optional()
        .or_else(|error| {
            if undone_by_conflict(&error) {
                Ok(None)
            } else {
                Err(error)
            }
        })?)
}

/// Commits (`amount`: default all) or releases a reservation the API owns.
pub fn resolve(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
    commit_amount: Option<Tokens>,
    release: bool,
    actor: &str,
) -> Result<(ReservationRow, Outcome), ApiError> {
    let wanted = if release {
        Wanted::Release
    } else {
        Wanted::Commit(commit_amount.map(Tokens::get))
    };
    let outcome = conn.transaction(|conn| {
        // Jobs own their reservations: only their worker resolves them.
        if let Some(row) = transition_held(conn, account, reservation, wanted)? {
            if row.job_id.is_some() {
                return Err(ApiError::ReservationOwnedByJob);
            }
            let resolution = if release {
                Resolution::Release
            } else {
                Resolution::Commit(row.committed_amount)
            };
            settle(conn, &row, resolution, None, actor)?;
            return Ok(Ok((row, Outcome::Created)));
        }
        match classify_refusal(conn, account, reservation, Some(wanted))? {
            Refusal::Replay(row) => Ok(Ok((row, Outcome::Replayed))),
            Refusal::Error(error) => Err(error),
            Refusal::ExpiredUnreaped => Ok(Err(())),
        }
    })?;
    outcome.map_err(|()| expire_on_access(conn, account, reservation, actor))
}

/// Extends a held, unexpired reservation to `now() + ttl` (a heartbeat).
pub fn extend(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
    ttl: TtlSeconds,
    actor: &str,
) -> Result<ReservationRow, ApiError> {
    let extended: Option<ReservationRow> = prepared(
        "UPDATE reservations SET expires_at = now() + make_interval(secs => $3) \
         WHERE id = $1 AND account_id = $2 AND state = 'held' AND expires_at > now() \
           AND job_id IS NULL \
         RETURNING *",
    )
    .bind::<SqlUuid, _>(reservation.0)
    .bind::<SqlUuid, _>(account.0)
    .bind::<Integer, _>(ttl.get())
    .get_result(conn)
    .optional()?;
    if let Some(row) = extended {
        return Ok(row);
    }
    match classify_refusal(conn, account, reservation, None)? {
        Refusal::Replay(row) => Ok(row),
        Refusal::Error(error) => Err(error),
        Refusal::ExpiredUnreaped => Err(expire_on_access(conn, account, reservation, actor)),
    }
}

/// A reservation past its expiry that the reaper has not reached yet is
/// expired right away (its tokens go back now), and the caller is told so.
fn expire_on_access(
    conn: &mut PgConnection,
    account: AccountId,
    reservation: ReservationId,
    actor: &str,
) -> ApiError {
    let result = conn.transaction(|conn| {
        if let Some(row) = transition_held(conn, account, reservation, Wanted::Expire)? {
            settle(
                conn,
                &row,
                Resolution::Expire,
                Some("expired_on_access"),
                actor,
            )?;
        }
        get_reservation(conn, account, reservation)
    });
    match result {
        Ok(row) => ApiError::ReservationNotHeld { state: row.state },
        Err(error) => error,
    }
}
