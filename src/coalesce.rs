//! Group commit for one account's spending requests (`COALESCE_MAX_BATCH`).
//!
//! Requests on one account serialise on its row lock, held through each
//! transaction's WAL flush. Here each replica keeps, per account, at most
//! one transaction of reservations and one of commits/releases in flight:
//! requests that arrive meanwhile queue in memory and go together as the
//! next batch (`domain::batches`), one lock and one flush for all of them.
//! An uncontended request is a batch of one: the one-statement path, with
//! no waiting.
//!
//! Each batch runs in a task of its own, not in any request's future, so a
//! client that disconnects cannot strand the requests queued behind it.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::FutureExt;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::db::models::ReservationRow;
use crate::db::{run_blocking, DbPool};
use crate::domain::batches::{self, ReserveItem, ResolveItem};
use crate::domain::reservations::{self, Outcome};
use crate::domain::types::{AccountId, Tokens};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// The answer to one reserve, commit or release request.
pub type Answer = Result<(ReservationRow, Outcome), ApiError>;

struct Queued<T> {
    item: T,
    reply: oneshot::Sender<Answer>,
}

/// Per-account queues of one kind of request. An account has an entry
/// exactly while a task is draining its queue.
struct Lane<T> {
    queues: Mutex<HashMap<Uuid, Vec<Queued<T>>>>,
}

impl<T> Lane<T> {
    fn new() -> Lane<T> {
        Lane {
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Queues a request; true when no task drains this account yet (the
    /// caller must start one).
    fn enqueue(&self, account: Uuid, queued: Queued<T>) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        match queues.get_mut(&account) {
            Some(queue) => {
                queue.push(queued);
                false
            }
            None => {
                queues.insert(account, vec![queued]);
                true
            }
        }
    }

    /// The next batch, oldest first; `None` (and the entry removed, under
    /// the same lock) when the queue is empty.
    fn take(&self, account: Uuid, max: usize) -> Option<Vec<Queued<T>>> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = queues.get_mut(&account)?;
        if queue.is_empty() {
            queues.remove(&account);
            return None;
        }
        let take = queue.len().min(max);
        Some(queue.drain(..take).collect())
    }
}

pub struct Coalescer {
    pool: DbPool,
    metrics: Arc<Metrics>,
    default_ttl_seconds: i32,
    max_batch: usize,
    reserves: Lane<ReserveItem>,
    resolves: Lane<ResolveItem>,
}

impl Coalescer {
    pub fn new(
        pool: DbPool,
        metrics: Arc<Metrics>,
        default_ttl_seconds: i32,
        max_batch: usize,
    ) -> Coalescer {
        Coalescer {
            pool,
            metrics,
            default_ttl_seconds,
            max_batch: max_batch.max(1),
            reserves: Lane::new(),
            resolves: Lane::new(),
        }
    }

    /// Reserves, alone or together with concurrent reservations.
    pub async fn reserve(self: &Arc<Self>, account: AccountId, item: ReserveItem) -> Answer {
        self.submit(
            account,
            item,
            |this| &this.reserves,
            move |this, items| async move { this.run_reserves(account, items).await },
        )
        .await
    }

    /// Commits or releases, alone or together with concurrent ones.
    pub async fn resolve(self: &Arc<Self>, account: AccountId, item: ResolveItem) -> Answer {
        self.submit(
            account,
            item,
            |this| &this.resolves,
            move |this, items| async move { this.run_resolves(account, items).await },
        )
        .await
    }

