//! API keys and what each caller may do.
//!
//! A key reads `tbk_<key id, 32 hex>_<secret, 64 hex>`. Only SHA-256 of the
//! secret is stored; a presented key is looked up by its id and the hash of
//! its secret compared. Revocation and expiry are column reads on every
//! request, so they take effect at once on every replica; an expired key is
//! refused exactly like a revoked one (401).
//!
//! The rule lives in the money engine (`engine_verify_keys`,
//! `src/engine/sql/20_keys.sql`), with `last_used_at`, written at most once
//! a minute per key by a conditional UPDATE that skips a row another
//! transaction holds.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::IntoSql;
use rand::RngCore;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{ApiKeyRow, NewApiKey};
use crate::db::schema::{accounts, api_keys};
use crate::domain::audit::{self, Audit};
use crate::domain::key_budgets::{self, BudgetSpec, KeyBudget};
use crate::domain::paging::{page_limit, page_of};
use crate::engine::types::{AccountId, ApiKeyId, Label};
use crate::error::ApiError;

const KEY_PREFIX: &str = "tbk_";
/// Page sizes of the key list.
pub const KEY_PAGE_DEFAULT: i64 = 100;
pub const KEY_PAGE_MAX: i64 = 1_000;
/// Who is acting when the bootstrap `ADMIN_API_KEY` is used.
pub const BOOTSTRAP_ACTOR: &str = "bootstrap-admin";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Admin,
    Finance,
    Kiosk,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Finance => "finance",
            Scope::Kiosk => "kiosk",
        }
    }

    fn parse(text: &str) -> Option<Scope> {
        match text {
            "admin" => Some(Scope::Admin),
            "finance" => Some(Scope::Finance),
            "kiosk" => Some(Scope::Kiosk),
            _ => None,
        }
    }
}

/// The authenticated caller of one request.
#[derive(Clone, Debug)]
pub struct Caller {
    pub key_id: Option<ApiKeyId>,
    pub scope: Scope,
    pub account_id: Option<AccountId>,
}

impl Caller {
    pub fn bootstrap_admin() -> Caller {
        Caller {
            key_id: None,
            scope: Scope::Admin,
            account_id: None,
        }
    }

    /// The ledger's `actor`: the key id, or the bootstrap marker.
    pub fn actor(&self) -> String {
        self.key_id
            .map_or_else(|| BOOTSTRAP_ACTOR.to_owned(), |id| id.to_string())
    }

    /// A kiosk sees only its own account: any other account id is 404, so a
    /// kiosk cannot even learn which ids exist.
    fn sees(&self, account: AccountId) -> bool {
        self.scope != Scope::Kiosk || self.account_id == Some(account)
    }

    /// A kiosk reads what it has just written (its balance, its ledger
    /// after a commit): its reads stay on the primary, never on a replica.
    pub fn reads_its_own_writes(&self) -> bool {
        self.scope == Scope::Kiosk
    }

    /// Reading an account's balance, ledger, reservations or jobs.
    pub fn authorize_read(&self, account: AccountId) -> Result<(), ApiError> {
        if self.sees(account) {
            Ok(())
        } else {
            Err(ApiError::NotFound("account"))
        }
    }

    // Who may spend an account's tokens (its own kiosk or an admin) is the
    // money engine's rule, `engine_key_refusal`, checked in the spending
    // operation's own transaction.

    /// Admin-only actions on an account (credits, adjustments, keys).
    pub fn authorize_admin_on(&self, account: AccountId) -> Result<(), ApiError> {
        if !self.sees(account) {
            return Err(ApiError::NotFound("account"));
        }
        self.authorize_admin()
    }

    pub fn authorize_admin(&self) -> Result<(), ApiError> {
        if self.scope == Scope::Admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }

    /// Finance reports: finance or admin.
    pub fn authorize_finance(&self) -> Result<(), ApiError> {
        match self.scope {
            Scope::Admin | Scope::Finance => Ok(()),
            Scope::Kiosk => Err(ApiError::Forbidden),
        }
    }
}

