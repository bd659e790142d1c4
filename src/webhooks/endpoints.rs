//! Webhook endpoints (admin): where events are sent, which ones, and the
//! delivery log. Every change writes its audit event in its transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use uuid::Uuid;

use crate::db::states::EventType;
use crate::domain::audit::{self, Audit};
use crate::domain::paging::{page_limit, page_of};
use crate::error::ApiError;

use super::signing::new_secret;
use super::url_guard::redacted;

/// Page sizes of the endpoint list and the delivery log.
pub const WEBHOOK_PAGE_DEFAULT: i64 = 100;
pub const WEBHOOK_PAGE_MAX: i64 = 1_000;
/// Longest description, in characters.
pub const DESCRIPTION_LENGTH_MAX: usize = 500;
/// How long the previous secret keeps signing after a rotation.
pub const ROTATION_OVERLAP_HOURS: i64 = 24;

/// An endpoint as the API shows it (never its secret).
#[derive(Clone, Debug, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct EndpointView {
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: Uuid,
    #[diesel(sql_type = Text)]
    pub url: String,
    /// The event types sent to it.
    #[diesel(sql_type = Array<Text>)]
    pub events: Vec<String>,
    /// Only this account's events; null: every account's.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub account_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Text>)]
    pub description: Option<String>,
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// Why it is disabled: `disabled_by_admin`, `gone` (it answered 410)
    /// or `failing` (no success for `WEBHOOK_DISABLE_AFTER_HOURS`).
    #[diesel(sql_type = Nullable<Text>)]
    pub disabled_reason: Option<String>,
    /// The first failure since the last success; null when healthy.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[serde(with = "crate::time::micros_option")]
    pub failing_since: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[serde(with = "crate::time::micros_option")]
    pub last_success_at: Option<DateTime<Utc>>,
    /// Until when the previous secret still signs (after a rotation).
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[serde(with = "crate::time::micros_option")]
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub updated_at: DateTime<Utc>,
}

/// The columns of [`EndpointView`].
const VIEW_COLUMNS: &str =
    "id AS endpoint_id, url, event_types AS events, account_id, description, \
     enabled, disabled_reason, failing_since, last_success_at, \
     CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END \
       AS previous_secret_expires_at, created_at, updated_at";

/// A new endpoint or a rotated secret: the secret is shown this once.
/// `Debug` leaves the secret out, so no log line can carry it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointWithSecret {
    #[serde(flatten)]
    pub endpoint: EndpointView,
    /// `whsec_…`: verifies the `webhook-signature` header. Shown only now.
    #[serde(serialize_with = "expose")]
    #[schema(value_type = String, example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    pub secret: SecretString,
}

fn expose<S: serde::Serializer>(secret: &SecretString, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(secret.expose_secret())
}

impl std::fmt::Debug for EndpointWithSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("EndpointWithSecret")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// One page of endpoints, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EndpointPage {
    pub endpoints: Vec<EndpointView>,
    pub next_after: Option<Uuid>,
}

/// Event types as given: at least one, duplicates dropped.
pub fn parse_event_types(types: &[EventType]) -> Result<Vec<String>, ApiError> {
    if types.is_empty() {
        return Err(ApiError::InvalidRequest(
            "events must name at least one event type".into(),
        ));
    }
    let mut parsed: Vec<String> = Vec::with_capacity(types.len());
    for value in types {
        let known = value.as_str().to_owned();
        if !parsed.contains(&known) {
            parsed.push(known);
        }
    }
    Ok(parsed)
}

/// A description: at most 500 characters, no control characters.
pub fn parse_description(description: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(text) = &description {
        if text.chars().count() > DESCRIPTION_LENGTH_MAX {
            return Err(ApiError::InvalidRequest(format!(
                "description must be at most {DESCRIPTION_LENGTH_MAX} characters"
            )));
        }
        if text.chars().any(char::is_control) {
            return Err(ApiError::InvalidRequest(
                "description must not contain control characters".into(),
            ));
        }
    }
    Ok(description)
}

/// A page size of the webhook lists.
pub fn parse_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    page_limit(limit, WEBHOOK_PAGE_DEFAULT, WEBHOOK_PAGE_MAX)
}

/// What a new endpoint is (validated by the route).
pub struct NewEndpoint {
    pub url: String,
    pub events: Vec<String>,
    pub account_id: Option<Uuid>,
    pub description: Option<String>,
}

/// An endpoint as its audit events record it: the URL redacted
/// (`url_guard::redacted`), since finance reads the audit log and a URL is
/// often the receiver's credential.
fn audit_view(view: &EndpointView) -> serde_json::Value {
    serde_json::json!({
        "url": redacted(&view.url),
        "events": view.events,
        "account_id": view.account_id,
        "description": view.description,
        "enabled": view.enabled,
    })
}

