//! Delivery: the relay turns committed events into deliveries; delivery
//! tasks on every replica claim due deliveries with a lease (`FOR UPDATE
//! SKIP LOCKED`, committed before the HTTP call, so no lock is held while a
//! receiver thinks), send them, and record the attempt fenced on the lease.
//! A replica killed mid-delivery leaves a lease that runs out; another
//! replica sends the event again with the same `webhook-id`. At least once,
//! in no promised order.
//!
//! Each sender claims up to [`DELIVERY_BATCH`] due deliveries in one
//! transaction, sends them concurrently, and records them in one
//! transaction. This bookkeeping commits asynchronously
//! (`synchronous_commit = off`): it never waits for a WAL flush, so the
//! money path's commits keep the disk. A database crash can forget the
//! last fraction of a second of it — a claim (the delivery is simply due
//! again) or a recorded attempt (the event is sent again: at least once
//! allows it) — never an event, which commits with its movement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{
    Array, BigInt, Double, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use futures_util::StreamExt;
use rand::Rng;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::db::{run_blocking, DbPool};
use crate::domain::events::{self, EventView};
use crate::error::ApiError;
use crate::metrics::Metrics;

use super::signing::signature_header;
use super::url_guard::{is_public, redacted, GuardedResolver};

/// The `WEBHOOK_*` settings are parsed and checked by the configuration.
pub use crate::config::{parse_proxy, parse_schedule, WebhookSettings};

/// How often an idle relay or delivery task looks for work.
pub const WEBHOOK_POLL: Duration = Duration::from_millis(250);
/// Events fanned out per relay transaction.
const RELAY_BATCH: i32 = 500;
/// Deliveries a sender claims, sends (concurrently) and records together.
pub const DELIVERY_BATCH: i64 = 8;
/// Bytes of a receiver's answer read at most (the rest is dropped).
const RESPONSE_BODY_LIMIT: usize = 16 * 1024;
/// A lease outlives the HTTP timeout by this much.
const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// Longest wait a `Retry-After` can impose.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 3_600);

/// The delivery client: no redirects, a timeout, and no proxy but
/// `WEBHOOK_PROXY`. Left to itself reqwest would use `HTTP_PROXY` and
/// friends from the environment; through a proxy, the proxy resolves the
/// receiver's name and our resolver's check of the address never runs.
pub fn delivery_client(settings: &WebhookSettings) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(settings.timeout)
        .user_agent(concat!(
            "token-billing-webhooks/",
            env!("CARGO_PKG_VERSION")
        ))
        .no_proxy();
    if let Some(proxy) = &settings.proxy {
        // The resolver below would only see the proxy's own name (often a
        // private address): the proxy is trusted to apply the rule.
        builder = builder.proxy(reqwest::Proxy::all(proxy.expose_secret().trim())?);
    } else if !settings.allow_private {
        builder = builder.dns_resolver(Arc::new(GuardedResolver));
    }
    builder.build()
}

impl WebhookSettings {
    /// The delay after `attempts` failed attempts, with ±20 % jitter and at
    /// least `Retry-After`; `None` when no attempt is left.
    pub fn next_delay(&self, attempts: i32, retry_after: Option<Duration>) -> Option<Duration> {
        let base = *self.schedule.get(usize::try_from(attempts).ok()?)?;
        let jittered = base.mul_f64(rand::thread_rng().gen_range(0.8..=1.2));
        Some(retry_after.map_or(jittered, |wait| jittered.max(wait.min(RETRY_AFTER_MAX))))
    }
}

/// Starts the relay and `concurrency` delivery tasks (none when 0).
pub fn start(
    pool: DbPool,
    metrics: Arc<Metrics>,
    settings: WebhookSettings,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, reqwest::Error> {
    if settings.concurrency == 0 {
        return Ok(Vec::new());
    }
    let client = delivery_client(&settings)?;
    // A burst of one batch, then `max_per_second` on average.
    let burst = std::num::NonZeroU32::new(DELIVERY_BATCH.unsigned_abs().try_into().unwrap_or(8))
        .unwrap_or(std::num::NonZeroU32::MIN);
    let pace = std::num::NonZeroU32::new(settings.max_per_second).map(|rate| {
        governor::RateLimiter::direct(governor::Quota::per_second(rate).allow_burst(burst))
    });
    let context = Arc::new(Context {
        pool,
        metrics,
        settings,
        client,
        pace,
    });
    let mut tasks = vec![tokio::spawn(relay(Arc::clone(&context), shutdown.clone()))];
    for _ in 0..context.settings.concurrency {
        tasks.push(tokio::spawn(deliver_loop(
            Arc::clone(&context),
            shutdown.clone(),
        )));
    }
    Ok(tasks)
}

struct Context {
    pool: DbPool,
    metrics: Arc<Metrics>,
    settings: WebhookSettings,
    client: reqwest::Client,
    /// `WEBHOOK_MAX_PER_SECOND`: delivery is background work and yields the
    /// machine to the money path (docs/webhooks.md has the measurement).
    pace: Option<governor::DefaultDirectRateLimiter>,
}

async fn pause(shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = shutdown.changed() => false,
        () = tokio::time::sleep(WEBHOOK_POLL) => true,
    }
}

