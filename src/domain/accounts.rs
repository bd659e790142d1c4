//! Accounts: creation, lookup, status and limits.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AccountRow, NewAccount};
use crate::db::schema::accounts;
use crate::db::states::{parse_param, AccountStatus};
use crate::domain::audit::{self, Audit};
use crate::domain::paging::{page_limit, page_of};
use crate::engine::types::{AccountId, Name};
use crate::error::ApiError;

/// Default `max_active_reservations` of a new account (docs/api.md): a
/// fleet of 20 booths, each holding one reservation while a picture is
/// made and a second while a retry or the next guest's press overlaps it,
/// with room to spare. (10, the default before, refused a busy 20-booth
/// fleet "busy" much of the time.)
pub const DEFAULT_MAX_ACTIVE_RESERVATIONS: i32 = 50;
/// Upper bound on `max_active_reservations` (0 means unlimited).
pub const MAX_ACTIVE_RESERVATIONS_LIMIT: i32 = 100_000;
/// Page sizes of the account list.
pub const ACCOUNT_PAGE_DEFAULT: i64 = 100;
pub const ACCOUNT_PAGE_MAX: i64 = 1_000;
/// Longest `q` of the account list, in characters (a name is at most 200).
pub const ACCOUNT_QUERY_LENGTH_MAX: usize = 200;

/// One page of the account list, oldest first; `next_after` is the cursor
/// of the next page (`null` on the last one).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AccountPage {
    pub accounts: Vec<AccountView>,
    pub next_after: Option<AccountId>,
}

/// What to list: validated by `AccountFilter::parse`.
#[derive(Clone, Debug)]
pub struct AccountFilter {
    pub after: Option<AccountId>,
    pub limit: i64,
    /// `%q%` for ILIKE, with the wildcards of `q` escaped.
    name_pattern: Option<String>,
    pub status: Option<AccountStatus>,
}

impl AccountFilter {
    pub fn parse(
        after: Option<Uuid>,
        limit: Option<i64>,
        q: Option<&str>,
        status: Option<&str>,
    ) -> Result<AccountFilter, ApiError> {
        let limit = page_limit(limit, ACCOUNT_PAGE_DEFAULT, ACCOUNT_PAGE_MAX)?;
        let status = status
            .map(|status| parse_param("status", status, AccountStatus::ALL, AccountStatus::parse))
            .transpose()?;
        let name_pattern = match q {
            None => None,
            Some(q) => {
                if q.is_empty() || q.chars().count() > ACCOUNT_QUERY_LENGTH_MAX {
                    return Err(ApiError::InvalidRequest(format!(
                        "q must be 1 to {ACCOUNT_QUERY_LENGTH_MAX} characters"
                    )));
                }
                if q.chars().any(char::is_control) {
                    return Err(ApiError::InvalidRequest(
                        "q must not contain control characters".into(),
                    ));
                }
                Some(like_contains(q))
            }
        };
        Ok(AccountFilter {
            after: after.map(AccountId),
            limit,
            name_pattern,
            status,
        })
    }
}

/// `%text%` for `ILIKE … ESCAPE '\'`, with `%`, `_` and `\` of the text
/// matching themselves.
fn like_contains(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// Accounts in id order (ids are UUIDv7: creation order), after the cursor.
pub fn list_accounts(
    conn: &mut PgConnection,
    filter: &AccountFilter,
) -> Result<AccountPage, ApiError> {
    let mut query = accounts::table
        .select(AccountRow::as_select())
        .order(accounts::id.asc())
        .limit(filter.limit + 1)
        .into_boxed();
    if let Some(after) = filter.after {
        query = query.filter(accounts::id.gt(after.0));
    }
    if let Some(status) = &filter.status {
        query = query.filter(accounts::status.eq(*status));
    }
    if let Some(pattern) = &filter.name_pattern {
        query = query.filter(accounts::name.ilike(pattern.clone()).escape('\\'));
    }
    let (rows, next_after) = page_of(query.load(conn)?, filter.limit, |row: &AccountRow| {
        AccountId(row.id)
    });
    Ok(AccountPage {
        accounts: rows.into_iter().map(AccountView::from).collect(),
        next_after,
    })
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AccountView {
    pub account_id: AccountId,
    pub name: String,
    /// `active` or `suspended`.
    #[schema(value_type = String, example = "active")]
    pub status: AccountStatus,
    pub available: i64,
    pub reserved: i64,
    pub used: i64,
    pub credited: i64,
    pub adjusted: i64,
    /// Tokens that left when grants lapsed (ledger kind `grant_expire`):
    /// credited + adjusted = available + reserved + used + grant_expired.
    pub grant_expired: i64,
    pub active_reservations: i32,
    pub max_active_reservations: i32,
    /// `account.balance_low` is sent when `available` drops below this
    /// (0 = off); `balance_low` says whether it is below now.
    pub low_balance_threshold: i64,
    pub balance_low: bool,
    pub version: i64,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::micros")]
    pub updated_at: DateTime<Utc>,
    /// Only in the answer to `POST /v1/accounts`: what the admin should
    /// know about the account just created — `[]`, or `name_taken` when
    /// other active accounts have the same name (two booths may share one
    /// on purpose, so it is no error).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub warnings: Option<Vec<Warning>>,
}

impl From<AccountRow> for AccountView {
    fn from(row: AccountRow) -> Self {
        AccountView {
            account_id: AccountId(row.id),
            name: row.name,
            status: row.status,
            available: row.available,
            reserved: row.reserved,
            used: row.used,
            credited: row.credited,
            adjusted: row.adjusted,
            grant_expired: row.grant_expired,
            active_reservations: row.active_reservations,
            max_active_reservations: row.max_active_reservations,
            low_balance_threshold: row.low_balance_threshold,
            balance_low: row.balance_low,
            version: row.version,
            created_at: row.created_at,
            updated_at: row.updated_at,
            warnings: None,
        }
    }
}

/// Largest `low_balance_threshold`.
pub const LOW_BALANCE_THRESHOLD_MAX: i64 = 1_000_000_000_000;

/// `low_balance_threshold`: 0 (off, the default) to
/// [`LOW_BALANCE_THRESHOLD_MAX`].
pub fn parse_low_balance_threshold(value: Option<i64>) -> Result<i64, ApiError> {
    let value = value.unwrap_or(0);
    if (0..=LOW_BALANCE_THRESHOLD_MAX).contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::InvalidRequest(format!(
            "low_balance_threshold must be between 0 (off) and {LOW_BALANCE_THRESHOLD_MAX}, got {value}"
        )))
    }
}