/// Creates an endpoint with a fresh secret.
pub fn create(
    conn: &mut PgConnection,
    by: &Audit,
    new: NewEndpoint,
) -> Result<EndpointWithSecret, ApiError> {
    let secret = new_secret();
    conn.transaction(|conn| {
        if let Some(account) = new.account_id {
            let exists: bool = diesel::select(diesel::dsl::exists(
                crate::db::schema::accounts::table.find(account),
            ))
            .get_result(conn)?;
            if !exists {
                return Err(ApiError::NotFound("account"));
            }
        }
        let endpoint: EndpointView = diesel::sql_query(format!(
            "INSERT INTO webhook_endpoints (id, url, event_types, account_id, description, secret) \
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING {VIEW_COLUMNS}"
        ))
        .bind::<SqlUuid, _>(Uuid::now_v7())
        .bind::<Text, _>(&new.url)
        .bind::<Array<Text>, _>(&new.events)
        .bind::<Nullable<SqlUuid>, _>(new.account_id)
        .bind::<Nullable<Text>, _>(new.description.as_deref())
        .bind::<Text, _>(secret.expose_secret())
        .get_result(conn)?;
        audit::record(
            conn,
            by,
            "webhook_endpoint.created",
            &format!("webhook_endpoint:{}", endpoint.endpoint_id),
            None,
            Some(audit_view(&endpoint)),
        )?;
        Ok(EndpointWithSecret { endpoint, secret })
    })
}

pub fn get(conn: &mut PgConnection, endpoint: Uuid) -> Result<EndpointView, ApiError> {
    diesel::sql_query(format!(
        "SELECT {VIEW_COLUMNS} FROM webhook_endpoints WHERE id = $1 AND deleted_at IS NULL"
    ))
    .bind::<SqlUuid, _>(endpoint)
    .get_result(conn)
    .optional()?
    .ok_or(ApiError::NotFound("webhook endpoint"))
}

/// Endpoints in creation order (ids are UUIDv7), after the cursor.
pub fn list(
    conn: &mut PgConnection,
    after: Option<Uuid>,
    limit: i64,
) -> Result<EndpointPage, ApiError> {
    let rows: Vec<EndpointView> = diesel::sql_query(format!(
        "SELECT {VIEW_COLUMNS} FROM webhook_endpoints \
         WHERE deleted_at IS NULL AND ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2"
    ))
    .bind::<Nullable<SqlUuid>, _>(after)
    .bind::<BigInt, _>(limit + 1)
    .load(conn)?;
    let (endpoints, next_after) = page_of(rows, limit, |endpoint| endpoint.endpoint_id);
    Ok(EndpointPage {
        endpoints,
        next_after,
    })
}

/// What a PATCH changes (validated by the route); `None` leaves it.
#[derive(Default)]
pub struct EndpointChange {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub description: Option<String>,
    pub enabled: Option<bool>,
}

/// Changes an endpoint. Enabling it again forgets why it was disabled and
/// its failure streak; its pending deliveries resume.
pub fn update(
    conn: &mut PgConnection,
    by: &Audit,
    endpoint: Uuid,
    change: EndpointChange,
) -> Result<EndpointView, ApiError> {
    conn.transaction(|conn| {
        let before = get(conn, endpoint)?;
        let after: EndpointView = diesel::sql_query(format!(
            "UPDATE webhook_endpoints SET \
               url = COALESCE($2, url), \
               event_types = COALESCE($3, event_types), \
               description = COALESCE($4, description), \
               enabled = COALESCE($5, enabled), \
               disabled_reason = CASE WHEN $5 IS NULL THEN disabled_reason \
                                      WHEN $5 THEN NULL ELSE 'disabled_by_admin' END, \
               failing_since = CASE WHEN $5 THEN NULL ELSE failing_since END, \
               updated_at = now() \
             WHERE id = $1 AND deleted_at IS NULL RETURNING {VIEW_COLUMNS}"
        ))
        .bind::<SqlUuid, _>(endpoint)
        .bind::<Nullable<Text>, _>(change.url.as_deref())
        .bind::<Nullable<Array<Text>>, _>(change.events.as_ref())
        .bind::<Nullable<Text>, _>(change.description.as_deref())
        .bind::<Nullable<Bool>, _>(change.enabled)
        .get_result(conn)?;
        // The redacted URLs may read the same: say whether it changed.
        let mut recorded_after = audit_view(&after);
        recorded_after["url_changed"] = serde_json::json!(before.url != after.url);
        audit::record(
            conn,
            by,
            "webhook_endpoint.updated",
            &format!("webhook_endpoint:{endpoint}"),
            Some(audit_view(&before)),
            Some(recorded_after),
        )?;
        Ok(after)
    })
}

