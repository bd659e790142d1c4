//! The audit log: who changed what, when, from which request.
//!
//! One `audit_events` row per administrative change, written in the same
//! transaction as the change: account create and patch, key create and
//! revoke here (through [`record`]); credits and adjustments by the money
//! engine itself (`engine_credit`, `engine_adjust`). A replay or a refused
//! change writes nothing. The table is append-only (triggers refuse UPDATE,
//! DELETE and TRUNCATE).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use crate::db::models::{AuditEventRow, NewAuditEvent};
use crate::db::schema::audit_events;
use crate::domain::api_keys::Caller;
use crate::domain::paging::{page_limit, page_of};
use crate::error::ApiError;

/// Page sizes of the audit log.
pub const AUDIT_PAGE_DEFAULT: i64 = 100;
pub const AUDIT_PAGE_MAX: i64 = 1_000;
/// Longest `target` filter, in characters.
pub const AUDIT_TARGET_LENGTH_MAX: usize = 200;
/// The actor of a change made with direct database access (the CLI).
pub const LOCAL_ACTOR: &str = "cli";

/// Who makes a change: the actor (a key id or the bootstrap marker) and
/// the HTTP request's id, when there is one.
#[derive(Clone, Debug)]
pub struct Audit {
    pub actor: String,
    pub request_id: Option<String>,
}

impl Audit {
    /// The caller of the current request. Call it in the request's task
    /// (the request id is task-local), not inside `run_blocking`.
    pub fn of(caller: &Caller) -> Audit {
        Audit {
            actor: caller.actor(),
            request_id: crate::telemetry::current_request_id(),
        }
    }

    /// A change without an HTTP request (the CLI).
    pub fn local() -> Audit {
        Audit {
            actor: LOCAL_ACTOR.to_owned(),
            request_id: None,
        }
    }
}

/// Writes one event; call it inside the change's transaction.
pub fn record(
    conn: &mut PgConnection,
    audit: &Audit,
    action: &str,
    target: &str,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> Result<(), ApiError> {
    diesel::insert_into(audit_events::table)
        .values(NewAuditEvent {
            actor: &audit.actor,
            action,
            target,
            before,
            after,
            request_id: audit.request_id.as_deref(),
        })
        .execute(conn)?;
    Ok(())
}

/// One event as the API shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AuditEventView {
    pub event_id: Uuid,
    /// The key id of who made the change, `bootstrap-admin`, or `cli`.
    pub actor: String,
    /// `account.created`, `account.updated`, `api_key.created`,
    /// `api_key.revoked`, `credit.created` or `adjustment.created`.
    pub action: String,
    /// `account:<account_id>` or `api_key:<key_id>`.
    pub target: String,
    /// The changed fields before the change; null for a creation.
    #[schema(value_type = Option<Object>)]
    pub before: Option<serde_json::Value>,
    /// The changed fields after the change.
    #[schema(value_type = Option<Object>)]
    pub after: Option<serde_json::Value>,
    /// The `X-Request-Id` of the request that made the change.
    pub request_id: Option<String>,
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
}

impl From<AuditEventRow> for AuditEventView {
    /// Rows are history (the table is append-only), and rows written before
    /// URLs were redacted on the way in still hold whole webhook URLs: they
    /// are redacted on the way out too.
    fn from(row: AuditEventRow) -> Self {
        let redact = row.action.starts_with("webhook_endpoint.");
        let shown = |value: Option<serde_json::Value>| {
            value.map(|mut value| {
                if redact {
                    redact_url_member(&mut value);
                }
                value
            })
        };
        AuditEventView {
            event_id: row.event_id,
            actor: row.actor,
            action: row.action,
            target: row.target,
            before: shown(row.before),
            after: shown(row.after),
            request_id: row.request_id,
            created_at: row.created_at,
        }
    }
}

/// Redacts a `url` string member of an object (a webhook endpoint's
/// recorded state).
pub fn redact_url_member(value: &mut serde_json::Value) {
    if let Some(serde_json::Value::String(url)) = value.get_mut("url") {
        *url = crate::secrets::redact_url(url);
    }
}

/// One page of the audit log, oldest first; `next_after` is the cursor of
/// the next page (`null` on the last one).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    pub events: Vec<AuditEventView>,
    pub next_after: Option<i64>,
}

/// What to list: validated by `AuditFilter::parse`.
#[derive(Clone, Debug)]
pub struct AuditFilter {
    after: Option<i64>,
    limit: i64,
    target: Option<String>,
}

impl AuditFilter {
    pub fn parse(
        after: Option<i64>,
        limit: Option<i64>,
        target: Option<String>,
    ) -> Result<AuditFilter, ApiError> {
        let limit = page_limit(limit, AUDIT_PAGE_DEFAULT, AUDIT_PAGE_MAX)?;
        if after.is_some_and(|after| after < 0) {
            return Err(ApiError::InvalidRequest(
                "after must be a non-negative event cursor".into(),
            ));
        }
        if let Some(target) = &target {
            if target.is_empty() || target.chars().count() > AUDIT_TARGET_LENGTH_MAX {
                return Err(ApiError::InvalidRequest(format!(
                    "target must be 1 to {AUDIT_TARGET_LENGTH_MAX} characters"
                )));
            }
            if target.chars().any(char::is_control) {
                return Err(ApiError::InvalidRequest(
                    "target must not contain control characters".into(),
                ));
            }
        }
        Ok(AuditFilter {
            after,
            limit,
            target,
        })
    }
}

/// Events in id order (commit order within a target), after the cursor.
pub fn list_events(conn: &mut PgConnection, filter: &AuditFilter) -> Result<AuditPage, ApiError> {
    let mut query = audit_events::table
        .select(AuditEventRow::as_select())
        .order(audit_events::id.asc())
        .limit(filter.limit + 1)
        .into_boxed();
    if let Some(after) = filter.after {
        query = query.filter(audit_events::id.gt(after));
    }
    if let Some(target) = &filter.target {
        query = query.filter(audit_events::target.eq(target.clone()));
    }
    let (rows, next_after) = page_of(query.load(conn)?, filter.limit, |row: &AuditEventRow| {
        row.id
    });
    Ok(AuditPage {
        events: rows.into_iter().map(AuditEventView::from).collect(),
        next_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_filters_are_refused() {
        assert!(AuditFilter::parse(None, Some(0), None).is_err());
        assert!(AuditFilter::parse(None, Some(1001), None).is_err());
        assert!(AuditFilter::parse(Some(-1), None, None).is_err());
        assert!(AuditFilter::parse(None, None, Some(String::new())).is_err());
        assert!(AuditFilter::parse(None, None, Some("a\u{7}".into())).is_err());
        assert!(AuditFilter::parse(None, None, Some("x".repeat(201))).is_err());
        let filter = AuditFilter::parse(Some(3), None, Some("account:x".into())).expect("valid");
        assert_eq!(filter.limit, AUDIT_PAGE_DEFAULT);
    }
}
