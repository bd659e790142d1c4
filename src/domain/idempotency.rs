//! The `Idempotency-Key` request header, for the creations whose body has no
//! natural key (an account, an API key): a client that lost the answer
//! retries with the same header and gets the object the first request
//! created (200, `Idempotent-Replayed: true`), never a second one.
//!
//! Rules:
//! - a key is 1–200 printable ASCII characters, scoped to the caller (its
//!   API key) and the endpoint (the route and its parsed parameters,
//!   `routes::idempotency_scope`: never the raw path, so `/%761/accounts`
//!   and `/v1/accounts` are one endpoint);
//! - the key is recorded in the creation's own transaction, by an
//!   `INSERT … ON CONFLICT DO NOTHING` on the table's primary key: of two
//!   concurrent requests with one key, the second waits for the first,
//!   finds its row, rolls its own creation back and replays the first;
//! - the same key with another body (SHA-256 of the canonical request) is
//!   422 `idempotency_key_reused`, and nothing is created.

use diesel::prelude::*;
use diesel::sql_types::{Bytea, Text, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::ApiKeyRow;
use crate::db::schema::api_keys;
use crate::domain::api_keys::sha256;
use crate::engine::types::{AccountId, ApiKeyId};
use crate::error::ApiError;

/// The request header.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
/// Longest accepted key, in characters.
pub const IDEMPOTENCY_KEY_LENGTH_MAX: usize = 200;

/// One creation guarded by a key: who asks, where, and for what.
#[derive(Clone, Debug)]
pub struct Claim {
    actor: String,
    endpoint: String,
    key: String,
    request_hash: [u8; 32],
}

impl Claim {
    /// Checks the header's value; `request` is the canonical request (the
    /// parsed body and anything else that decides the result).
    pub fn new(
        actor: String,
        endpoint: String,
        key: &str,
        request: &serde_json::Value,
    ) -> Result<Claim, ApiError> {
        let valid = !key.is_empty()
            && key.len() <= IDEMPOTENCY_KEY_LENGTH_MAX
            && key.bytes().all(|b| (0x20..=0x7e).contains(&b));
        if !valid {
            return Err(ApiError::InvalidRequest(format!(
                "the {IDEMPOTENCY_KEY_HEADER} header must be 1 to \
                 {IDEMPOTENCY_KEY_LENGTH_MAX} printable ASCII characters"
            )));
        }
        // serde_json's maps are ordered by key: the text is canonical.
        let request_hash = sha256(request.to_string().as_bytes());
        Ok(Claim {
            actor,
            endpoint,
            key: key.to_owned(),
            request_hash,
        })
    }
}

/// What `create_once` did: `New(object)`, or `Existing(id)` of the object
/// created earlier with this key and the same request.
#[derive(Debug)]
pub enum Created<T, E = Uuid> {
    New(T),
    Existing(E),
}

#[derive(QueryableByName)]
struct Recorded {
    #[diesel(sql_type = Bytea)]
    request_hash: Vec<u8>,
    #[diesel(sql_type = SqlUuid)]
    resource_id: Uuid,
}

enum Failure {
    Api(ApiError),
    Taken,
}

impl From<diesel::result::Error> for Failure {
    fn from(error: diesel::result::Error) -> Self {
        Failure::Api(error.into())
    }
}

/// Runs `create` (which returns the new object's id and the object) and
/// records the key in the same transaction, unless the key is already
/// recorded: then nothing is created and the recorded id is returned, or
/// 422 when it was recorded for another request.
pub fn create_once<T>(
    conn: &mut PgConnection,
    claim: &Claim,
    create: impl FnOnce(&mut PgConnection) -> Result<(Uuid, T), ApiError>,
) -> Result<Created<T>, ApiError> {
    if let Some(existing) = recorded(conn, claim)? {
        return Ok(Created::Existing(existing));
    }
    let outcome = conn.transaction(|conn| {
        let (id, object) = create(conn).map_err(Failure::Api)?;
        let inserted = diesel::sql_query(
            "INSERT INTO idempotency_keys \
             (actor, endpoint, idempotency_key, request_hash, resource_id) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind::<Text, _>(&claim.actor)
        .bind::<Text, _>(&claim.endpoint)
        .bind::<Text, _>(&claim.key)
        .bind::<Bytea, _>(&claim.request_hash[..])
        .bind::<SqlUuid, _>(id)
        .execute(conn)?;
        if inserted == 1 {
            Ok(object)
        } else {
            // A concurrent request with this key committed first: roll
            // this creation back and answer with that one.
            Err(Failure::Taken)
        }
    });
    match outcome {
        Ok(object) => Ok(Created::New(object)),
        Err(Failure::Api(error)) => Err(error),
        Err(Failure::Taken) => recorded(conn, claim)?
            .map(Created::Existing)
            .ok_or_else(|| ApiError::Internal("idempotency key vanished".into())),
    }
}

/// The id recorded for the claim's key, or 422 when the key was used for
/// another request.
fn recorded(conn: &mut PgConnection, claim: &Claim) -> Result<Option<Uuid>, ApiError> {
    let row: Option<Recorded> = diesel::sql_query(
        "SELECT request_hash, resource_id FROM idempotency_keys \
         WHERE actor = $1 AND endpoint = $2 AND idempotency_key = $3",
    )
    .bind::<Text, _>(&claim.actor)
    .bind::<Text, _>(&claim.endpoint)
    .bind::<Text, _>(&claim.key)
    .get_result(conn)
    .optional()?;
    match row {
        None => Ok(None),
        Some(row) if row.request_hash == claim.request_hash => Ok(Some(row.resource_id)),
        Some(_) => Err(ApiError::IdempotencyKeyReused(format!(
            "this {IDEMPOTENCY_KEY_HEADER} was used for a request with another body"
        ))),
    }
}

/// An API key as a replay shows it: everything but the secret, which the
/// service does not keep (`key` is always null). A client that lost the
/// secret revokes this key and creates another with a new
/// `Idempotency-Key`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReplayedApiKey {
    pub key_id: ApiKeyId,
    /// Always null: the secret is shown once, at creation.
    #[schema(value_type = Option<String>)]
    pub key: Option<String>,
    /// `admin`, `finance` or `kiosk`.
    pub scope: String,
    pub account_id: Option<AccountId>,
    pub label: String,
    #[serde(with = "crate::time::micros")]
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When the key was revoked, if it was.
    #[serde(with = "crate::time::micros_option")]
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the key stops working; null: never.
    #[serde(with = "crate::time::micros_option")]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The replay of an API key created earlier.
pub fn replayed_api_key(conn: &mut PgConnection, key_id: Uuid) -> Result<ReplayedApiKey, ApiError> {
    let row: ApiKeyRow = api_keys::table
        .find(key_id)
        .select(ApiKeyRow::as_select())
        .first(conn)
        .optional()?
        .ok_or(ApiError::NotFound("API key"))?;
    Ok(ReplayedApiKey {
        key_id: ApiKeyId(row.id),
        key: None,
        scope: row.scope,
        account_id: row.account_id.map(AccountId),
        label: row.label,
        created_at: row.created_at,
        revoked_at: row.revoked_at,
        expires_at: row.expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_short_printable_ascii() {
        let request = json!({"name": "x"});
        for bad in ["", "tab\there", "ü", &"k".repeat(201)] {
            assert!(
                Claim::new("a".into(), "/e".into(), bad, &request).is_err(),
                "{bad:?} should be refused"
            );
        }
        assert!(Claim::new("a".into(), "/e".into(), "retry-1 of 3", &request).is_ok());
    }

    #[test]
    fn the_hash_depends_on_the_request_only() {
        let a = Claim::new("a".into(), "/e".into(), "k", &json!({"x": 1, "y": 2})).expect("valid");
        let b = Claim::new("b".into(), "/f".into(), "k", &json!({"y": 2, "x": 1})).expect("valid");
        let c = Claim::new("a".into(), "/e".into(), "k", &json!({"x": 2, "y": 2})).expect("valid");
        assert_eq!(a.request_hash, b.request_hash);
        assert_ne!(a.request_hash, c.request_hash);
    }
}
