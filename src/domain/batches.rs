//! Coalesced spending on one account: several concurrent reservations, or
//! several commits and releases, in one transaction.
//!
//! Every request on an account serialises on the account row, held from its
//! `UPDATE` to `COMMIT` (a WAL flush). A batch takes that lock once for many
//! requests. It keeps every guarantee of the one-by-one paths:
//! - each request's key is verified (`revoked_at` read now) and authorised
//!   for this account;
//! - requests are taken in arrival order, each against the balances the
//!   earlier ones left, exactly as one-by-one processing would;
//! - every movement has its ledger entry, with the balances after it, in
//!   the same transaction, in order;
//! - a request the batch does not handle — a bad key, another caller's
//!   account, a request_id seen before, not enough tokens, the limit, a
//!   reservation not held — gets `None` and takes the one-by-one path
//!   afterwards, which answers it exactly as without coalescing;
//! - any error rolls the whole batch back (`None` for all, one by one).
//!
//! Lock order is that of the one-by-one paths: reserve locks the account
//! row first; commit and release lock the reservations (in id order), then
//! the account row.

use std::collections::HashSet;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Uuid as SqlUuid};
use uuid::Uuid;

use crate::db::models::{AccountRow, ReservationRow};
use crate::db::prepared;
use crate::db::schema::{accounts, reservations};
use crate::domain::api_keys::{verify_many, Credentials};
use crate::domain::ledger::{Balances, EntryKind};
use crate::domain::reservations::ReserveRequest;
use crate::domain::types::{AccountId, ReservationId, Tokens, TtlSeconds};
use crate::error::ApiError;

/// One reservation request of a batch.
pub struct ReserveItem {
    pub credentials: Credentials,
    pub request: ReserveRequest,
}

/// One commit (`amount`, default all held) or release of a batch.
pub struct ResolveItem {
    pub credentials: Credentials,
    pub reservation: ReservationId,
    pub amount: Option<Tokens>,
    pub release: bool,
}

/// Ledger entries to append, in order.
#[derive(Default)]
struct Entries {
    kinds: Vec<&'static str>,
    amounts: Vec<i64>,
    available: Vec<i64>,
    reserved: Vec<i64>,
    used: Vec<i64>,
    reservations: Vec<Uuid>,
    actors: Vec<String>,
}

impl Entries {
    fn push(
        &mut self,
        kind: EntryKind,
        amount: i64,
        after: Balances,
        reservation: Uuid,
        actor: &str,
    ) {
        self.kinds.push(kind.as_str());
        self.amounts.push(amount);
        self.available.push(after.available);
        self.reserved.push(after.reserved);
        self.used.push(after.used);
        self.reservations.push(reservation);
        self.actors.push(actor.to_owned());
    }

    fn append(self, conn: &mut PgConnection, account: AccountId) -> Result<(), ApiError> {
        prepared(
            "INSERT INTO ledger_entries (account_id, kind, amount, available_after, \
                 reserved_after, used_after, reservation_id, actor) \
             SELECT $1, kind, amount, available_after, reserved_after, used_after, \
                 reservation_id, actor \
             FROM unnest($2, $3, $4, $5, $6, $7, $8) WITH ORDINALITY \
                 AS entry (kind, amount, available_after, reserved_after, used_after, \
                           reservation_id, actor, position) \
             ORDER BY position",
        )
        .bind::<SqlUuid, _>(account.0)
        .bind::<Array<Text>, _>(self.kinds)
        .bind::<Array<BigInt>, _>(self.amounts)
        .bind::<Array<BigInt>, _>(self.available)
        .bind::<Array<BigInt>, _>(self.reserved)
        .bind::<Array<BigInt>, _>(self.used)
        .bind::<Array<SqlUuid>, _>(self.reservations)
        .bind::<Array<Text>, _>(self.actors)
        .execute(conn)?;
        Ok(())
    }
}