/// Fans out committed events into deliveries (one replica at a time).
async fn relay(context: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        match run_blocking(&context.pool, relay_step).await {
            Ok(Some(handled)) if handled >= RELAY_BATCH => continue,
            Ok(_) => {}
            Err(error) => tracing::warn!(?error, "webhook relay step failed"),
        }
        if !pause(&mut shutdown).await {
            return;
        }
    }
}

/// One relay transaction; the number of events handled, `None` when
/// another replica is relaying.
pub fn relay_step(conn: &mut PgConnection) -> Result<Option<i32>, ApiError> {
    #[derive(QueryableByName)]
    struct Step {
        #[diesel(sql_type = Nullable<Integer>)]
        handled: Option<i32>,
    }
    let step: Step = diesel::sql_query("SELECT webhook_relay_step($1) AS handled")
        .bind::<Integer, _>(RELAY_BATCH)
        .get_result(conn)?;
    Ok(step.handled)
}

async fn deliver_loop(context: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        let lease = context.settings.timeout + LEASE_MARGIN;
        match run_blocking(&context.pool, move |conn| {
            claim(conn, lease, DELIVERY_BATCH)
        })
        .await
        {
            Ok(claimed) if !claimed.is_empty() => {
                deliver(&context, claimed).await;
                continue;
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(?error, "claiming webhook deliveries failed"),
        }
        if !pause(&mut shutdown).await {
            return;
        }
    }
}

/// A claimed delivery with what it needs to be sent.
#[derive(QueryableByName)]
pub struct Claimed {
    #[diesel(sql_type = SqlUuid)]
    pub delivery_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: Uuid,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = BigInt)]
    pub lease_token: i64,
    #[diesel(sql_type = Text)]
    url: String,
    #[diesel(sql_type = Text)]
    secret: String,
    #[diesel(sql_type = Nullable<Text>)]
    previous_secret: Option<String>,
    #[diesel(embed)]
    event: EventView,
}

/// Claims up to `limit` of the most overdue deliveries of enabled
/// endpoints, each with a lease (committed asynchronously).
pub fn claim(
    conn: &mut PgConnection,
    lease: Duration,
    limit: i64,
) -> Result<Vec<Claimed>, ApiError> {
    conn.transaction(|conn| {
        diesel::sql_query("SET LOCAL synchronous_commit = off").execute(conn)?;
        Ok(diesel::sql_query(
            "WITH claimed AS ( \
           UPDATE webhook_deliveries d \
           SET lease_token = d.lease_token + 1, attempts = d.attempts + 1, \
               leased_until = now() + make_interval(secs => $1) \
           WHERE d.id IN ( \
             SELECT d2.id FROM webhook_deliveries d2 \
             JOIN webhook_endpoints w ON w.id = d2.endpoint_id \
             WHERE d2.status = 'pending' AND d2.next_attempt_at <= now() \
               AND (d2.leased_until IS NULL OR d2.leased_until < now()) \
               AND w.enabled AND w.deleted_at IS NULL \
             ORDER BY d2.next_attempt_at LIMIT $2 \
             FOR UPDATE OF d2 SKIP LOCKED) \
           RETURNING d.id, d.endpoint_id, d.event_id, d.attempts, d.lease_token) \
         SELECT c.id AS delivery_id, c.endpoint_id, c.attempts, c.lease_token, w.url, w.secret, \
           CASE WHEN w.previous_secret_expires_at > now() THEN w.previous_secret END \
             AS previous_secret, \
           e.id, e.type AS type_, e.created_at, e.data \
         FROM claimed c JOIN webhook_endpoints w ON w.id = c.endpoint_id \
         JOIN events e ON e.id = c.event_id",
        )
        .bind::<Double, _>(lease.as_secs_f64())
        .bind::<BigInt, _>(limit)
        .load(conn)?)
    })
}

/// How one attempt ended, before it is recorded.
pub struct Sent {
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub retry_after: Option<Duration>,
    pub latency: Duration,
    pub attempted_at: DateTime<Utc>,
}