    /// Queues `item` in its lane and, if no task drains the account's queue
    /// yet, starts one that runs batches with `run` until the queue is empty.
    async fn submit<T, Run, Ran>(
        self: &Arc<Self>,
        account: AccountId,
        item: T,
        lane: fn(&Coalescer) -> &Lane<T>,
        run: Run,
    ) -> Answer
    where
        T: Send + 'static,
        Run: Fn(Arc<Coalescer>, Vec<T>) -> Ran + Send + 'static,
        Ran: Future<Output = Vec<Answer>> + Send,
    {
        if self.max_batch == 1 {
            return run(Arc::clone(self), vec![item]).await.remove(0);
        }
        let (reply, answer) = oneshot::channel();
        if lane(self).enqueue(account.0, Queued { item, reply }) {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                while let Some(batch) = lane(&this).take(account.0, this.max_batch) {
                    let (items, replies): (Vec<_>, Vec<_>) =
                        batch.into_iter().map(|q| (q.item, q.reply)).unzip();
                    let answers = run(Arc::clone(&this), items);
                    deliver(replies, AssertUnwindSafe(answers).catch_unwind().await);
                }
            });
        }
        answer.await.unwrap_or_else(|_| Err(dropped()))
    }

    /// One batch of reservations: those the batch cannot make go one by
    /// one, on the same connection, which answers each as usual.
    async fn run_reserves(&self, account: AccountId, items: Vec<ReserveItem>) -> Vec<Answer> {
        let count = items.len();
        let (metrics, ttl) = (Arc::clone(&self.metrics), self.default_ttl_seconds);
        metrics
            .coalesced_batch_size
            .with_label_values(&["reserve"])
            .observe(count as f64);
        let answers = run_blocking(&self.pool, move |conn| {
            let made = if count > 1 {
                batches::reserve_batch(conn, account, &items, ttl).unwrap_or_else(|error| {
                    tracing::warn!(%account, ?error, "coalesced reservations failed; one by one");
                    vec![None; count]
                })
            } else {
                vec![None]
            };
            Ok(items
                .iter()
                .zip(made)
                .map(|(item, made)| {
                    let answer = match made {
                        Some(row) => Ok((row, Outcome::Created)),
                        None => reserve_one(conn, account, item, ttl),
                    };
                    metrics.reserve_result(&answer, item.request.amount.get());
                    answer
                })
                .collect())
        })
        .await;
        answers.unwrap_or_else(|error| unavailable(count, &error))
    }

    /// One batch of commits and releases, like `run_reserves`.
    async fn run_resolves(&self, account: AccountId, items: Vec<ResolveItem>) -> Vec<Answer> {
        let count = items.len();
        let metrics = Arc::clone(&self.metrics);
        metrics
            .coalesced_batch_size
            .with_label_values(&["resolve"])
            .observe(count as f64);
        let answers = run_blocking(&self.pool, move |conn| {
            let moved = if count > 1 {
                batches::resolve_batch(conn, account, &items).unwrap_or_else(|error| {
                    tracing::warn!(%account, ?error, "coalesced resolutions failed; one by one");
                    vec![None; count]
                })
            } else {
                vec![None]
            };
            Ok(items
                .iter()
                .zip(moved)
                .map(|(item, moved)| {
                    let answer = match moved {
                        Some(row) => Ok((row, Outcome::Created)),
                        None => resolve_one(conn, account, item),
                    };
                    if let Ok((row, Outcome::Created)) = &answer {
                        metrics.resolution(
                            &row.state,
                            row.committed_amount,
                            row.amount - row.committed_amount,
                        );
                    }
                    answer
                })
                .collect())
        })
        .await;
        answers.unwrap_or_else(|error| unavailable(count, &error))
    }
}

/// One reservation: the one-statement path, else the full path (replays,
/// refusals, bad keys).
fn reserve_one(
    conn: &mut diesel::PgConnection,
    account: AccountId,
    item: &ReserveItem,
    default_ttl_seconds: i32,
) -> Answer {
    let (credentials, request) = (&item.credentials, &item.request);
    if let Some(row) =
        reservations::reserve_fast(conn, credentials, account, request, default_ttl_seconds)?
    {
        return Ok((row, Outcome::Created));
    }
    let caller = credentials.verify(conn)?;
    caller.authorize_spend(account)?;
    reservations::reserve(conn, account, request, default_ttl_seconds, &caller.actor())
}

/// One commit or release: the one-statement path, else the full path.
fn resolve_one(conn: &mut diesel::PgConnection, account: AccountId, item: &ResolveItem) -> Answer {
    let ResolveItem {
        credentials,
        reservation,
        amount,
        release,
    } = item;
    if let Some(row) =
        reservations::resolve_fast(conn, credentials, account, *reservation, *amount, *release)?
    {
        return Ok((row, Outcome::Created));
    }
    let caller = credentials.verify(conn)?;
    caller.authorize_spend(account)?;
    let amount: Option<Tokens> = *amount;
    reservations::resolve(
        conn,
        account,
        *reservation,
        amount,
        *release,
        &caller.actor(),
    )
}

fn deliver(replies: Vec<oneshot::Sender<Answer>>, answers: std::thread::Result<Vec<Answer>>) {
    match answers {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The client may have gone; its request is done regardless.
                let _ = reply.send(answer);
            }
        }
        Err(_) => {
            tracing::error!("a coalesced batch panicked");
            for reply in replies {
                let _ = reply.send(Err(dropped()));
            }
        }
    }
}

fn dropped() -> ApiError {
    ApiError::Internal("the request's batch ended without an answer".into())
}

/// The batch never ran (no connection, or its task failed): the same error
/// for each of its requests.
fn unavailable(count: usize, error: &ApiError) -> Vec<Answer> {
    (0..count)
        .map(|_| {
            Err(match error {
                ApiError::Unavailable(message) => ApiError::Unavailable(message.clone()),
                other => ApiError::Internal(other.to_string()),
            })
        })
        .collect()
}
