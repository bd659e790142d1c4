//! Wake-ups around jobs, without a busy loop per client:
//! - `queued`: a job created on this replica wakes the replica's idle job
//!   claimer at once (it also polls, for jobs created on other replicas);
//! - waiters: `GET …/jobs/{id}?wait_seconds=` parks on a oneshot channel,
//!   holding no database connection. A local worker's finish wakes it at
//!   once; one poller per replica checks all parked jobs in one query, so a
//!   job finished by another replica is seen within `JOB_WATCH_POLL`.
//!   (LISTEN/NOTIFY was measured against it and not taken: a notifying
//!   commit holds PostgreSQL's notification lock until it ends, which cut
//!   finish-like commits to a third at 32 clients, while the poll costs
//!   under 1 % of a core per replica with 2,000 waiters parked;
//!   `bench/notify_vs_poll.sh`, BENCHMARKS.md.)

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

#[derive(Default)]
pub struct JobSignals {
    pub queued: Notify,
    waiters: Mutex<HashMap<Uuid, Vec<oneshot::Sender<()>>>>,
}

impl JobSignals {
    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Vec<oneshot::Sender<()>>>> {
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Parks a waiter for `job`; the receiver fires when the job finishes.
    pub fn subscribe(&self, job: Uuid) -> oneshot::Receiver<()> {
        let (sender, receiver) = oneshot::channel();
        self.waiters().entry(job).or_default().push(sender);
        receiver
    }

    /// Wakes every waiter of `job`.
    pub fn finished(&self, job: Uuid) {
        if let Some(senders) = self.waiters().remove(&job) {
            for sender in senders {
                let _ = sender.send(());
            }
        }
    }

    /// The jobs someone is still waiting for (forgetting clients that left).
    pub fn watched(&self) -> Vec<Uuid> {
        let mut waiters = self.waiters();
        waiters.retain(|_, senders| {
            senders.retain(|sender| !sender.is_closed());
            !senders.is_empty()
        });
        waiters.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finished_wakes_every_waiter_and_forgets_them() {
        let signals = JobSignals::default();
        let job = Uuid::new_v4();
        let (first, second) = (signals.subscribe(job), signals.subscribe(job));
        let gone = signals.subscribe(Uuid::new_v4());
        drop(gone);
        assert_eq!(signals.watched(), vec![job]);
        signals.finished(job);
        assert!(first.await.is_ok() && second.await.is_ok());
        assert!(signals.watched().is_empty());
    }
}