pub fn parse_max_active_reservations(value: Option<i64>) -> Result<i32, ApiError> {
    let value = value.unwrap_or(i64::from(DEFAULT_MAX_ACTIVE_RESERVATIONS));
    i32::try_from(value)
        .ok()
        .filter(|limit| (0..=MAX_ACTIVE_RESERVATIONS_LIMIT).contains(limit))
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "max_active_reservations must be between 0 (unlimited) and \
                 {MAX_ACTIVE_RESERVATIONS_LIMIT}, got {value}"
            ))
        })
}

/// Creates an account on behalf of the CLI (audit actor `cli`).
pub fn create_account(
    conn: &mut PgConnection,
    name: &Name,
    max_active_reservations: i32,
) -> Result<AccountRow, ApiError> {
    create_account_by(conn, &Audit::local(), name, max_active_reservations, 0)
}

/// Judges the account's balance against its low-balance threshold with the
/// money engine's rule (`engine_low_balance`, `src/engine/sql/10_record.sql`):
/// the `balance_low` flag is brought up to date and a change is reported
/// (`account.balance_low` / `account.balance_recovered`) in the caller's
/// transaction. Returns the account as it now is.
fn judge_low_balance(conn: &mut PgConnection, account: AccountId) -> Result<AccountRow, ApiError> {
    diesel::sql_query("SELECT engine_low_balance(a) FROM accounts a WHERE a.id = $1")
        .bind::<diesel::sql_types::Uuid, _>(account.0)
        .execute(conn)?;
    get_account(conn, account)
}

/// Creates an account and its audit event (`account.created`) in one
/// transaction. An account created with a threshold above its (empty)
/// balance is low from the start: `balance_low` is true, reported as
/// `account.balance_low`, and the first credit that lifts it over the
/// threshold reports `account.balance_recovered`.
pub fn create_account_by(
    conn: &mut PgConnection,
    by: &Audit,
    name: &Name,
    max_active_reservations: i32,
    low_balance_threshold: i64,
) -> Result<AccountRow, ApiError> {
    conn.transaction(|conn| {
        let row = diesel::insert_into(accounts::table)
            .values(NewAccount {
                id: Uuid::now_v7(),
                name: name.as_str(),
                max_active_reservations,
                low_balance_threshold,
            })
            .returning(AccountRow::as_returning())
            .get_result(conn)?;
        let row = if low_balance_threshold > 0 {
            judge_low_balance(conn, AccountId(row.id))?
        } else {
            row
        };
        audit::record(
            conn,
            by,
            "account.created",
            &format!("account:{}", row.id),
            None,
            Some(serde_json::json!({
                "name": row.name,
                "status": row.status,
                "max_active_reservations": row.max_active_reservations,
                "low_balance_threshold": row.low_balance_threshold,
            })),
        )?;
        Ok(row)
    })
}

/// Most account ids a `name_taken` warning lists.
pub const SAME_NAME_LISTED_MAX: i64 = 10;

/// Something the client should know about a change that was made anyway.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Warning {
    /// `name_taken`: other active accounts have this name (ignoring case).
    #[schema(example = "name_taken")]
    pub code: String,
    pub detail: String,
    /// The other active accounts of that name (at most 10).
    pub account_ids: Vec<AccountId>,
}