async fn deliver(context: &Context, claimed: Vec<Claimed>) {
    if let Some(pace) = &context.pace {
        for _ in 0..claimed.len() {
            pace.until_ready().await;
        }
    }
    let sent = futures_util::future::join_all(claimed.iter().map(|one| send(context, one))).await;
    let attempts: Vec<(Claimed, Sent, Answer)> = claimed
        .into_iter()
        .zip(sent)
        .map(|(claimed, sent)| {
            context
                .metrics
                .webhook_delivery_seconds
                .observe(sent.latency.as_secs_f64());
            let answer = outcome_of(&sent);
            (claimed, sent, answer)
        })
        .collect();
    let settings = context.settings.clone();
    let recorded = run_blocking(&context.pool, move |conn| {
        conn.transaction(|conn| {
            diesel::sql_query("SET LOCAL synchronous_commit = off").execute(conn)?;
            record(conn, &settings, &attempts)
        })
    })
    .await;
    match recorded {
        Ok(labels) => {
            for label in labels {
                context
                    .metrics
                    .webhook_deliveries_total
                    .with_label_values(&[label])
                    .inc();
            }
        }
        Err(error) => tracing::warn!(?error, "recording webhook attempts failed"),
    }
}

/// What an attempt's answer means.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answer {
    Delivered,
    Failed,
    Gone,
}

fn outcome_of(sent: &Sent) -> Answer {
    match sent.status_code {
        Some(code) if (200..300).contains(&code) => Answer::Delivered,
        Some(410) => Answer::Gone,
        _ => Answer::Failed,
    }
}

async fn send(context: &Context, claimed: &Claimed) -> Sent {
    let attempted_at = Utc::now();
    let started = Instant::now();
    let failed = |error: String| Sent {
        status_code: None,
        error: Some(error),
        retry_after: None,
        latency: started.elapsed(),
        attempted_at,
    };
    let body = match serde_json::to_vec(&claimed.event) {
        Ok(body) => body,
        Err(error) => return failed(format!("the event could not be serialized: {error}")),
    };
    let url = match reqwest::Url::parse(&claimed.url) {
        Ok(url) => url,
        Err(error) => return failed(format!("invalid url: {error}")),
    };
    // An address literal never reaches the resolver: check it here.
    if !context.settings.allow_private {
        let literal = url
            .host_str()
            .map(|host| host.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|host| host.parse::<std::net::IpAddr>().ok());
        if literal.is_some_and(|address| !is_public(address)) {
            return failed("refused: the url's address is not public".into());
        }
    }
    let id = claimed.event.id.to_string();
    let timestamp = attempted_at.timestamp();
    let current = SecretString::from(claimed.secret.clone());
    let previous = claimed.previous_secret.clone().map(SecretString::from);
    let mut secrets = vec![&current];
    secrets.extend(previous.as_ref());
    let signature = signature_header(&secrets, &id, timestamp, &body);
    let response = context
        .client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    match response {
        Err(error) => failed(describe(error)),
        Ok(response) => {
            let status_code = response.status().as_u16();
            let retry_after = if matches!(status_code, 429 | 503) {
                retry_after(response.headers())
            } else {
                None
            };
            // Read a little of the answer (lets the connection be reused),
            // never more.
            let mut stream = response.bytes_stream();
            let mut read = 0usize;
            while read < RESPONSE_BODY_LIMIT {
                match stream.next().await {
                    Some(Ok(chunk)) => read += chunk.len(),
                    _ => break,
                }
            }
            Sent {
                status_code: Some(status_code),
                error: None,
                retry_after,
                latency: started.elapsed(),
                attempted_at,
            }
        }
    }
}

/// A short, secret-free description of a transport error.
fn describe(error: reqwest::Error) -> String {
    if error.is_timeout() {
        "timeout".into()
    } else if error.is_connect() {
        let mut source: Option<&dyn std::error::Error> = Some(&error);
        let mut deepest = String::from("connection failed");
        while let Some(inner) = source {
            deepest = inner.to_string();
            source = inner.source();
        }
        format!("connection failed: {deepest}")
    } else {
        format!("request failed: {}", error.without_url())
    }
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = DateTime::parse_from_rfc2822(value).ok()?;
    (date.with_timezone(&Utc) - Utc::now()).to_std().ok()
}

