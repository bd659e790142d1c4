//! Group commit: concurrent money requests of any accounts in one engine
//! batch (`COALESCE_MAX_BATCH` operations at most).
//!
//! Each replica keeps at most `COALESCE_MAX_IN_FLIGHT` batches in flight.
//! A request that arrives while fewer are in flight starts a batch at once
//! (an uncontended request waits for nothing) — unless a batch in flight
//! holds its account: it would only wait for that batch's lock, so it
//! queues for the next batch instead; one that arrives while all are busy
//! queues too, and the next batch to start takes everything queued — one
//! transaction, one lock round and one WAL flush for all of it. (Kiosks
//! sharing one account so get batches of all of them, not two half-size
//! batches waiting on each other's lock: a batch costs the database about
//! as much to start as a few operations cost to apply.) The
//! engine (`engine_apply`) locks the batch's accounts in id order and
//! applies its operations in arrival order, as if one by one, so batches
//! never deadlock each other and every request gets the answer it would
//! have had alone.
//!
//! Batches run in tasks of their own, not in any request's future, so a
//! client that disconnects cannot strand the requests queued behind it. A
//! batch that fails as a whole (a lost race the database undid, say) is
//! retried one operation at a time, so one request's trouble is never
//! another's. A batch that panics is answered 500 and its connection given
//! up; with no connection at all, what waits is answered 503.
//!
//! A batch whose connection turns out dead (the primary went away: a
//! crash, a failover) is sent once more on another connection — which the
//! pool makes to the primary of the moment, and which answers a ping just
//! before — before anyone is answered 503. That is safe even if the first
//! attempt committed before the connection broke: every operation is
//! idempotent (request ids, external refs, reservation states), so the
//! engine answers the second attempt as a replay.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use diesel::r2d2::R2D2Connection;
use diesel::PgConnection;
use tokio::sync::oneshot;

use crate::db::{run_blocking, DbPool};
use crate::engine::types::AccountId;
use crate::engine::{self, Answer, Operation};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// An operation with the answer to it.
pub type Answered = (Operation, Result<Answer, ApiError>);

struct Queued {
    operation: Operation,
    reply: oneshot::Sender<Answered>,
    /// Already sent once on a connection that turned out dead.
    resent: bool,
}

/// How a run of batches on one connection ended.
enum Drained {
    /// Nothing waits any more.
    Empty,
    /// The connection died; what it was doing is queued again.
    ConnectionLost,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Queued>,
    /// Tasks running batches; each takes from `waiting` until it is empty.
    in_flight: usize,
    /// The accounts of the batches running now, with how many hold each.
    busy: HashMap<AccountId, usize>,
}

impl Queue {
    /// Whether a request on `account`, just queued, starts a batch of its
    /// own. With none in flight, always: a running task takes what waits
    /// before it stops (`take`, under the queue's lock), so a request that
    /// starts none is never left waiting alone.
    fn starts(&self, account: AccountId, max_in_flight: usize) -> bool {
        self.in_flight == 0 || (self.in_flight < max_in_flight && !self.busy.contains_key(&account))
    }

    /// The next batch (`max` operations at most, oldest first), or None
    /// when nothing waits: then the task stops counting as in flight.
    /// `held`: the accounts of the task's last batch, which stop counting
    /// as busy; those of the new batch replace them and start.
    fn take(&mut self, max: usize, mut held: Option<&mut Vec<AccountId>>) -> Option<Vec<Queued>> {
        if let Some(held) = held.as_mut() {
            self.release(held);
        }
        if self.waiting.is_empty() {
            self.in_flight -= 1;
            return None;
        }
        let take = self.waiting.len().min(max);
        let batch: Vec<Queued> = self.waiting.drain(..take).collect();
        if let Some(held) = held {
            held.extend(batch.iter().map(|queued| queued.operation.account));
            self.hold(held);
        }
        Some(batch)
    }

    fn hold(&mut self, accounts: &[AccountId]) {
        for account in accounts {
            *self.busy.entry(*account).or_insert(0) += 1;
        }
    }

    fn release(&mut self, accounts: &mut Vec<AccountId>) {
        for account in accounts.drain(..) {
            if let Some(count) = self.busy.get_mut(&account) {
                *count -= 1;
                if *count == 0 {
                    self.busy.remove(&account);
                }
            }
        }
    }
}

/// The accounts of the batch a draining task runs, counted busy until it
/// takes its next batch or stops (also when it stops early: a panic, a
/// lost connection).
struct Held<'a> {
    coalescer: &'a Coalescer,
    accounts: Vec<AccountId>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.accounts.is_empty() {
            self.coalescer.lock().release(&mut self.accounts);
        }
    }
}