/// Creates the reservations of `items` that can be made, in order, in one
/// transaction; `None` for the others (see the module documentation).
pub fn reserve_batch(
    conn: &mut PgConnection,
    account: AccountId,
    items: &[ReserveItem],
    default_ttl_seconds: i32,
) -> Result<Vec<Option<ReservationRow>>, ApiError> {
    let mut created = vec![None; items.len()];
    conn.transaction(|conn| {
        let row: Option<AccountRow> = accounts::table
            .find(account.0)
            .select(AccountRow::as_select())
            .for_no_key_update()
            .first(conn)
            .optional()?;
        let Some(row) = row.filter(|row| row.status == "active") else {
            return Ok(());
        };
        let presented: Vec<&Credentials> = items.iter().map(|item| &item.credentials).collect();
        let callers = verify_many(conn, &presented)?;
        let request_ids: Vec<Uuid> = items.iter().map(|item| item.request.request_id.0).collect();
        let taken: HashSet<Uuid> = reservations::table
            .filter(reservations::account_id.eq(account.0))
            .filter(reservations::job_id.is_null())
            .filter(reservations::request_id.eq_any(&request_ids))
            .select(reservations::request_id)
            .load::<Uuid>(conn)?
            .into_iter()
            .collect();

        let mut balances = Balances {
            available: row.available,
            reserved: row.reserved,
            used: row.used,
        };
        let mut active = row.active_reservations;
        let mut seen = HashSet::new();
        let mut accepted = Vec::new();
        let mut entries = Entries::default();
        for (index, (item, caller)) in items.iter().zip(&callers).enumerate() {
            let Some(caller) = caller else { continue };
            let (request, amount) = (&item.request, item.request.amount.get());
            let request_id = request.request_id.0;
            let within_limit =
                row.max_active_reservations == 0 || active < row.max_active_reservations;
            if caller.authorize_spend(account).is_err()
                || taken.contains(&request_id)
                || !seen.insert(request_id)
                || balances.available < amount
                || !within_limit
            {
                continue;
            }
            balances = EntryKind::Reserve.apply(balances, amount);
            active += 1;
            let id = Uuid::now_v7();
            entries.push(EntryKind::Reserve, amount, balances, id, &caller.actor());
            accepted.push((index, id));
        }
        if accepted.is_empty() {
            return Ok(());
        }

        let chosen = || accepted.iter().map(|&(index, _)| &items[index].request);
        let inserted: Vec<ReservationRow> = prepared(
            "INSERT INTO reservations \
                 (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) \
             SELECT id, $1, request_id, amount, requested_ttl, 'held', \
                 now() + make_interval(secs => ttl) \
             FROM unnest($2, $3, $4, $5, $6) AS new (id, request_id, amount, requested_ttl, ttl) \
             RETURNING *",
        )
        .bind::<SqlUuid, _>(account.0)
        .bind::<Array<SqlUuid>, _>(accepted.iter().map(|&(_, id)| id).collect::<Vec<_>>())
        .bind::<Array<SqlUuid>, _>(chosen().map(|r| r.request_id.0).collect::<Vec<_>>())
        .bind::<Array<BigInt>, _>(chosen().map(|r| r.amount.get()).collect::<Vec<_>>())
        .bind::<Array<Nullable<Integer>>, _>(
            chosen()
                .map(|r| r.ttl_seconds.map(TtlSeconds::get))
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Integer>, _>(
            chosen()
                .map(|r| r.ttl_seconds.map_or(default_ttl_seconds, TtlSeconds::get))
                .collect::<Vec<_>>(),
        )
        .load(conn)?;
        let after: Balances = prepared(
            "UPDATE accounts \
             SET available = available - $2, reserved = reserved + $2, \
                 active_reservations = active_reservations + $3, \
                 version = version + 1, updated_at = now() \
             WHERE id = $1 \
             RETURNING available, reserved, used",
        )
        .bind::<SqlUuid, _>(account.0)
        .bind::<BigInt, _>(balances.reserved - row.reserved)
        .bind::<Integer, _>(active - row.active_reservations)
        .get_result(conn)?;
        if after != balances {
            return Err(ApiError::Internal(format!(
                "coalesced reservations on {account}: balances {after:?}, computed {balances:?}"
            )));
        }
        entries.append(conn, account)?;
        for reservation in inserted {
            if let Some(&(index, _)) = accepted.iter().find(|&&(_, id)| id == reservation.id) {
                created[index] = Some(reservation);
            }
        }
        Ok::<_, ApiError>(())
    })?;
    Ok(created)
}

/// Commits or releases the reservations of `items` that are held, in one
/// transaction; `None` for the others (see the module documentation).
pub fn resolve_batch(
    conn: &mut PgConnection,
    account: AccountId,
    items: &[ResolveItem],
) -> Result<Vec<Option<ReservationRow>>, ApiError> {
    let mut resolved = vec![None; items.len()];
    conn.transaction(|conn| {
        let presented: Vec<&Credentials> = items.iter().map(|item| &item.credentials).collect();
        let callers = verify_many(conn, &presented)?;
        let mut seen = HashSet::new();
        let chosen: Vec<usize> = (0..items.len())
            .filter(|&index| {
                callers[index]
                    .as_ref()
                    .is_some_and(|caller| caller.authorize_spend(account).is_ok())
                    && seen.insert(items[index].reservation.0)
            })
            .collect();
        if chosen.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = chosen
            .iter()
            .map(|&index| items[index].reservation.0)
            .collect();
        // Lock the reservations in id order (two batches never wait on each
        // other crosswise), then move those still held, unexpired, owned by
        // no job, and holding at least the amount to commit.
        prepared(
            "SELECT id FROM reservations WHERE id = ANY($1) AND account_id = $2 \
             ORDER BY id FOR NO KEY UPDATE",
        )
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<SqlUuid, _>(account.0)
        .execute(conn)?;
        let moved: Vec<ReservationRow> = prepared(
            "UPDATE reservations r \
             SET state = wanted.state, resolved_at = now(), \
                 committed_amount = CASE WHEN wanted.state = 'committed' \
                                         THEN COALESCE(wanted.amount, r.amount) ELSE 0 END \
             FROM unnest($1, $2, $3) AS wanted (id, state, amount) \
             WHERE r.id = wanted.id AND r.account_id = $4 AND r.state = 'held' \
               AND r.expires_at > now() AND r.job_id IS NULL \
               AND r.amount >= COALESCE(wanted.amount, 0) \
             RETURNING r.*",
        )
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(
            chosen
                .iter()
                .map(|&index| {
                    if items[index].release {
                        "released"
                    } else {
                        "committed"
                    }
                })
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<BigInt>>, _>(
            chosen
                .iter()
                .map(|&index| items[index].amount.map(Tokens::get))
                .collect::<Vec<_>>(),
        )
        .bind::<SqlUuid, _>(account.0)
        .load(conn)?;
        if moved.is_empty() {
            return Ok(());
        }
        let (amount, committed): (i64, i64) = moved.iter().fold((0, 0), |(a, c), row| {
            (a + row.amount, c + row.committed_amount)
        });
        let after: Balances = prepared(
            "UPDATE accounts \
             SET reserved = reserved - $2, used = used + $3, available = available + $4, \
                 active_reservations = active_reservations - $5, \
                 version = version + 1, updated_at = now() \
             WHERE id = $1 \
             RETURNING available, reserved, used",
        )
        .bind::<SqlUuid, _>(account.0)
        .bind::<BigInt, _>(amount)
        .bind::<BigInt, _>(committed)
        .bind::<BigInt, _>(amount - committed)
        .bind::<Integer, _>(i32::try_from(moved.len()).unwrap_or(i32::MAX))
        .get_result(conn)?;
        // Replay the moves in arrival order from the balances before them.
        let mut balances = Balances {
            available: after.available - (amount - committed),
            reserved: after.reserved + amount,
            used: after.used - committed,
        };
        let mut entries = Entries::default();
        for &index in &chosen {
            let Some(row) = moved
                .iter()
                .find(|row| row.id == items[index].reservation.0)
            else {
                continue;
            };
            let actor = callers[index]
                .as_ref()
                .map(|caller| caller.actor())
                .unwrap_or_default();
            let returned = row.amount - row.committed_amount;
            if row.committed_amount > 0 {
                balances = EntryKind::Commit.apply(balances, row.committed_amount);
                entries.push(
                    EntryKind::Commit,
                    row.committed_amount,
                    balances,
                    row.id,
                    &actor,
                );
            }
            if returned > 0 {
                balances = EntryKind::Release.apply(balances, returned);
                entries.push(EntryKind::Release, returned, balances, row.id, &actor);
            }
            resolved[index] = Some(row.clone());
        }
        if balances != after {
            return Err(ApiError::Internal(format!(
                "coalesced resolutions on {account}: balances {after:?}, computed {balances:?}"
            )));
        }
        entries.append(conn, account)?;
        Ok::<_, ApiError>(())
    })?;
    Ok(resolved)
}