pub use crate::engine::types::sha256;

/// Splits a presented key into its id and secret; `None` when malformed.
fn parse_key(presented: &str) -> Option<(Uuid, &str)> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    if id.len() != 32 || secret.len() != 64 {
        return None;
    }
    Some((Uuid::try_parse(id).ok()?, secret))
}

/// A presented key before the database has vouched for it: the bootstrap
/// admin key (already checked against its hash in memory), or a well-formed
/// key's id and the SHA-256 of its secret.
///
/// The spending endpoints hand the key to the money engine, which verifies
/// it in the batch's own transaction, after the batch's locks
/// (`engine_valid_key`, `engine_key_refusal`): no extra round trip, and
/// `revoked_at` is still read on every request. Everything else calls
/// [`verify`].
///
/// [`verify`]: Credentials::verify
#[derive(Clone, Debug)]
pub enum Credentials {
    Bootstrap,
    Key { id: Uuid, secret_hash: [u8; 32] },
}

impl Credentials {
    /// Parses `tbk_<id>_<secret>`; `None` when malformed.
    pub fn parse(presented: &str) -> Option<Credentials> {
        let (id, secret) = parse_key(presented)?;
        Some(Credentials::Key {
            id,
            secret_hash: sha256(secret.as_bytes()),
        })
    }

    /// The key's id and the SHA-256 of its secret (not for the bootstrap
    /// key, which is checked against its own hash in memory).
    pub fn presented(&self) -> Option<(Uuid, [u8; 32])> {
        match self {
            Credentials::Bootstrap => None,
            Credentials::Key { id, secret_hash } => Some((*id, *secret_hash)),
        }
    }

    /// The ledger's `actor`, known before verification: the key id is part
    /// of the key (a statement that verifies the key writes it only when the
    /// key is valid).
    pub fn actor(&self) -> String {
        match self {
            Credentials::Bootstrap => BOOTSTRAP_ACTOR.to_owned(),
            Credentials::Key { id, .. } => ApiKeyId(*id).to_string(),
        }
    }

    /// Looks the key up: the caller, or 401 for an unknown, wrong,
    /// revoked or expired key.
    pub fn verify(&self, conn: &mut PgConnection) -> Result<Caller, ApiError> {
        verify_many(conn, &[self])?
            .pop()
            .flatten()
            .ok_or(ApiError::Unauthorized)
    }
}

/// What the money engine is told of a presented key: the engine verifies
/// a key itself (`engine_valid_key`) in the transaction that spends; the
/// bootstrap admin key was verified by the service already.
impl From<Credentials> for crate::engine::Authority {
    fn from(credentials: Credentials) -> Self {
        match credentials {
            Credentials::Bootstrap => crate::engine::Authority::Verified {
                actor: BOOTSTRAP_ACTOR.to_owned(),
            },
            Credentials::Key { id, secret_hash } => {
                crate::engine::Authority::Key { id, secret_hash }
            }
        }
    }
}

