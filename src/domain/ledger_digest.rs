//! The ledger digest finance can keep: a SHA-256 hash chain over every
//! ledger entry created up to an instant, entry by entry in id order.
//!
//! Written down today, it lets anyone check later that the ledger up to
//! that instant is still the same — after a restore from backup, or in an
//! audit — without trusting the database: changing, removing or inserting
//! one entry changes the digest of every later link.
//!
//! The chain (documented in docs/backup.md so an auditor can recompute it
//! without this binary; `tests/backup/ledger_digest.py` does):
//!
//! ```text
//! link_0 = "0" × 64
//! link_n = hex(sha256(link_{n-1} ‖ "\n" ‖ canonical(entry_n)))
//! ```
//!
//! Two formats, named by `format` in every answer:
//!
//! - `sha256-chain-v2` (format 2, the default): `canonical(entry)` is the
//!   entry as a compact JSON object of **every column**, keys sorted by
//!   name, times in UTC with microseconds (`2026-12-01T14:03:00.123456Z`),
//!   `null` for absent values — except a column added after format 2
//!   (`api_key_id`), which is a member only when it has a value, so a
//!   digest kept before it existed computes the same. tests/api/backup.rs
//!   changes each column of the table in turn and sees the digest change,
//!   so a column added later that this encoding misses fails the build.
//! - `sha256-chain-v1` (format 1), for digests kept before format 2: the
//!   compact JSON array `[id, account_id, kind, amount, available_after,
//!   reserved_after, used_after, reservation_id, job_id, external_ref,
//!   reason, actor, created_at]` (it does not cover `grant_id`).
//!
//! The digest is the last link.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::db::models::LedgerEntryRow;
use crate::db::schema::ledger_entries;
use crate::error::ApiError;
use crate::time::rfc3339;

/// A chain's definition: its number (`--format`) and its name (printed
/// with every digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `sha256-chain-v1`: thirteen columns as an array.
    V1,
    /// `sha256-chain-v2`: every column as an object.
    V2,
}

impl Format {
    /// The one a digest is taken in unless asked otherwise.
    pub const DEFAULT: Format = Format::V2;

    pub fn name(self) -> &'static str {
        match self {
            Format::V1 => "sha256-chain-v1",
            Format::V2 => "sha256-chain-v2",
        }
    }

    /// `1` or `2`, as `--format` takes it.
    pub fn parse(number: u8) -> Result<Format, String> {
        match number {
            1 => Ok(Format::V1),
            2 => Ok(Format::V2),
            other => Err(format!(
                "--format must be 2 (sha256-chain-v2, every column) or 1 (sha256-chain-v1, for \
                 digests kept before format 2), not {other}"
            )),
        }
    }
}

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

/// The text an entry is hashed as, in `format`.
pub fn canonical(format: Format, entry: &LedgerEntryRow) -> String {
    match format {
        Format::V1 => canonical_v1(entry),
        Format::V2 => canonical_v2(entry),
    }
}

/// Format 2: every column, as a compact JSON object with its keys sorted
/// (serde_json's map is ordered by key).
fn canonical_v2(entry: &LedgerEntryRow) -> String {
    // Destructured so that a field added to the row is a compile error
    // here until it is hashed too.
    let LedgerEntryRow {
        id,
        account_id,
        kind,
        amount,
        available_after,
        reserved_after,
        used_after,
        reservation_id,
        job_id,
        external_ref,
        reason,
        actor,
        created_at,
        grant_id,
        api_key_id,
    } = entry;
    let late = api_key_id.map(|key| ("api_key_id", serde_json::json!(key)));
    let object: serde_json::Map<String, serde_json::Value> = [
        ("id", serde_json::json!(id)),
        ("account_id", serde_json::json!(account_id)),
        ("kind", serde_json::json!(kind)),
        ("amount", serde_json::json!(amount)),
        ("available_after", serde_json::json!(available_after)),
        ("reserved_after", serde_json::json!(reserved_after)),
        ("used_after", serde_json::json!(used_after)),
        ("reservation_id", serde_json::json!(reservation_id)),
        ("job_id", serde_json::json!(job_id)),
        ("external_ref", serde_json::json!(external_ref)),
        ("reason", serde_json::json!(reason)),
        ("actor", serde_json::json!(actor)),
        ("created_at", serde_json::json!(rfc3339(*created_at))),
        ("grant_id", serde_json::json!(grant_id)),
    ]
    .into_iter()
    .chain(late)
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    serde_json::Value::Object(object).to_string()
}

/// Format 1: the compact JSON array of thirteen columns.
fn canonical_v1(entry: &LedgerEntryRow) -> String {
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
        rfc3339(entry.created_at),
    ])
    .to_string()
}

/// The next link of the chain.
pub fn next_link(format: Format, previous: &str, entry: &LedgerEntryRow) -> String {
    let mut hasher = Sha256::new();
    hasher.update(previous.as_bytes());
    hasher.update(b"\n");
    hasher.update(canonical(format, entry).as_bytes());
    hex::encode(hasher.finalize())
}

/// The digest of every entry with `created_at <= until`, read in one
/// repeatable-read snapshot, `LEDGER_DIGEST_BATCH` entries at a time.
/// An instant after the database's clock is refused: its digest would
/// still be changing; so is one that is not closed yet (a writer that
/// began before it still runs: `history::wait_until_closed`).
pub fn ledger_digest(
    conn: &mut PgConnection,
    until: DateTime<Utc>,
    format: Format,
) -> Result<LedgerDigest, ApiError> {
    let now = Utc::now();
    if until <= now {
        crate::domain::history::wait_until_closed(conn, until + chrono::Duration::microseconds(1))?;
    }
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
                    rfc3339(now)
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
                    link = next_link(format, &link, entry);
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
                until: rfc3339(until),
                last_entry_id,
                format: format.name(),
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
            api_key_id: None,
        }
    }

    #[test]
    fn the_canonical_form_is_fixed() {
        // Auditors recompute this form with their own tools: it must not drift.
        assert_eq!(
            canonical(Format::V1, &entry()),
            r#"[7,"00000000-0000-0000-0000-000000000000","credit",50,50,0,0,null,null,"invoice \"42\"\n",null,"system","2026-12-01T14:03:00.500000Z"]"#
        );
        // The same link as Python's hashlib.sha256 and json.dumps(row,
        // separators=(",", ":"), ensure_ascii=False) give (docs/backup.md).
        assert_eq!(
            next_link(Format::V1, GENESIS, &entry()),
            "df2d72f60641f7d4ff0120da8551295db63b01632492bb3f3bac9d409cf08808"
        );
        assert_eq!(
            canonical(Format::V2, &entry()),
            r#"{"account_id":"00000000-0000-0000-0000-000000000000","actor":"system","amount":50,"available_after":50,"created_at":"2026-12-01T14:03:00.500000Z","external_ref":"invoice \"42\"\n","grant_id":null,"id":7,"job_id":null,"kind":"credit","reason":null,"reservation_id":null,"reserved_after":0,"used_after":0}"#
        );
    }
}
