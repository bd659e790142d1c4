//! The append-only ledger: one entry per balance movement, written in the
//! same transaction as the movement, carrying the account's balances after
//! it. Replaying an account's entries reproduces its balance columns.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Timestamptz, Uuid as SqlUuid};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::paging::page_of;
use crate::engine::types::AccountId;
use crate::error::ApiError;

/// The three places a token can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Queryable, QueryableByName)]
pub struct Balances {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub available: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub reserved: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub used: i64,
}

impl Balances {
    pub fn total(self) -> i64 {
        self.available + self.reserved + self.used
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Credit,
    Adjustment,
    Reserve,
    Commit,
    Release,
    Expire,
    /// A grant's lapse: its tokens leave the account.
    GrantExpire,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Credit => "credit",
            EntryKind::Adjustment => "adjustment",
            EntryKind::Reserve => "reserve",
            EntryKind::Commit => "commit",
            EntryKind::Release => "release",
            EntryKind::Expire => "expire",
            EntryKind::GrantExpire => "grant_expire",
        }
    }

    pub fn parse(text: &str) -> Option<EntryKind> {
        [
            EntryKind::Credit,
            EntryKind::Adjustment,
            EntryKind::Reserve,
            EntryKind::Commit,
            EntryKind::Release,
            EntryKind::Expire,
            EntryKind::GrantExpire,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }

    /// How this kind of entry moves tokens between the three places (the
    /// engine's `engine_deltas`, replayed here to check it). A
    /// `grant_expire` takes its tokens out of `available`, or out of
    /// `reserved` when it names a reservation (`of_reservation`): the rest
    /// of a reservation going back to a grant that has lapsed.
    pub fn apply(self, before: Balances, amount: i64, of_reservation: bool) -> Balances {
        let Balances {
            available,
            reserved,
            used,
        } = before;
        match self {
            EntryKind::Credit | EntryKind::Adjustment => Balances {
                available: available + amount,
                reserved,
                used,
            },
            EntryKind::Reserve => Balances {
                available: available - amount,
                reserved: reserved + amount,
                used,
            },
            EntryKind::Commit => Balances {
                available,
                reserved: reserved - amount,
                used: used + amount,
            },
            EntryKind::Release | EntryKind::Expire => Balances {
                available: available + amount,
                reserved: reserved - amount,
                used,
            },
            EntryKind::GrantExpire if of_reservation => Balances {
                available,
                reserved: reserved - amount,
                used,
            },
            EntryKind::GrantExpire => Balances {
                available: available - amount,
                reserved,
                used,
            },
        }
    }
}

/// A ledger entry as the ledger API and the events' `entry` show it: the
/// engine writes it (`engine_entry_json`, src/engine/sql/05_views.sql).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerEntryView {
    pub entry_id: i64,
    pub account_id: AccountId,
    /// `credit`, `adjustment`, `reserve`, `commit`, `release`, `expire` or
    /// `grant_expire` (a grant's lapse: `grant_id` names the grant; with a
    /// `reservation_id`, the rest of that reservation went back to the
    /// grant after it lapsed and left `reserved`, else it left `available`).
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
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    /// The grant whose tokens the entry moves (a movement spanning several
    /// grants writes one entry per grant); null for entries written before
    /// grants existed.
    pub grant_id: Option<Uuid>,
    /// The API key whose request wrote the entry (a reserve, a kiosk's
    /// commit or release, an admin's credit); null for the service's own
    /// movements (a job's settlement by the worker, an expiry, a lapse, a
    /// top-up) and for entries written before keys were recorded. Null to
    /// a kiosk key, which sees no key's id (`actor` names the key).
    pub api_key_id: Option<Uuid>,
    /// A top-up's credit: the rule that made it (docs/topups.md); else null.
    pub topup_rule_id: Option<Uuid>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LedgerPage {
    pub entries: Vec<LedgerEntryView>,
    pub next_after: Option<i64>,
}

/// One page of an account's ledger, oldest first, after the cursor, and
/// only entries written at or after `since` when it is given.
pub fn list_entries(
    conn: &mut PgConnection,
    account: AccountId,
    after: Option<i64>,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<LedgerPage, ApiError> {
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = Jsonb)]
        entry: serde_json::Value,
    }
    // The entry as the engine shows it (`engine_entry_json`, which the
    // events' `entry` is too).
    let shown: Vec<Shown> = diesel::sql_query(
        "SELECT engine_entry_json(to_jsonb(e)) AS entry FROM ledger_entries e \
         WHERE e.account_id = $1 AND e.id > $2 \
           AND ($3::timestamptz IS NULL OR e.created_at >= $3) \
         ORDER BY e.id LIMIT $4",
    )
    .bind::<SqlUuid, _>(account.0)
    .bind::<BigInt, _>(after.unwrap_or(0))
    .bind::<Nullable<Timestamptz>, _>(since)
    .bind::<BigInt, _>(limit + 1)
    .load(conn)?;
    let views = shown
        .into_iter()
        .map(|shown| {
            crate::engine::decode::<LedgerEntryView>(
                shown.entry,
                "a ledger entry as the engine shows it",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (entries, next_after) = page_of(views, limit, |view: &LedgerEntryView| view.entry_id);
    Ok(LedgerPage {
        entries,
        next_after,
    })
}

/// The page as a kiosk may see it: each `actor` that is a key id becomes
/// that key's scope and label (`api_keys::actors_for_kiosk`), so a kiosk
/// never learns another key's id. The ledger itself stays as written.
pub fn as_kiosk_sees_it(
    conn: &mut PgConnection,
    mut page: LedgerPage,
) -> Result<LedgerPage, ApiError> {
    let actors = page.entries.iter().map(|entry| entry.actor.clone());
    let names = crate::domain::api_keys::actors_for_kiosk(conn, actors)?;
    for entry in &mut page.entries {
        if let Some(name) = names.get(&entry.actor) {
            entry.actor.clone_from(name);
        }
        entry.api_key_id = None;
    }
    Ok(page)
}

/// Replays entries (oldest first) from zero balances: kind, amount, and
/// whether the entry names a reservation.
pub fn replay<'a>(
    entries: impl IntoIterator<Item = (&'a str, i64, bool)>,
) -> Result<Balances, String> {
    entries.into_iter().try_fold(
        Balances::default(),
        |balances, (kind, amount, of_reservation)| {
            EntryKind::parse(kind)
                .map(|kind| kind.apply(balances, amount, of_reservation))
                .ok_or_else(|| format!("unknown ledger kind {kind:?}"))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_moves_tokens_between_places() {
        let balances = replay([
            ("credit", 10, false),
            ("reserve", 4, true),
            ("commit", 3, true),
            ("release", 1, true),
            ("reserve", 2, true),
            ("expire", 2, true),
            ("adjustment", -1, false),
            ("reserve", 3, true),
            ("grant_expire", 2, false),
            ("grant_expire", 1, true),
        ])
        .expect("known kinds");
        assert_eq!(
            balances,
            Balances {
                available: 1,
                reserved: 2,
                used: 3
            }
        );
        assert!(replay([("bogus", 1, false)]).is_err());
    }
}
