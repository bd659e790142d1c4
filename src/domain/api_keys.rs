//! API keys and what each caller may do.
//!
//! A key reads `tbk_<key id, 32 hex>_<secret, 64 hex>`. Only SHA-256 of the
//! secret is stored; a presented key is looked up by its id and its secret
//! compared in constant time. Revocation is a column read on every request,
//! so it takes effect at once on every replica.

use diesel::prelude::*;
use diesel::IntoSql;
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use crate::db::models::{ApiKeyRow, NewApiKey};
use crate::db::schema::{accounts, api_keys};
use crate::domain::types::{AccountId, ApiKeyId, Label};
use crate::error::ApiError;

const KEY_PREFIX: &str = "tbk_";
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

    /// Reading an account's balance, ledger, reservations or jobs.
    pub fn authorize_read(&self, account: AccountId) -> Result<(), ApiError> {
        if self.sees(account) {
            Ok(())
        } else {
            Err(ApiError::NotFound("account"))
        }
    }

    // Who may spend an account's tokens (its own kiosk or an admin) is the
    // money engine's rule, `engine_authorize_spend`, checked in the same
    // statement as the spending itself.

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

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

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
/// it inside the batch statement (`engine_authorize_spend`): no extra round
/// trip, and `revoked_at` is still read on every request. Everything else
/// calls [`verify`].
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

    /// The ledger's `actor`, known before verification: the key id is part
    /// of the key (a statement that verifies the key writes it only when the
    /// key is valid).
    pub fn actor(&self) -> String {
        match self {
            Credentials::Bootstrap => BOOTSTRAP_ACTOR.to_owned(),
            Credentials::Key { id, .. } => ApiKeyId(*id).to_string(),
        }
    }

    /// Looks the key up: the caller, or 401 for an unknown, wrong or
    /// revoked key.
    pub fn verify(&self, conn: &mut PgConnection) -> Result<Caller, ApiError> {
        verify_many(conn, &[self])?
            .pop()
            .flatten()
            .ok_or(ApiError::Unauthorized)
    }
}

/// [`Credentials::verify`] for many requests in one query: the caller of
/// each, or `None` for an unknown, wrong or revoked key.
pub fn verify_many(
    conn: &mut PgConnection,
    presented: &[&Credentials],
) -> Result<Vec<Option<Caller>>, ApiError> {
    let ids: Vec<Uuid> = presented
        .iter()
        .filter_map(|credentials| match credentials {
            Credentials::Key { id, .. } => Some(*id),
            Credentials::Bootstrap => None,
        })
        .collect();
    let rows: Vec<ApiKeyRow> = if ids.is_empty() {
        Vec::new()
    } else {
        api_keys::table
            .filter(api_keys::id.eq_any(&ids))
            .select(ApiKeyRow::as_select())
            .load(conn)?
    };
    Ok(presented
        .iter()
        .map(|credentials| match credentials {
            Credentials::Bootstrap => Some(Caller::bootstrap_admin()),
            Credentials::Key { id, secret_hash } => {
                let row = rows.iter().find(|row| row.id == *id)?;
                let matches: bool = secret_hash.ct_eq(row.secret_hash.as_slice()).into();
                if !matches || row.revoked_at.is_some() {
                    return None;
                }
                Some(Caller {
                    key_id: Some(ApiKeyId(row.id)),
                    scope: Scope::parse(&row.scope)?,
                    account_id: row.account_id.map(AccountId),
                })
            }
        })
        .collect())
}

/// Whether any admin key can still be used (not revoked).
pub fn usable_admin_key_exists(conn: &mut PgConnection) -> Result<bool, ApiError> {
    Ok(diesel::select(diesel::dsl::exists(
        api_keys::table
            .filter(api_keys::scope.eq(Scope::Admin.as_str()))
            .filter(api_keys::revoked_at.is_null()),
    ))
    .get_result(conn)?)
}

/// A freshly created key: the only time the secret is ever visible.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedApiKey {
    pub key_id: ApiKeyId,
    pub key: String,
    pub scope: Scope,
    pub account_id: Option<AccountId>,
    pub label: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Creates a key. Kiosk keys must name an existing account; admin and
/// finance keys must not name one.
pub fn create_api_key(
    conn: &mut PgConnection,
    scope: Scope,
    account: Option<AccountId>,
    label: &Label,
) -> Result<CreatedApiKey, ApiError> {
    if (scope == Scope::Kiosk) != account.is_some() {
        return Err(ApiError::InvalidRequest(
            "kiosk keys are created on an account; admin and finance keys on /v1/api-keys".into(),
        ));
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
    let row: ApiKeyRow = diesel::insert_into(api_keys::table)
        .values(NewApiKey {
            id: key_id,
            secret_hash: &sha256(secret.as_bytes()),
            scope: scope.as_str(),
            account_id: account.map(|a| a.0),
            label: label.as_str(),
        })
        .returning(ApiKeyRow::as_returning())
        .get_result(conn)?;
    Ok(CreatedApiKey {
        key_id: ApiKeyId(row.id),
        key: format!("{KEY_PREFIX}{}_{secret}", key_id.simple()),
        scope,
        account_id: account,
        label: row.label,
        created_at: row.created_at,
    })
}

/// Revokes a key; revoking a revoked key again is a no-op (idempotent).
pub fn revoke_api_key(conn: &mut PgConnection, key: ApiKeyId) -> Result<(), ApiError> {
    let found = diesel::update(api_keys::table.find(key.0))
        .set(
            api_keys::revoked_at.eq(diesel::dsl::now
                .into_sql::<diesel::sql_types::Timestamptz>()
                .nullable()),
        )
        .filter(api_keys::revoked_at.is_null())
        .execute(conn)?;
    if found == 1 {
        return Ok(());
    }
    let exists: bool =
        diesel::select(diesel::dsl::exists(api_keys::table.find(key.0))).get_result(conn)?;
    if exists {
        Ok(())
    } else {
        Err(ApiError::NotFound("api key"))
    }
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