/// Deletes an endpoint: nothing more is sent to it; its delivery log is
/// kept (the row stays, marked deleted).
pub fn delete(conn: &mut PgConnection, by: &Audit, endpoint: Uuid) -> Result<(), ApiError> {
    conn.transaction(|conn| {
        let before = get(conn, endpoint)?;
        diesel::sql_query(
            "UPDATE webhook_endpoints SET deleted_at = now(), enabled = false, updated_at = now() \
             WHERE id = $1",
        )
        .bind::<SqlUuid, _>(endpoint)
        .execute(conn)?;
        audit::record(
            conn,
            by,
            "webhook_endpoint.deleted",
            &format!("webhook_endpoint:{endpoint}"),
            Some(audit_view(&before)),
            None,
        )
    })
}

/// A new secret; the current one keeps signing for 24 hours beside it, so
/// receivers can switch without losing a delivery.
pub fn rotate_secret(
    conn: &mut PgConnection,
    by: &Audit,
    endpoint: Uuid,
) -> Result<EndpointWithSecret, ApiError> {
    let secret = new_secret();
    conn.transaction(|conn| {
        let endpoint_view: EndpointView = diesel::sql_query(format!(
            "UPDATE webhook_endpoints SET previous_secret = secret, \
               previous_secret_expires_at = now() + make_interval(hours => $3), \
               secret = $2, updated_at = now() \
             WHERE id = $1 AND deleted_at IS NULL RETURNING {VIEW_COLUMNS}"
        ))
        .bind::<SqlUuid, _>(endpoint)
        .bind::<Text, _>(secret.expose_secret())
        .bind::<Integer, _>(i32::try_from(ROTATION_OVERLAP_HOURS).unwrap_or(24))
        .get_result(conn)
        .optional()?
        .ok_or(ApiError::NotFound("webhook endpoint"))?;
        audit::record(
            conn,
            by,
            "webhook_endpoint.secret_rotated",
            &format!("webhook_endpoint:{endpoint}"),
            None,
            Some(serde_json::json!({
                "previous_secret_expires_at": endpoint_view.previous_secret_expires_at,
            })),
        )?;
        Ok(EndpointWithSecret {
            endpoint: endpoint_view,
            secret,
        })
    })
}

/// One delivery attempt, for the endpoint's log.
#[derive(Clone, Debug, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct AttemptView {
    /// The log's cursor.
    #[diesel(sql_type = BigInt)]
    pub attempt_id: i64,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub delivery_id: Uuid,
    /// 1 for the first attempt of this event to this endpoint.
    #[diesel(sql_type = Integer)]
    pub attempt: i32,
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status; null when there was no answer.
    #[diesel(sql_type = Nullable<Integer>)]
    pub status_code: Option<i32>,
    /// What went wrong without an answer (timeout, connection refused, …).
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
    /// How long the receiver took, in milliseconds to the microsecond.
    #[diesel(sql_type = diesel::sql_types::Double)]
    #[serde(serialize_with = "crate::time::milliseconds")]
    pub latency_ms: f64,
    /// `delivered`, `retrying`, `exhausted` (no attempt left) or
    /// `endpoint_gone` (410: the endpoint was disabled).
    #[diesel(sql_type = Text)]
    pub outcome: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AttemptPage {
    pub attempts: Vec<AttemptView>,
    pub next_after: Option<i64>,
}

/// The endpoint's attempts, oldest first, after the cursor `after` (an
/// `attempt_id`; none: from the oldest attempt kept).
///
/// Retention deletes old deliveries with all their attempts, whose ids need
/// not be old (a redelivery adds attempts to an old delivery), so attempts
/// after a reader's cursor can go before the reader gets to them. When
/// retention has deleted an attempt of this endpoint with an id above
/// `after` (`webhook_attempt_watermarks`), the cursor is refused with an
/// error that says so, never answered with a page that silently skips it.
/// The page and the watermark are read in one snapshot (a retention batch
/// deletes attempts and raises the watermark in one transaction).
pub fn attempts(
    conn: &mut PgConnection,
    endpoint: Uuid,
    after: Option<i64>,
    limit: i64,
) -> Result<AttemptPage, ApiError> {
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            get(conn, endpoint)?;
            // 0 is no attempt's id (they start at 1): it reads from the
            // oldest attempt kept, like no cursor.
            if let Some(after) = after.filter(|&after| after > 0) {
                if let Some((last_id, last_at)) =
                    crate::domain::retention::webhook_attempts_pruned_through(conn, endpoint)?
                {
                    if last_id > after {
                        return Err(pruned_cursor(after, last_id, last_at));
                    }
                }
            }
            let rows: Vec<AttemptView> = diesel::sql_query(
                "SELECT id AS attempt_id, event_id, delivery_id, attempt, attempted_at, \
                   status_code, error, latency_ms, outcome \
                 FROM webhook_attempts WHERE endpoint_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            )
            .bind::<SqlUuid, _>(endpoint)
            .bind::<BigInt, _>(after.unwrap_or(0))
            .bind::<BigInt, _>(limit + 1)
            .load(conn)?;
            let (attempts, next_after) = page_of(rows, limit, |attempt| attempt.attempt_id);
            Ok(AttemptPage {
                attempts,
                next_after,
            })
        })
}