/// `name_taken` when other active accounts have this account's name,
/// compared case-insensitively (names are stored in NFC).
pub fn name_warnings(conn: &mut PgConnection, row: &AccountRow) -> Result<Vec<Warning>, ApiError> {
    let others: Vec<Uuid> = accounts::table
        .filter(accounts::status.eq(AccountStatus::Active))
        .filter(accounts::id.ne(row.id))
        .filter(lower(accounts::name).eq(lower(row.name.clone())))
        .order(accounts::id.asc())
        .limit(SAME_NAME_LISTED_MAX)
        .select(accounts::id)
        .load(conn)?;
    if others.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![Warning {
        code: "name_taken".to_owned(),
        detail: format!(
            "another active account is already named {:?} (ignoring case); \
             the account was created, rename or suspend one if they are not meant to look alike",
            row.name
        ),
        account_ids: others.into_iter().map(AccountId).collect(),
    }])
}

diesel::define_sql_function!(fn lower(text: diesel::sql_types::Text) -> diesel::sql_types::Text);

pub fn get_account(conn: &mut PgConnection, account: AccountId) -> Result<AccountRow, ApiError> {
    accounts::table
        .find(account.0)
        .select(AccountRow::as_select())
        .first(conn)
        .optional()?
        .ok_or(ApiError::NotFound("account"))
}

/// Changes status, the reservation limit and/or the low-balance threshold.
/// Suspending stops new reservations; reservations already held can still
/// be committed or released, so no token is stranded. A new threshold is
/// judged against the balance at once by the money engine's low-balance
/// rule (`engine_low_balance`): raising it above `available` reports
/// `account.balance_low`. The audit event (`account.updated`) holds the
/// given fields before and after, in the same transaction.
pub fn update_account(
    conn: &mut PgConnection,
    by: &Audit,
    account: AccountId,
    status: Option<&str>,
    max_active_reservations: Option<i32>,
    low_balance_threshold: Option<i64>,
) -> Result<AccountRow, ApiError> {
    let status = status
        .map(|status| parse_param("status", status, AccountStatus::ALL, AccountStatus::parse))
        .transpose()?;
    conn.transaction(|conn| {
        let before: AccountRow = accounts::table
            .find(account.0)
            .select(AccountRow::as_select())
            .for_no_key_update()
            .first(conn)
            .optional()?
            .ok_or(ApiError::NotFound("account"))?;
        let row = diesel::update(accounts::table.find(account.0))
            .set((
                status.map(|status| accounts::status.eq(status)),
                max_active_reservations.map(|limit| accounts::max_active_reservations.eq(limit)),
                low_balance_threshold
                    .map(|threshold| accounts::low_balance_threshold.eq(threshold)),
                accounts::version.eq(accounts::version + 1),
                accounts::updated_at.eq(diesel::dsl::now),
            ))
            .returning(AccountRow::as_returning())
            .get_result(conn)?;
        let row = if low_balance_threshold.is_some() {
            judge_low_balance(conn, account)?
        } else {
            row
        };
        let (mut old, mut new) = (serde_json::Map::new(), serde_json::Map::new());
        if status.is_some() {
            old.insert("status".into(), serde_json::json!(before.status));
            new.insert("status".into(), serde_json::json!(row.status));
        }
        if max_active_reservations.is_some() {
            old.insert(
                "max_active_reservations".into(),
                before.max_active_reservations.into(),
            );
            new.insert(
                "max_active_reservations".into(),
                row.max_active_reservations.into(),
            );
        }
        if low_balance_threshold.is_some() {
            old.insert(
                "low_balance_threshold".into(),
                before.low_balance_threshold.into(),
            );
            new.insert(
                "low_balance_threshold".into(),
                row.low_balance_threshold.into(),
            );
        }
        audit::record(
            conn,
            by,
            "account.updated",
            &format!("account:{}", account.0),
            Some(old.into()),
            Some(new.into()),
        )?;
        Ok(row)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_wildcards_match_themselves() {
        assert_eq!(like_contains("a_b%c\\d"), "%a\\_b\\%c\\\\d%");
        assert_eq!(like_contains("Müller"), "%Müller%");
    }

    #[test]
    fn bad_filters_are_refused() {
        assert!(AccountFilter::parse(None, Some(0), None, None).is_err());
        assert!(AccountFilter::parse(None, Some(1001), None, None).is_err());
        assert!(AccountFilter::parse(None, None, Some(""), None).is_err());
        assert!(AccountFilter::parse(None, None, None, Some("gone")).is_err());
        assert!(AccountFilter::parse(None, None, Some("a\u{7}"), None).is_err());
        assert_eq!(
            AccountFilter::parse(None, None, Some("x"), Some("active"))
                .expect("valid")
                .limit,
            ACCOUNT_PAGE_DEFAULT
        );
    }
}