/// [`Credentials::verify`] for many requests in one query: the caller of
/// each, or `None` for an unknown, wrong, revoked or expired key. The rule
/// and the once-a-minute `last_used_at` write are the engine's
/// (`engine_verify_keys`, `src/engine/sql/20_keys.sql`), the same function
/// spending requests use.
pub fn verify_many(
    conn: &mut PgConnection,
    presented: &[&Credentials],
) -> Result<Vec<Option<Caller>>, ApiError> {
    #[derive(QueryableByName)]
    struct Valid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        n: i32,
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        key_id: Uuid,
        #[diesel(sql_type = diesel::sql_types::Text)]
        scope: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Uuid>)]
        account_id: Option<Uuid>,
    }
    let mut callers: Vec<Option<Caller>> = presented
        .iter()
        .map(|credentials| {
            matches!(credentials, Credentials::Bootstrap).then(Caller::bootstrap_admin)
        })
        .collect();
    // (position among `presented`, key id, SHA-256 of the secret)
    let keys: Vec<(usize, Uuid, Vec<u8>)> = presented
        .iter()
        .enumerate()
        .filter_map(|(index, credentials)| match credentials {
            Credentials::Key { id, secret_hash } => Some((index, *id, secret_hash.to_vec())),
            Credentials::Bootstrap => None,
        })
        .collect();
    if keys.is_empty() {
        return Ok(callers);
    }
    let ids: Vec<Uuid> = keys.iter().map(|(_, id, _)| *id).collect();
    let hashes: Vec<&[u8]> = keys.iter().map(|(_, _, hash)| hash.as_slice()).collect();
    let valid: Vec<Valid> =
        crate::db::prepared("SELECT n, key_id, scope, account_id FROM engine_verify_keys($1, $2)")
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(&ids)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Bytea>, _>(&hashes)
            .load(conn)?;
    for row in valid {
        let position = usize::try_from(row.n - 1)
            .ok()
            .and_then(|n| keys.get(n))
            .map(|(index, _, _)| *index)
            .ok_or_else(|| ApiError::Internal("engine_verify_keys: position".into()))?;
        callers[position] = Scope::parse(&row.scope).map(|scope| Caller {
            key_id: Some(ApiKeyId(row.key_id)),
            scope,
            account_id: row.account_id.map(AccountId),
        });
    }
    Ok(callers)
}

/// How a kiosk is shown who acted: the `actor` of a ledger entry or an
/// event is a key id, which a kiosk must not learn (an id is no handle on
/// a key, but it is not the kiosk's business either). Each key id among
/// `actors` maps to that key's scope and label (`admin:Front desk`); an
/// actor that is no key id (`bootstrap-admin`, `cli`, a worker's or the
/// reaper's name) maps to itself. One query for a whole page.
pub fn actors_for_kiosk(
    conn: &mut PgConnection,
    actors: impl IntoIterator<Item = String>,
) -> Result<std::collections::HashMap<String, String>, ApiError> {
    let mut names = std::collections::HashMap::new();
    let mut key_actors: Vec<(String, Uuid)> = Vec::new();
    for actor in actors {
        match Uuid::try_parse(&actor) {
            Ok(id) => key_actors.push((actor, id)),
            Err(_) => {
                names.insert(actor.clone(), actor);
            }
        }
    }
    if key_actors.is_empty() {
        return Ok(names);
    }
    let ids: Vec<Uuid> = key_actors.iter().map(|(_, id)| *id).collect();
    let keys: Vec<(Uuid, String, String)> = api_keys::table
        .filter(api_keys::id.eq_any(&ids))
        .select((api_keys::id, api_keys::scope, api_keys::label))
        .load(conn)?;
    for (actor, id) in key_actors {
        let shown = keys.iter().find(|(key, _, _)| *key == id).map_or_else(
            || "key".to_owned(),
            |(_, scope, label)| format!("{scope}:{label}"),
        );
        names.insert(actor, shown);
    }
    Ok(names)
}