/// What one attempt decides: the metric label, the delivery's new status
/// and when it is due again.
fn verdict(
    settings: &WebhookSettings,
    claimed: &Claimed,
    sent: &Sent,
    answer: Answer,
) -> (&'static str, &'static str, f64) {
    let next_delay = match answer {
        Answer::Delivered => None,
        Answer::Failed | Answer::Gone => settings.next_delay(claimed.attempts, sent.retry_after),
    };
    // Gone keeps the delivery pending: re-enabling the endpoint resumes it.
    match (answer, next_delay) {
        (Answer::Delivered, _) => ("delivered", "delivered", 0.0),
        (Answer::Gone, delay) => (
            "endpoint_gone",
            "pending",
            delay.unwrap_or(Duration::ZERO).as_secs_f64(),
        ),
        (Answer::Failed, Some(delay)) => ("retrying", "pending", delay.as_secs_f64()),
        (Answer::Failed, None) => ("exhausted", "failed", 0.0),
    }
}

/// Records a batch of attempts (inside the caller's transaction), set-based:
/// every attempt row; each delivery's new state only where this replica
/// still holds its lease; then each endpoint's health from its last
/// attempt of the batch (a 410 wins) — a success clears the failure streak, a failure
/// starts or continues it, and 410 or a streak longer than
/// `WEBHOOK_DISABLE_AFTER_HOURS` disables the endpoint with its
/// `endpoint.disabled` event, once. Returns the metric labels.
pub fn record(
    conn: &mut PgConnection,
    settings: &WebhookSettings,
    attempts: &[(Claimed, Sent, Answer)],
) -> Result<Vec<&'static str>, ApiError> {
    let verdicts: Vec<(&'static str, &'static str, f64)> = attempts
        .iter()
        .map(|(claimed, sent, answer)| verdict(settings, claimed, sent, *answer))
        .collect();
    let column = |pick: fn(&(Claimed, Sent, Answer)) -> Uuid| -> Vec<Uuid> {
        attempts.iter().map(pick).collect()
    };
    let delivery_ids = column(|(claimed, ..)| claimed.delivery_id);
    diesel::sql_query(
        "UPDATE webhook_deliveries d SET status = input.status, leased_until = NULL, \
           next_attempt_at = now() + make_interval(secs => input.retry_in), \
           delivered_at = CASE WHEN input.status = 'delivered' THEN now() END \
         FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::float8[]) \
           AS input (id, lease_token, status, retry_in) \
         WHERE d.id = input.id AND d.lease_token = input.lease_token",
    )
    .bind::<Array<SqlUuid>, _>(&delivery_ids)
    .bind::<Array<BigInt>, _>(
        attempts
            .iter()
            .map(|(claimed, ..)| claimed.lease_token)
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Text>, _>(verdicts.iter().map(|verdict| verdict.1).collect::<Vec<_>>())
    .bind::<Array<Double>, _>(verdicts.iter().map(|verdict| verdict.2).collect::<Vec<_>>())
    .execute(conn)?;
    diesel::sql_query(
        "INSERT INTO webhook_attempts (delivery_id, endpoint_id, event_id, attempt, \
           attempted_at, status_code, error, latency_ms, outcome) \
         SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int[], \
           $5::timestamptz[], $6::int[], $7::text[], $8::float8[], $9::text[])",
    )
    .bind::<Array<SqlUuid>, _>(&delivery_ids)
    .bind::<Array<SqlUuid>, _>(column(|(claimed, ..)| claimed.endpoint_id))
    .bind::<Array<SqlUuid>, _>(column(|(claimed, ..)| claimed.event.id))
    .bind::<Array<Integer>, _>(
        attempts
            .iter()
            .map(|(claimed, ..)| claimed.attempts)
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Timestamptz>, _>(
        attempts
            .iter()
            .map(|(_, sent, _)| sent.attempted_at)
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Nullable<Integer>>, _>(
        attempts
            .iter()
            .map(|(_, sent, _)| sent.status_code.map(i32::from))
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Nullable<Text>>, _>(
        attempts
            .iter()
            .map(|(_, sent, _)| sent.error.clone())
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Double>, _>(
        attempts
            .iter()
            .map(|(_, sent, _)| {
                crate::time::round_milliseconds(sent.latency.as_secs_f64() * 1_000.0)
            })
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Text>, _>(verdicts.iter().map(|verdict| verdict.0).collect::<Vec<_>>())
    .execute(conn)?;
    // Each endpoint once, judged by its last attempt of the batch (or its 410).
    let mut last: Vec<&(Claimed, Sent, Answer)> = Vec::new();
    for attempt in attempts {
        match last
            .iter_mut()
            .find(|seen| seen.0.endpoint_id == attempt.0.endpoint_id)
        {
            // A 410 stays the verdict: it disables at once.
            Some(seen) if seen.2 != Answer::Gone => *seen = attempt,
            Some(_) => {}
            None => last.push(attempt),
        }
    }
    for (claimed, sent, answer) in last {
        endpoint_health(conn, settings, claimed.endpoint_id, sent, *answer)?;
    }
    Ok(verdicts.into_iter().map(|verdict| verdict.0).collect())
}

/// One endpoint's health after an attempt.
fn endpoint_health(
    conn: &mut PgConnection,
    settings: &WebhookSettings,
    endpoint: Uuid,
    sent: &Sent,
    answer: Answer,
) -> Result<(), ApiError> {
    if answer == Answer::Delivered {
        // At most one write a second per endpoint on the happy path.
        diesel::sql_query(
            "UPDATE webhook_endpoints SET failing_since = NULL, last_success_at = now() \
             WHERE id = $1 AND (failing_since IS NOT NULL OR last_success_at IS NULL \
                                OR last_success_at < now() - interval '1 second')",
        )
        .bind::<SqlUuid, _>(endpoint)
        .execute(conn)?;
        return Ok(());
    }
    #[derive(QueryableByName)]
    struct Health {
        #[diesel(sql_type = Text)]
        url: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        just_disabled: bool,
        #[diesel(sql_type = Nullable<Text>)]
        disabled_reason: Option<String>,
        #[diesel(sql_type = Nullable<Timestamptz>)]
        failing_since: Option<DateTime<Utc>>,
    }
    // The row lock makes exactly one attempt the one that disables it.
    // NO KEY UPDATE, like the UPDATE itself: it does not conflict with
    // the key-share locks that the attempt's foreign keys take (FOR
    // UPDATE would, and two attempts would deadlock).
    let health: Option<Health> = diesel::sql_query(
        "WITH before AS (SELECT enabled FROM webhook_endpoints WHERE id = $1 FOR NO KEY UPDATE), \
         verdict AS (SELECT $2 OR COALESCE(w.failing_since, now()) \
                            <= now() - make_interval(secs => $3) AS disable \
                     FROM webhook_endpoints w WHERE w.id = $1) \
         UPDATE webhook_endpoints w \
         SET failing_since = COALESCE(w.failing_since, now()), \
             enabled = w.enabled AND NOT verdict.disable, \
             disabled_reason = CASE WHEN w.enabled AND verdict.disable \
                                    THEN CASE WHEN $2 THEN 'gone' ELSE 'failing' END \
                                    ELSE w.disabled_reason END, \
             updated_at = now() \
         FROM before, verdict \
         WHERE w.id = $1 \
         RETURNING w.url, before.enabled AND NOT w.enabled AS just_disabled, \
           w.disabled_reason, w.failing_since",
    )
    .bind::<SqlUuid, _>(endpoint)
    .bind::<diesel::sql_types::Bool, _>(answer == Answer::Gone)
    .bind::<Double, _>(settings.disable_after.as_secs_f64())
    .get_result(conn)
    .optional()?;
    if let Some(health) = health.filter(|health| health.just_disabled) {
        events::emit(
            conn,
            "endpoint.disabled",
            None,
            &serde_json::json!({
                "endpoint_id": endpoint,
                // The feed is read by finance, and the event is sent to
                // other endpoints: never the URL's secret parts.
                "url": redacted(&health.url),
                "reason": health.disabled_reason,
                "failing_since": health.failing_since,
                "last_status_code": sent.status_code,
                "last_error": sent.error,
            }),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_end() {
        let schedule = parse_schedule("0,5,300").expect("valid");
        assert_eq!(schedule.len(), 3);
        assert!(parse_schedule("").is_err());
        assert!(parse_schedule("1,x").is_err());
        assert!(parse_schedule("-1").is_err());
        let settings = WebhookSettings {
            timeout: Duration::from_secs(1),
            schedule,
            disable_after: Duration::from_secs(3_600),
            allow_private: false,
            concurrency: 1,
            max_per_second: 0,
            proxy: None,
        };
        // After the first attempt: 5 s ± 20 %.
        let delay = settings.next_delay(1, None).expect("attempts left");
        assert!((4.0..=6.0).contains(&delay.as_secs_f64()), "{delay:?}");
        // Retry-After above the schedule wins.
        let delay = settings
            .next_delay(1, Some(Duration::from_secs(60)))
            .expect("attempts left");
        assert_eq!(delay, Duration::from_secs(60));
        assert!(settings.next_delay(3, None).is_none());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "120".parse().expect("header"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(120)));
        let later = (Utc::now() + chrono::Duration::seconds(90)).to_rfc2822();
        headers.insert(RETRY_AFTER, later.parse().expect("header"));
        let wait = retry_after(&headers).expect("a date");
        assert!((80..=90).contains(&wait.as_secs()), "{wait:?}");
    }
}
