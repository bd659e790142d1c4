//! The ledger digest finance can keep: a SHA-256 hash chain over every
//! ledger entry created up to an instant, entry by entry in id order.
//!
//! Written down today, it lets anyone check later that the ledger up to
//! that instant is still the same — after a restore from backup, or in an
//! audit — without trusting the database: changing, removing or inserting
//! one entry changes the digest of every later link.
//!
//! The chain (format `sha256-chain-v1`, documented in docs/backup.md so an
//! auditor can recompute it without this binary):
//!
//! ```text
//! link_0 = "0" × 64
//! link_n = hex(sha256(link_{n-1} ‖ "\n" ‖ canonical(entry_n)))
//! ```
//!
//! where `canonical(entry)` is the compact JSON array `[id, account_id,
//! kind, amount, available_after, reserved_after, used_after,
//! reservation_id, job_id, external_ref, reason, actor, created_at]`
//! (`null` for absent values, `created_at` in UTC with microseconds, e.g.
//! `2026-12-01T14:03:00.123456Z`). The digest is the last link.

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::db::models::LedgerEntryRow;
use crate::db::schema::ledger_entries;
use crate::error::ApiError;

/// The name of the chain's definition, printed with every digest.
pub const FORMAT: &str = "sha256-chain-v1";

/// Entries read per query: bounds memory on a ledger of any size.
pub const LEDGER_DIGEST_BATCH: i64 = 10_000;

/// The first link of every chain: 64 zeros.
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LedgerDigest {
    pub digest: String,
    pub entries: u64,
    pub until: String,
    pub last_entry_id: Option<i64>,
    pub format: &'static str,
}

/// The compact JSON array an entry is hashed as.
pub fn canonical(entry: &LedgerEntryRow) -> String {
    serde_json::json!([
        entry.id,
        entry.account_id,
        entry.kind,
        entry.amount,
        entry.available_after,
        entry.reserved_after,
        entry.used_after,
        entry.reservation_id,
        entry.job_id,
        entry.external_ref,
        entry.reason,
        entry.actor,
        entry
            .created_at
            .to_rfc3339_opts(SecondsFormat::Micros, true),
    ])
    .to_string()
}

/// The next link of the chain.
pub fn next_link(previous: &str, entry: &LedgerEntryRow) -> String {
    let mut hasher = Sha256::new();
    hasher.update(previous.as_bytes());
    hasher.update(b"\n");
    hasher.update(canonical(entry).as_bytes());
    hex::encode(hasher.finalize())
}

/// The digest of every entry with `created_at <= until`, read in one
/// repeatable-read snapshot, `LEDGER_DIGEST_BATCH` entries at a time.
/// An instant after the database's clock is refused: its digest would
/// still be changing.
pub fn ledger_digest(
    conn: &mut PgConnection,
    until: DateTime<Utc>,
) -> Result<LedgerDigest, ApiError> {
    conn.build_transaction()
        .read_only()
        .repeatable_read()
        .run(|conn| {
            let now: DateTime<Utc> = diesel::select(diesel::dsl::sql::<
                diesel::sql_types::Timestamptz,
            >("clock_timestamp()"))
            .get_result(conn)?;
            if until > now {
                return Err(ApiError::InvalidRequest(format!(
                    "until must not be in the future (the database's clock reads {})",
                    now.to_rfc3339_opts(SecondsFormat::Micros, true)
                )));
            }
            let mut link = GENESIS.to_owned();
            let mut entries = 0_u64;
            let mut last_entry_id = None;
            loop {
                let batch: Vec<LedgerEntryRow> = ledger_entries::table
                    .filter(ledger_entries::created_at.le(until))
                    .filter(ledger_entries::id.gt(last_entry_id.unwrap_or(0)))
                    .order(ledger_entries::id)
                    .limit(LEDGER_DIGEST_BATCH)
                    .select(LedgerEntryRow::as_select())
                    .load(conn)?;
                for entry in &batch {
                    link = next_link(&link, entry);
                    entries += 1;
                    last_entry_id = Some(entry.id);
                }
                if batch.len() < LEDGER_DIGEST_BATCH as usize {
                    break;
                }
            }
            Ok(LedgerDigest {
                digest: link,
                entries,
                until: until.to_rfc3339_opts(SecondsFormat::Micros, true),
                last_entry_id,
                format: FORMAT,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn entry() -> LedgerEntryRow {
        LedgerEntryRow {
            id: 7,
            account_id: Uuid::nil(),
            kind: "credit".into(),
            amount: 50,
            available_after: 50,
            reserved_after: 0,
            used_after: 0,
            reservation_id: None,
            job_id: None,
            external_ref: Some("invoice \"42\"\n".into()),
            reason: None,
            actor: "system".into(),
            created_at: "2026-12-01T14:03:00.5Z".parse().expect("time"),
            grant_id: None,
        }
    }

    #[test]
    fn the_canonical_form_is_fixed() {
        // Auditors recompute this form with their own tools: it must not drift.
        assert_eq!(
            canonical(&entry()),
            r#"[7,"00000000-0000-0000-0000-000000000000","credit",50,50,0,0,null,null,"invoice \"42\"\n",null,"system","2026-12-01T14:03:00.500000Z"]"#
        );
        // The same link as Python's hashlib.sha256 and json.dumps(row,
        // separators=(",", ":"), ensure_ascii=False) give (docs/backup.md).
        assert_eq!(
            next_link(GENESIS, &entry()),
            "df2d72f60641f7d4ff0120da8551295db63b01632492bb3f3bac9d409cf08808"
        );
    }
}