/// Replaces every string `actor` member anywhere in `value` (an event's
/// data: its `entry`, `credit`, `adjustment`) by its name in `names`, and
/// empties every `api_key_id` (an entry's key).
pub fn rename_actors(
    value: &mut serde_json::Value,
    names: &std::collections::HashMap<String, String>,
) {
    match value {
        serde_json::Value::Object(object) => {
            for (key, member) in object.iter_mut() {
                match member {
                    serde_json::Value::String(actor) if key == "actor" => {
                        if let Some(name) = names.get(actor.as_str()) {
                            *actor = name.clone();
                        } else if Uuid::try_parse(actor).is_ok() {
                            "key".clone_into(actor);
                        }
                    }
                    // A ledger entry's key, likewise.
                    named if key == "api_key_id" => *named = serde_json::Value::Null,
                    other => rename_actors(other, names),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                rename_actors(item, names);
            }
        }
        _ => {}
    }
}

/// Every string `actor` member anywhere in `value`.
pub fn actors_in(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(object) => {
            for (key, member) in object {
                match member {
                    serde_json::Value::String(actor) if key == "actor" => found.push(actor.clone()),
                    other => actors_in(other, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| actors_in(item, found)),
        _ => {}
    }
}

/// A key as the key list shows it: never its secret nor its hash.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ApiKeyView {
    pub key_id: ApiKeyId,
    pub scope: Scope,
    pub account_id: Option<AccountId>,
    pub label: String,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    /// Within a minute: updated at most once a minute per key.
    #[serde(with = "crate::time::micros_option")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(with = "crate::time::micros_option")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// A kiosk key's spending limit and what it spent in the current
    /// period; null: none (docs/fleet.md, "Key budgets").
    pub budget: Option<KeyBudget>,
}

/// One page of the key list, in key id order; `next_after` is the cursor
/// of the next page (`null` on the last one).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApiKeyPage {
    pub keys: Vec<ApiKeyView>,
    pub next_after: Option<ApiKeyId>,
}

/// Keys in id order after the cursor, optionally of one account.
pub fn list_api_keys(
    conn: &mut PgConnection,
    after: Option<ApiKeyId>,
    limit: Option<i64>,
    account: Option<AccountId>,
) -> Result<ApiKeyPage, ApiError> {
    let limit = page_limit(limit, KEY_PAGE_DEFAULT, KEY_PAGE_MAX)?;
    let mut query = api_keys::table
        .select(ApiKeyRow::as_select())
        .order(api_keys::id.asc())
        .limit(limit + 1)
        .into_boxed();
    if let Some(after) = after {
        query = query.filter(api_keys::id.gt(after.0));
    }
    if let Some(account) = account {
        query = query.filter(api_keys::account_id.eq(account.0));
    }
    let (rows, next_after) = page_of(query.load(conn)?, limit, |row: &ApiKeyRow| ApiKeyId(row.id));
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    let mut budgets = key_budgets::budgets_of(conn, &ids)?;
    let keys = rows
        .into_iter()
        .map(|row| {
            Ok(ApiKeyView {
                key_id: ApiKeyId(row.id),
                scope: Scope::parse(&row.scope)
                    .ok_or_else(|| ApiError::Internal(format!("unknown scope {}", row.scope)))?,
                account_id: row.account_id.map(AccountId),
                label: row.label,
                created_at: row.created_at,
                last_used_at: row.last_used_at,
                expires_at: row.expires_at,
                revoked_at: row.revoked_at,
                budget: budgets.remove(&row.id),
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(ApiKeyPage { keys, next_after })
}

/// Whether any admin key can still be used (neither revoked nor expired).
pub fn usable_admin_key_exists(conn: &mut PgConnection) -> Result<bool, ApiError> {
    Ok(diesel::select(diesel::dsl::exists(
        api_keys::table
            .filter(api_keys::scope.eq(Scope::Admin.as_str()))
            .filter(api_keys::revoked_at.is_null())
            .filter(
                api_keys::expires_at
                    .is_null()
                    .or(api_keys::expires_at.gt(diesel::dsl::now)),
            ),
    ))
    .get_result(conn)?)
}

/// A freshly created key: the only time the secret is ever visible. Its
/// `Debug` leaves the key out, so no log line can carry it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedApiKey {
    pub key_id: ApiKeyId,
    pub key: String,
    pub scope: Scope,
    pub account_id: Option<AccountId>,
    pub label: String,
    #[serde(with = "crate::time::micros")]
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When the key stops working (401 from then on); null: never.
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A kiosk key's spending limit; null: none.
    pub budget: Option<KeyBudget>,
}

impl std::fmt::Debug for CreatedApiKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("CreatedApiKey")
            .field("key_id", &self.key_id)
            .field("key", &"[redacted]")
            .field("scope", &self.scope)
            .field("account_id", &self.account_id)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Creates a key that never expires on behalf of the CLI (audit actor `cli`).
pub fn create_api_key(
    conn: &mut PgConnection,
    scope: Scope,
    account: Option<AccountId>,
    label: &Label,
    budget: Option<&BudgetSpec>,
) -> Result<CreatedApiKey, ApiError> {
    create_api_key_by(conn, &Audit::local(), scope, account, label, None, budget)
}

/// Parses an optional `expires_at` (RFC 3339 or a date, `crate::time`),
/// which must be in the future.
pub fn parse_expires_at(text: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let at = crate::time::instant_of("expires_at", text).map_err(ApiError::InvalidRequest)?;
    if at <= Utc::now() {
        return Err(ApiError::InvalidRequest(
            "expires_at must be in the future".into(),
        ));
    }
    Ok(Some(at))
}

/// Creates a key and its audit event (`api_key.created`) in one
/// transaction. Kiosk keys must name an existing account, and may carry a
/// budget; admin and finance keys must not name one.
pub fn create_api_key_by(
    conn: &mut PgConnection,
    by: &Audit,
    scope: Scope,
    account: Option<AccountId>,
    label: &Label,
    expires_at: Option<DateTime<Utc>>,
    budget: Option<&BudgetSpec>,
) -> Result<CreatedApiKey, ApiError> {
    if (scope == Scope::Kiosk) != account.is_some() {
        return Err(ApiError::InvalidRequest(
            "kiosk keys are created on an account; admin and finance keys on /v1/api-keys".into(),
        ));
    }
    if let Some(budget) = budget {
        if scope != Scope::Kiosk {
            return Err(ApiError::InvalidRequest(
                "budget: only a kiosk key has a budget".into(),
            ));
        }
        key_budgets::check(conn, budget)?;
    }
    if let Some(account) = account {
        let exists: bool = diesel::select(diesel::dsl::exists(accounts::table.find(account.0)))
            .get_result(conn)?;
        if !exists {
            return Err(ApiError::NotFound("account"));
        }
    }
    let key_id = Uuid::new_v4();
    let mut secret_bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret_bytes);
    let secret = hex::encode(secret_bytes);
    let row: ApiKeyRow = conn.transaction(|conn| {
        let row: ApiKeyRow = diesel::insert_into(api_keys::table)
            .values(NewApiKey {
                id: key_id,
                secret_hash: &sha256(secret.as_bytes()),
                scope: scope.as_str(),
                account_id: account.map(|a| a.0),
                label: label.as_str(),
                expires_at,
            })
            .returning(ApiKeyRow::as_returning())
            .get_result(conn)?;
        if budget.is_some() {
            key_budgets::write(conn, row.id, budget)?;
        }
        audit::record(
            conn,
            by,
            "api_key.created",
            &format!("api_key:{}", row.id),
            None,
            Some(serde_json::json!({
                "scope": row.scope,
                "account_id": row.account_id,
                "label": row.label,
                "expires_at": row.expires_at,
                "budget_tokens": budget.map(|budget| budget.budget_tokens),
            })),
        )?;
        Ok::<_, ApiError>(row)
    })?;
    let budget = key_budgets::budgets_of(conn, &[row.id])?.remove(&row.id);
    Ok(CreatedApiKey {
        key_id: ApiKeyId(row.id),
        key: format!("{KEY_PREFIX}{}_{secret}", key_id.simple()),
        scope,
        account_id: account,
        label: row.label,
        created_at: row.created_at,
        expires_at: row.expires_at,
        budget,
    })
}

/// Revokes a key; revoking a revoked key again is a no-op (idempotent, and
/// no second audit event). The audit event (`api_key.revoked`) is written
/// in the revocation's transaction. Returns when the key was revoked
/// (by this call or the one before it).
pub fn revoke_api_key(
    conn: &mut PgConnection,
    by: &Audit,
    key: ApiKeyId,
) -> Result<DateTime<Utc>, ApiError> {
    let revoked = conn.transaction(|conn| {
        let revoked_at: Option<Option<DateTime<Utc>>> = diesel::update(api_keys::table.find(key.0))
            .set(
                api_keys::revoked_at.eq(diesel::dsl::now
                    .into_sql::<diesel::sql_types::Timestamptz>()
                    .nullable()),
            )
            .filter(api_keys::revoked_at.is_null())
            .returning(api_keys::revoked_at)
            .get_result(conn)
            .optional()?;
        if let Some(revoked_at) = revoked_at {
            audit::record(
                conn,
                by,
                "api_key.revoked",
                &format!("api_key:{}", key.0),
                Some(serde_json::json!({"revoked_at": null})),
                Some(serde_json::json!({"revoked_at": revoked_at})),
            )?;
        }
        Ok::<_, ApiError>(revoked_at.flatten())
    })?;
    if let Some(revoked_at) = revoked {
        return Ok(revoked_at);
    }
    // Revoked before: the instant it was, unchanged.
    let earlier: Option<Option<DateTime<Utc>>> = api_keys::table
        .find(key.0)
        .select(api_keys::revoked_at)
        .first(conn)
        .optional()?;
    earlier.flatten().ok_or(ApiError::NotFound("api key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_well_formed_keys() {
        let id = Uuid::new_v4();
        let secret = "a".repeat(64);
        let key = format!("tbk_{}_{secret}", id.simple());
        assert_eq!(parse_key(&key), Some((id, secret.as_str())));
        assert_eq!(parse_key(&key[1..]), None);
        assert_eq!(
            parse_key(&format!("tbk_{}_{}", id.simple(), "a".repeat(63))),
            None
        );
        assert_eq!(parse_key("tbk_"), None);
    }

    #[test]
    fn expiry_is_an_rfc3339_instant_in_the_future() {
        assert_eq!(parse_expires_at(None).expect("absent"), None);
        let tomorrow = Utc::now() + chrono::Duration::days(1);
        let parsed = parse_expires_at(Some(&tomorrow.to_rfc3339()))
            .expect("future")
            .expect("some");
        assert_eq!(parsed, tomorrow);
        // A bare date is its midnight UTC, as everywhere (crate::time).
        assert_eq!(
            parse_expires_at(Some("2030-01-01")).expect("a date"),
            Some("2030-01-01T00:00:00Z".parse().expect("time"))
        );
        let past = (Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
        for bad in [
            past.as_str(),
            "tomorrow",
            "2030-01-1",
            "2030-13-01T00:00:00Z",
            "",
        ] {
            assert!(
                matches!(
                    parse_expires_at(Some(bad)),
                    Err(ApiError::InvalidRequest(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_created_key_does_not_print_its_secret() {
        let created = CreatedApiKey {
            key_id: ApiKeyId(Uuid::nil()),
            key: "tbk_0_the-secret-part".into(),
            scope: Scope::Kiosk,
            account_id: None,
            label: "booth".into(),
            created_at: chrono::Utc::now(),
            expires_at: None,
            budget: None,
        };
        assert!(!format!("{created:?}").contains("the-secret-part"));
    }

    #[test]
    fn kiosk_sees_only_its_account() {
        let own = AccountId(Uuid::new_v4());
        let other = AccountId(Uuid::new_v4());
        let kiosk = Caller {
            key_id: None,
            scope: Scope::Kiosk,
            account_id: Some(own),
        };
        assert!(kiosk.authorize_read(own).is_ok());
        assert!(matches!(
            kiosk.authorize_read(other),
            Err(ApiError::NotFound(_))
        ));
        assert!(matches!(
            kiosk.authorize_admin_on(own),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            kiosk.authorize_admin_on(other),
            Err(ApiError::NotFound(_))
        ));
        let finance = Caller {
            key_id: None,
            scope: Scope::Finance,
            account_id: None,
        };
        assert!(finance.authorize_read(other).is_ok());
        assert!(matches!(
            finance.authorize_admin_on(other),
            Err(ApiError::Forbidden)
        ));
    }
}
