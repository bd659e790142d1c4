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
//! An account's batches run back to back in one task of their own, on one
//! pooled connection, with no hop between one batch's commit and the next
//! batch; not in any request's future, so a client that disconnects cannot
//! strand the requests queued behind it. A batch that panics is answered
//! 500 and its connection given up; the queue goes on with another.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use diesel::PgConnection;
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

/// Runs one batch of a lane on a pooled connection: one answer per item.
type RunBatch<T> = fn(&Coalescer, &mut PgConnection, AccountId, Vec<T>) -> Vec<Answer>;

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
            Coalescer::run_reserves,
        )
        .await
    }

    /// Commits or releases, alone or together with concurrent ones.
    pub async fn resolve(self: &Arc<Self>, account: AccountId, item: ResolveItem) -> Answer {
        self.submit(
            account,
            item,
            |this| &this.resolves,
            Coalescer::run_resolves,
        )
        .await
    }

    /// Queues `item` in its lane and, if no task drains the account's queue
    /// yet, starts one.
    async fn submit<T: Send + 'static>(
        self: &Arc<Self>,
        account: AccountId,
        item: T,
        lane: fn(&Coalescer) -> &Lane<T>,
        run: RunBatch<T>,
    ) -> Answer {
        if self.max_batch == 1 {
            let this = Arc::clone(self);
            let answers = run_blocking(&self.pool, move |conn| {
                Ok(run(&this, conn, account, vec![item]))
            })
            .await;
            return answers.map_or_else(|error| Err(same_error(&error)), |mut a| a.remove(0));
        }
        let (reply, answer) = oneshot::channel();
        if lane(self).enqueue(account.0, Queued { item, reply }) {
            tokio::spawn(Arc::clone(self).drain(account, lane, run));
        }
        answer.await.unwrap_or_else(|_| Err(dropped()))
    }

    /// Runs the account's batches back to back on one pooled connection —
    /// no hop between one batch's commit and the next batch — until its
    /// queue is empty (the entry then goes, under the lane's lock).
    async fn drain<T: Send + 'static>(
        self: Arc<Self>,
        account: AccountId,
        lane: fn(&Coalescer) -> &Lane<T>,
        run: RunBatch<T>,
    ) {
        loop {
            let this = Arc::clone(&self);
            let drained = run_blocking(&self.pool, move |conn| {
                while let Some(batch) = lane(&this).take(account.0, this.max_batch) {
                    let (items, replies): (Vec<_>, Vec<_>) =
                        batch.into_iter().map(|q| (q.item, q.reply)).unzip();
                    let answers =
                        catch_unwind(AssertUnwindSafe(|| run(&this, conn, account, items)));
                    if !deliver(replies, answers) {
                        // The connection may be mid-transaction: give it up
                        // (the pool discards it) and go on with another.
                        return Err(dropped());
                    }
                }
                Ok(())
            })
            .await;
            match drained {
                Ok(()) => return,
                // No connection: what waits is answered 503 (nothing was
                // done; a retry is safe), then later arrivals are tried.
                Err(error @ ApiError::Unavailable(_)) => {
                    let Some(batch) = lane(&self).take(account.0, usize::MAX) else {
                        return;
                    };
                    for queued in batch {
                        let _ = queued.reply.send(Err(same_error(&error)));
                    }
                }
                Err(error) => tracing::error!(%account, ?error, "a coalesced batch failed"),
            }
        }
    }

    /// One batch of reservations: those the batch cannot make go one by
    /// one, on the same connection, which answers each as usual.
    fn run_reserves(
        &self,
        conn: &mut PgConnection,
        account: AccountId,
        items: Vec<ReserveItem>,
    ) -> Vec<Answer> {
        let count = items.len();
        let ttl = self.default_ttl_seconds;
        self.metrics
            .coalesced_batch_size
            .with_label_values(&["reserve"])
            .observe(count as f64);
        let made = if count > 1 {
            batches::reserve_batch(conn, account, &items, ttl).unwrap_or_else(|error| {
                tracing::warn!(%account, ?error, "coalesced reservations failed; one by one");
                vec![None; count]
            })
        } else {
            vec![None]
        };
        items
            .iter()
            .zip(made)
            .map(|(item, made)| {
                let answer = match made {
                    Some(row) => Ok((row, Outcome::Created)),
                    None => reserve_one(conn, account, item, ttl),
                };
                self.metrics
                    .reserve_result(&answer, item.request.amount.get());
                answer
            })
            .collect()
    }

    /// One batch of commits and releases, like `run_reserves`.
    fn run_resolves(
        &self,
        conn: &mut PgConnection,
        account: AccountId,
        items: Vec<ResolveItem>,
    ) -> Vec<Answer> {
        let count = items.len();
        self.metrics
            .coalesced_batch_size
            .with_label_values(&["resolve"])
            .observe(count as f64);
        let moved = if count > 1 {
            batches::resolve_batch(conn, account, &items).unwrap_or_else(|error| {
                tracing::warn!(%account, ?error, "coalesced resolutions failed; one by one");
                vec![None; count]
            })
        } else {
            vec![None]
        };
        items
            .iter()
            .zip(moved)
            .map(|(item, moved)| {
                let answer = match moved {
                    Some(row) => Ok((row, Outcome::Created)),
                    None => resolve_one(conn, account, item),
                };
                if let Ok((row, Outcome::Created)) = &answer {
                    self.metrics.resolution(
                        &row.state,
                        row.committed_amount,
                        row.amount - row.committed_amount,
                    );
                }
                answer
            })
            .collect()
    }
}

/// One reservation: the one-statement path, else the full path (replays,
/// refusals, bad keys).
fn reserve_one(
    conn: &mut PgConnection,
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
fn resolve_one(conn: &mut PgConnection, account: AccountId, item: &ResolveItem) -> Answer {
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

/// Sends each answer; false when the batch panicked (its requests are
/// answered 500).
fn deliver(
    replies: Vec<oneshot::Sender<Answer>>,
    answers: std::thread::Result<Vec<Answer>>,
) -> bool {
    match answers {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The client may have gone; its request is done regardless.
                let _ = reply.send(answer);
            }
            true
        }
        Err(_) => {
            tracing::error!("a coalesced batch panicked");
            for reply in replies {
                let _ = reply.send(Err(dropped()));
            }
            false
        }
    }
}

fn dropped() -> ApiError {
    ApiError::Internal("the request's batch ended without an answer".into())
}

/// The same error again, for each request of a batch that never ran.
fn same_error(error: &ApiError) -> ApiError {
    match error {
        ApiError::Unavailable(message) => ApiError::Unavailable(message.clone()),
        other => ApiError::Internal(other.to_string()),
    }
}