pub struct Coalescer {
    pool: DbPool,
    metrics: Arc<Metrics>,
    max_batch: usize,
    max_in_flight: usize,
    queue: Mutex<Queue>,
}

impl Coalescer {
    pub fn new(
        pool: DbPool,
        metrics: Arc<Metrics>,
        max_batch: usize,
        max_in_flight: usize,
    ) -> Coalescer {
        Coalescer {
            pool,
            metrics,
            max_batch: max_batch.max(1),
            max_in_flight: max_in_flight.max(1),
            queue: Mutex::new(Queue::default()),
        }
    }

    /// Applies `operation`, alone or in a batch with concurrent ones.
    pub async fn submit(self: &Arc<Self>, operation: Operation) -> Answered {
        if self.max_batch == 1 {
            return self.submit_alone(operation).await;
        }
        let (reply, answer) = oneshot::channel();
        let copy = operation.clone();
        let account = operation.account;
        let start = {
            let mut queue = self.lock();
            queue.waiting.push_back(Queued {
                operation,
                reply,
                resent: false,
            });
            let start = queue.starts(account, self.max_in_flight);
            if start {
                queue.in_flight += 1;
            }
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).drain());
        }
        answer.await.unwrap_or_else(|_| (copy, Err(dropped())))
    }

    /// Group commit off: every request is its own statement, sent once
    /// more on another connection when its connection turns out dead.
    async fn submit_alone(self: &Arc<Self>, operation: Operation) -> Answered {
        let mut answered = (operation.clone(), Err(dropped()));
        for _ in 0..2 {
            let this = Arc::clone(self);
            let operation = operation.clone();
            let attempt = run_blocking(&self.pool, move |conn| {
                let answered = this.run_batch(conn, vec![operation]).pop();
                Ok((answered, crate::db::lost_on_this_thread()))
            })
            .await;
            match attempt {
                Ok((Some(result), lost)) => {
                    answered = result;
                    if !(lost && matches!(answered.1, Err(ApiError::Unavailable(_)))) {
                        break;
                    }
                }
                Ok((None, _)) => break,
                Err(error) => {
                    answered.1 = Err(error);
                    break;
                }
            }
        }
        answered
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next batch ([`Queue::take`], under the queue's lock, so no
    /// arrival is missed).
    fn take(&self, max: usize, held: Option<&mut Held>) -> Option<Vec<Queued>> {
        self.lock().take(max, held.map(|held| &mut held.accounts))
    }

    /// Runs batches back to back on one pooled connection — no hop between
    /// one batch's commit and the next — until nothing waits.
    async fn drain(self: Arc<Self>) {
        loop {
            let this = Arc::clone(&self);
            let drained = run_blocking(&self.pool, move |conn| this.drain_on(conn)).await;
            match drained {
                Ok(Drained::Empty) => return,
                // Go on with another connection from the pool.
                Ok(Drained::ConnectionLost) => {}
                // No connection: what waits is answered 503 (nothing was
                // done; a retry is safe), and this task stops.
                Err(error @ ApiError::Unavailable(_)) => {
                    let Some(batch) = self.take(usize::MAX, None) else {
                        return;
                    };
                    for queued in batch {
                        let _ = queued
                            .reply
                            .send((queued.operation, Err(same_error(&error))));
                    }
                    // `take` above did not stop this task: the queue was
                    // not empty. Stop it now, unless more arrived.
                    if self.take(0, None).is_none() {
                        return;
                    }
                }
                // The connection was given up (a batch panicked, or the
                // database went away mid-batch): go on with another.
                Err(error) => tracing::warn!(?error, "a coalesced batch lost its connection"),
            }
        }
    }

    fn drain_on(&self, conn: &mut PgConnection) -> Result<Drained, ApiError> {
        let mut held = Held {
            coalescer: self,
            accounts: Vec::new(),
        };
        while let Some(mut batch) = self.take(self.max_batch, Some(&mut held)) {
            // A batch's job finishes go last, in arrival order: a finish
            // writes at once, after the batch's pending writes
            // (engine_apply), so finishes in the middle would split the
            // rest of the batch into several writes. The requests of a
            // batch are concurrent (none waits for another's answer), so
            // any order of them is one their clients could have seen.
            batch.sort_by_key(|queued| matches!(queued.operation.op, engine::Op::FinishJob { .. }));
            // Operations sent once already go only to a connection that
            // answers now. This one may have been checked out before the
            // loss they met, and not checked since (another task's batch
            // died, and this task took what it queued again).
            if batch.iter().any(|queued| queued.resent) && conn.ping().is_err() {
                crate::db::connection_lost();
                self.requeue(batch);
                return Ok(Drained::ConnectionLost);
            }
            let resent: Vec<bool> = batch.iter().map(|queued| queued.resent).collect();
            let (operations, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|q| (q.operation, q.reply)).unzip();
            let count = operations.len();
            let answered = catch_unwind(AssertUnwindSafe(|| self.run_batch(conn, operations)));
            let Ok(answered) = answered else {
                tracing::error!("a coalesced batch panicked");
                // The operations went with the panic: nothing to send back
                // but the error, which the waiting requests get as 500.
                drop(replies);
                return Err(dropped());
            };
            debug_assert_eq!(answered.len(), count);
            let lost_connection = answered
                .iter()
                .any(|(_, answer)| matches!(answer, Err(ApiError::Unavailable(_))));
            if lost_connection && crate::db::lost_on_this_thread() {
                self.resend_or_answer(replies, answered, resent);
                return Ok(Drained::ConnectionLost);
            }
            for (reply, answered) in replies.into_iter().zip(answered) {
                // The client may have gone; its request is done regardless.
                let _ = reply.send(answered);
            }
            if lost_connection {
                return Err(ApiError::Unavailable(
                    "the database connection broke".into(),
                ));
            }
        }
        Ok(Drained::Empty)
    }

    /// After a dead connection: operations sent only once go back to the
    /// front of the queue, in order; the others are answered (503).
    fn resend_or_answer(
        &self,
        replies: Vec<oneshot::Sender<Answered>>,
        answered: Vec<Answered>,
        resent: Vec<bool>,
    ) {
        let mut again = Vec::new();
        for ((reply, answered), resent) in replies.into_iter().zip(answered).zip(resent) {
            if resent || !matches!(answered.1, Err(ApiError::Unavailable(_))) {
                let _ = reply.send(answered);
            } else {
                again.push(Queued {
                    operation: answered.0,
                    reply,
                    resent: true,
                });
            }
        }
        self.requeue(again);
    }

    /// Puts `batch` back at the front of the queue, in its order.
    fn requeue(&self, batch: Vec<Queued>) {
        let mut queue = self.lock();
        for queued in batch.into_iter().rev() {
            queue.waiting.push_front(queued);
        }
    }

    /// One batch: one statement; if it fails as a whole, each operation
    /// alone. Metrics are counted here, after the commit.
    fn run_batch(&self, conn: &mut PgConnection, operations: Vec<Operation>) -> Vec<Answered> {
        self.metrics
            .coalesced_batch_size
            .observe(operations.len() as f64);
        // The tallies of a batch that committed, counted once.
        let counted = |applied: engine::Applied| {
            self.metrics.tokens("grant_expired", applied.grant_expired);
            self.metrics.tokens("credited", applied.topup_credited);
            applied.answers
        };
        let answers = match engine::apply_counted(conn, &operations) {
            Ok(applied) => counted(applied).into_iter().map(Ok).collect(),
            Err(error) if operations.len() == 1 => vec![Err(error)],
            Err(error @ ApiError::Unavailable(_)) => {
                operations.iter().map(|_| Err(same_error(&error))).collect()
            }
            Err(error) => {
                tracing::warn!(?error, "a coalesced batch failed; one operation at a time");
                operations
                    .iter()
                    .map(|operation| {
                        engine::apply_counted(conn, std::slice::from_ref(operation))
                            .map(counted)?
                            .pop()
                            .ok_or_else(|| ApiError::Internal("the engine answered nothing".into()))
                    })
                    .collect::<Vec<_>>()
            }
        };
        operations
            .into_iter()
            .zip(answers)
            .map(|(operation, answer)| {
                if let Ok(answer) = &answer {
                    self.metrics.engine_answer(&operation, answer);
                }
                (operation, answer)
            })
            .collect()
    }
}

fn dropped() -> ApiError {
    ApiError::Internal("the request's batch ended without an answer".into())
}

/// The same error again, for each request of a batch.
fn same_error(error: &ApiError) -> ApiError {
    match error {
        ApiError::Unavailable(message) => ApiError::Unavailable(message.clone()),
        other => ApiError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use diesel::dsl::sql;
    use diesel::prelude::*;
    use diesel::sql_types::{Bool, Integer};
    use tokio::sync::oneshot::error::TryRecvError;
    use tokio::sync::oneshot::Receiver;
    use uuid::Uuid;

    use super::{Answered, Coalescer, Drained, Queue, Queued};
    use crate::engine::types::{AccountId, ReservationId};
    use crate::engine::{Authority, Op, Operation};
    use crate::metrics::Metrics;

    fn queue(queue: &mut Queue, account: AccountId) {
        queued(queue, account, false);
    }

    fn queued(queue: &mut Queue, account: AccountId, resent: bool) -> Receiver<Answered> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        queue.waiting.push_back(Queued {
            operation: Operation {
                account,
                authority: Authority::Verified {
                    actor: "test".into(),
                },
                op: Op::Release {
                    reservation: ReservationId(Uuid::new_v4()),
                },
            },
            reply,
            resent,
        });
        answer
    }

    /// The race behind a rare `failover` test failure (6 or 12 of 12
    /// answered 503): a batch dies with its connection and is queued again;
    /// another task, whose connection was checked out before that loss and
    /// died with it, takes the batch. It must not send it there (a second
    /// failure answers it 503): it puts it back, unanswered, and asks the
    /// pool for a connection, which is checked after the loss. Needs the
    /// tests' PostgreSQL (`TEST_DATABASE_SERVER`, as `tests/api`).
    #[test]
    fn an_operation_sent_once_never_goes_to_a_connection_that_is_dead_too() {
        let server = std::env::var("TEST_DATABASE_SERVER")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let connect = || {
            PgConnection::establish(&format!("{server}/postgres"))
                .expect("PostgreSQL reachable (TEST_DATABASE_SERVER)")
        };
        let (mut admin, mut dead) = (connect(), connect());
        let pid: i32 = diesel::select(sql::<Integer>("pg_backend_pid()"))
            .get_result(&mut dead)
            .expect("the backend's pid");
        // With a timeout, pg_terminate_backend waits until the backend is
        // gone (true), or says it is not (false) after 10 s.
        let gone: bool = diesel::select(
            sql::<Bool>("pg_terminate_backend(")
                .bind::<Integer, _>(pid)
                .sql(", 10000)"),
        )
        .get_result(&mut admin)
        .expect("terminate the backend");
        assert!(gone, "the backend outlived 10 s");

        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let pool = crate::db::build_pool(&format!("{server}/postgres"), 1);
        let coalescer = Coalescer::new(pool, metrics, 32, 2);
        let account = AccountId(Uuid::new_v4());
        let mut answer = {
            let mut queue = coalescer.lock();
            queue.in_flight = 1;
            queued(&mut queue, account, true)
        };
        let drained = coalescer.drain_on(&mut dead);
        assert!(matches!(drained, Ok(Drained::ConnectionLost)));
        // Unanswered, back in the queue as sent once, and the connection
        // marked for the pool to discard.
        assert!(matches!(answer.try_recv(), Err(TryRecvError::Empty)));
        let queue = coalescer.lock();
        assert_eq!(queue.waiting.len(), 1);
        assert!(queue.waiting[0].resent && queue.waiting[0].operation.account == account);
        assert!(queue.busy.is_empty());
        assert!(crate::error::take_lost_on_this_thread());
    }

    #[test]
    fn a_request_on_an_account_a_batch_holds_waits_for_the_next_batch() {
        let (one, other) = (AccountId(Uuid::new_v4()), AccountId(Uuid::new_v4()));
        let mut q = Queue::default();
        // None in flight: always a batch of its own.
        queue(&mut q, one);
        assert!(q.starts(one, 2));
        q.in_flight = 1;
        let mut held = Vec::new();
        let batch = q.take(32, Some(&mut held)).expect("a batch");
        assert_eq!(batch.len(), 1);
        assert_eq!(held, [one]);
        // While it runs: the same account queues, another starts a batch.
        queue(&mut q, one);
        assert!(!q.starts(one, 2));
        assert!(q.starts(other, 2));
        // All in flight: everything queues.
        q.in_flight = 2;
        assert!(!q.starts(other, 2));
        q.in_flight = 1;
        // The running task's next batch takes what waits; its last batch's
        // account is free again, the new one's busy.
        queue(&mut q, other);
        let batch = q.take(32, Some(&mut held)).expect("the queued two");
        assert_eq!(batch.len(), 2);
        assert_eq!(held, [one, other]);
        assert_eq!(q.busy.len(), 2);
        // Nothing waits: the task stops, nothing stays busy.
        assert!(q.take(32, Some(&mut held)).is_none());
        assert_eq!(q.in_flight, 0);
        assert!(q.busy.is_empty() && held.is_empty());
        // And a stale busy entry never strands a request: with none in
        // flight it starts.
        q.busy.insert(one, 1);
        queue(&mut q, one);
        assert!(q.starts(one, 2));
    }
}
