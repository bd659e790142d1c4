//! The event feed: what happened to the money, in commit order.
//!
//! Events are written by the money engine in the transaction of the
//! movement they report (migration `…_events_and_webhooks`): no event
//! without its movement, no movement without its event. The feed lists an
//! event only once no running transaction can still commit an earlier one
//! (`events_feed`), so a reader paging with `after` never skips one.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::db::states::{parse_param, EventType};
use crate::domain::api_keys;
use crate::domain::paging::page_limit;
use crate::error::ApiError;

/// Page sizes of the feed.
pub const EVENT_PAGE_DEFAULT: i64 = 100;
pub const EVENT_PAGE_MAX: i64 = 1_000;

/// An event type given by a client, with an error that lists the types.
pub fn parse_event_type(field: &str, value: &str) -> Result<EventType, ApiError> {
    parse_param(field, value, EventType::ALL, EventType::parse)
}

/// One event, as the feed and the webhooks send it.
#[derive(Clone, Debug, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct EventView {
    /// The event's id: `webhook-id` of every delivery of it.
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// One of the event types (docs/webhooks.md).
    #[serde(rename = "type")]
    #[diesel(sql_type = Text, column_name = type_)]
    #[schema(example = "account.balance_low")]
    pub event_type: String,
    #[diesel(sql_type = Timestamptz)]
    #[serde(with = "crate::time::micros")]
    pub created_at: DateTime<Utc>,
    /// `account_id`, the account's `balances` after the movement and its
    /// `low_balance_threshold`, and the object: `entry` (the ledger entry),
    /// `credit`, `adjustment`, `reservation` or `job`.
    #[diesel(sql_type = Jsonb)]
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// One page of the feed, oldest first. `next_after` is the `after` of the
/// next call: the last event's id, or the given `after` when nothing new
/// has committed (null only when there is no event yet).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub events: Vec<EventView>,
    pub next_after: Option<Uuid>,
}

/// What to list: validated by `EventFilter::parse`.
#[derive(Clone, Debug)]
pub struct EventFilter {
    pub after: Option<Uuid>,
    pub limit: i64,
    pub event_type: Option<EventType>,
    pub account: Option<Uuid>,
}

impl EventFilter {
    pub fn parse(
        after: Option<Uuid>,
        limit: Option<i64>,
        event_type: Option<&str>,
        account: Option<Uuid>,
    ) -> Result<EventFilter, ApiError> {
        let limit = page_limit(limit, EVENT_PAGE_DEFAULT, EVENT_PAGE_MAX)?;
        let event_type = event_type
            .map(|value| parse_event_type("type", value))
            .transpose()?;
        Ok(EventFilter {
            after,
            limit,
            event_type,
            account,
        })
    }
}

#[derive(QueryableByName)]
struct FeedRow {
    #[diesel(embed)]
    event: EventView,
}

#[derive(QueryableByName)]
struct Position {
    #[diesel(sql_type = BigInt)]
    txid: i64,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// The next committed events after the cursor.
pub fn list_events(conn: &mut PgConnection, filter: &EventFilter) -> Result<EventPage, ApiError> {
    let (txid, seq) = match filter.after {
        None => (0, 0),
        Some(after) => {
            // With an account filter (always, for a kiosk), another
            // account's event is no cursor of this feed: it answers as an
            // id that names nothing, so its existence is not told.
            let position: Option<Position> = diesel::sql_query(
                "SELECT txid, seq FROM events \
                 WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)",
            )
            .bind::<SqlUuid, _>(after)
            .bind::<Nullable<SqlUuid>, _>(filter.account)
            .get_result(conn)
            .optional()?;
            let Some(position) = position else {
                return Err(unknown_cursor(conn)?);
            };
            (position.txid, position.seq)
        }
    };
    let rows: Vec<FeedRow> = diesel::sql_query(
        "SELECT id, type AS type_, created_at, data FROM events_feed($1, $2, $3, $4, $5)",
    )
    .bind::<BigInt, _>(txid)
    .bind::<BigInt, _>(seq)
    .bind::<Integer, _>(i32::try_from(filter.limit).unwrap_or(i32::MAX))
    .bind::<Nullable<Text>, _>(filter.event_type.map(EventType::as_str))
    .bind::<Nullable<SqlUuid>, _>(filter.account)
    .load(conn)?;
    let events: Vec<EventView> = rows
        .into_iter()
        .map(|row| {
            let mut event = row.event;
            // Written with the whole URL before URLs were redacted on the
            // way in; events are history, so they are redacted on the way
            // out.
            if event.event_type == "endpoint.disabled" {
                crate::domain::audit::redact_url_member(&mut event.data);
            }
            event
        })
        .collect();
    let next_after = events.last().map(|event| event.id).or(filter.after);
    Ok(EventPage { events, next_after })
}

/// The error for an `after` that names no event in the table: when
/// retention has pruned events, it says that the cursor may be one of them
/// and that resuming from it would skip events, instead of a silent gap.
fn unknown_cursor(conn: &mut PgConnection) -> Result<ApiError, ApiError> {
    Ok(
        match crate::domain::retention::events_pruned_before(conn)? {
            None => ApiError::InvalidRequest(
                "after must be the id of an event of this feed (a previous `next_after`)".into(),
            ),
            Some(pruned_before) => ApiError::InvalidRequest(format!(
                "after is not an event of this feed any more: events created before {} have been \
             deleted by retention (RETENTION_EVENTS), and this cursor is unknown or was one of \
             them; the events between it and the oldest kept event cannot be listed (they are \
             in the archive when ARCHIVE_DIR is set). Start again without after to read the \
             oldest events kept",
                pruned_before.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            )),
        },
    )
}

/// The page as a kiosk may see it: no key ids (`actor` members become the
/// acting key's scope and label, `api_keys::actors_for_kiosk`). The events
/// themselves are history and stay as written.
pub fn as_kiosk_sees_it(
    conn: &mut PgConnection,
    mut page: EventPage,
) -> Result<EventPage, ApiError> {
    let mut actors = Vec::new();
    for event in &page.events {
        api_keys::actors_in(&event.data, &mut actors);
    }
    let names = api_keys::actors_for_kiosk(conn, actors)?;
    for event in &mut page.events {
        api_keys::rename_actors(&mut event.data, &names);
    }
    Ok(page)
}

/// Writes an event that is not a money movement (`invariant.violated`,
/// `endpoint.disabled`) through the engine's one event writer.
pub fn emit(
    conn: &mut PgConnection,
    event_type: &str,
    account: Option<Uuid>,
    data: &serde_json::Value,
) -> Result<(), ApiError> {
    diesel::sql_query("SELECT engine_emit_event($1, $2, $3, clock_timestamp())")
        .bind::<Text, _>(event_type)
        .bind::<Nullable<SqlUuid>, _>(account)
        .bind::<Jsonb, _>(data)
        .execute(conn)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked() {
        assert!(EventFilter::parse(None, Some(0), None, None).is_err());
        assert!(EventFilter::parse(None, Some(1001), None, None).is_err());
        assert!(EventFilter::parse(None, None, Some("account.nope"), None).is_err());
        let filter = EventFilter::parse(None, None, Some("credit.created"), None).expect("valid");
        assert_eq!(filter.event_type, Some(EventType::CreditCreated));
        assert_eq!(filter.limit, EVENT_PAGE_DEFAULT);
    }
}