/// The error for a delivery-log cursor that retention has overtaken.
fn pruned_cursor(after: i64, last_id: i64, last_at: DateTime<Utc>) -> ApiError {
    ApiError::InvalidRequest(format!(
        "after={after} cannot be continued: retention (RETENTION_WEBHOOK_ATTEMPTS) has deleted \
         attempts of this endpoint with attempt_id above it (up to attempt_id {last_id}, made up \
         to {}), together with their finished deliveries, so the next page would silently skip \
         them. They are in the archive under ARCHIVE_DIR/webhook_attempts/ when ARCHIVE_DIR is \
         set. Start again without after to read the log from the oldest attempt kept",
        last_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    ))
}

/// The delivery of one event to one endpoint, as `redeliver` answers it.
#[derive(Clone, Debug, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct DeliveryView {
    #[diesel(sql_type = SqlUuid)]
    pub delivery_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    /// `pending`, `delivered` or `failed`.
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub next_attempt_at: DateTime<Utc>,
}

/// Sends an event to an endpoint again, as soon as possible: the delivery
/// is pending again (created if the endpoint never had this event). The
/// event must be one the endpoint may see (its account, if it has one).
/// An attempt in flight is fenced off (its result no longer decides the
/// delivery's state). The retry schedule continues where it was; a
/// delivery that had used every attempt gets this one more.
pub fn redeliver(
    conn: &mut PgConnection,
    by: &Audit,
    endpoint: Uuid,
    event: Uuid,
) -> Result<DeliveryView, ApiError> {
    conn.transaction(|conn| {
        let view = get(conn, endpoint)?;
        let delivery: Option<DeliveryView> = diesel::sql_query(
            "INSERT INTO webhook_deliveries (endpoint_id, event_id, account_id) \
             SELECT $1, e.id, e.account_id FROM events e \
             WHERE e.id = $2 AND ($3::uuid IS NULL OR e.account_id = $3) \
             ON CONFLICT (endpoint_id, event_id) DO UPDATE \
               SET status = 'pending', next_attempt_at = now(), leased_until = NULL, \
                   lease_token = webhook_deliveries.lease_token + 1 \
             RETURNING id AS delivery_id, endpoint_id, event_id, status, attempts, next_attempt_at",
        )
        .bind::<SqlUuid, _>(endpoint)
        .bind::<SqlUuid, _>(event)
        .bind::<Nullable<SqlUuid>, _>(view.account_id)
        .get_result(conn)
        .optional()?;
        let Some(delivery) = delivery else {
            // Said plainly when retention may have deleted it.
            return Err(match crate::domain::retention::events_pruned_before(conn)? {
                None => ApiError::NotFound("event"),
                Some(_) => ApiError::NotFound(
                    "event (it never existed, or it was older than RETENTION_EVENTS and retention \
                     deleted it; ARCHIVE_DIR keeps deleted events when set); the event",
                ),
            });
        };
        audit::record(
            conn,
            by,
            "webhook_endpoint.redelivery_requested",
            &format!("webhook_endpoint:{endpoint}"),
            None,
            Some(serde_json::json!({"event_id": event})),
        )?;
        Ok(delivery)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_checked_and_deduplicated() {
        assert!(parse_event_types(&[]).is_err());
        let types = parse_event_types(&[
            EventType::CreditCreated,
            EventType::JobFailed,
            EventType::CreditCreated,
        ])
        .expect("valid");
        assert_eq!(types, vec!["credit.created", "job.failed"]);
    }

    #[test]
    fn descriptions_are_checked() {
        assert!(parse_description(Some("x".repeat(501))).is_err());
        assert!(parse_description(Some("a\u{0}b".into())).is_err());
        assert_eq!(
            parse_description(Some("ok".into())).expect("valid"),
            Some("ok".to_owned())
        );
    }
}
