//! Job workers: up to `WORKER_CONCURRENCY` jobs at once per replica. One
//! claimer per replica claims as many due jobs as it has idle worker slots
//! in one `engine_claim_jobs` call (`FOR UPDATE SKIP LOCKED`, fenced
//! leases) and hands each to a worker task. One heartbeat ticker per
//! replica extends the leases of all its in-flight jobs at half the lease,
//! in one `engine_heartbeat_jobs` call, and their reservations once their
//! expiry comes within half the TTL (or two leases); a job whose
//! lease or reservation it finds lost is cancelled. Each worker runs one
//! provider attempt and finishes with a fenced write: success commits the
//! tokens, a retryable error requeues with backoff (tokens stay reserved),
//! a final failure releases them. A worker that lost its lease writes
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, timeout, Instant, MissedTickBehavior};
use uuid::Uuid;

use crate::coalesce::Coalescer;
use crate::config::{
    Config, GAUGE_REFRESH, JOB_RETRY_BACKOFF_MAX_MS, JOB_WATCH_POLL, PROVIDER_POLL_INITIAL,
    PROVIDER_POLL_MAX, WORKER_IDLE_POLL,
};
use crate::db::models::JobRow;
use crate::db::states::JobStatus;
use crate::db::DbPool;
use crate::domain::job_leases::{self, Fenced, JobError};
use crate::domain::jobs::terminal_among;
use crate::error::ApiError;
use crate::job_watch::JobSignals;
use crate::metrics::Metrics;
use crate::provider::{
    AnyProvider, Prediction, PredictionStatus, Provider, ProviderError, ProviderResult,
};
use crate::rate_limit::KeyRateLimiter;

/// Everything a worker needs.
pub struct WorkerContext {
    pub pool: DbPool,
    /// Only its lag is read here (`token_billing_read_replica_lag_seconds`).
    pub read_replica: Option<Arc<crate::db::read_replica::ReadReplica>>,
    pub config: Config,
    pub provider: Arc<AnyProvider>,
    pub signals: Arc<JobSignals>,
    pub metrics: Arc<Metrics>,
    pub rate_limiter: Arc<KeyRateLimiter>,
    pub auth_guard: Arc<crate::rate_limit::AuthFailureGuard>,
    /// Identifies this replica in `lease_owner`.
    pub replica: String,
    /// The group commit of spending requests; workers send their finishes
    /// through it too.
    pub coalescer: Arc<Coalescer>,
}

/// Background tasks of one replica: workers and the job-watch poller.
pub struct Background {
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Background {
    /// Asks every task to stop without waiting (for contexts that cannot
    /// await, such as `Drop`).
    pub fn signal_stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Stops claiming and waits up to `grace` for running jobs. Returns
    /// whether every task finished; unfinished jobs are reclaimed by another
    /// replica once their lease expires.
    pub async fn stop(self, grace: Duration) -> bool {
        let _ = self.shutdown.send(true);
        let deadline = Instant::now() + grace;
        let mut all_finished = true;
        for task in self.tasks {
            let abort = task.abort_handle();
            if timeout(deadline.saturating_duration_since(Instant::now()), task)
                .await
                .is_err()
            {
                abort.abort();
                all_finished = false;
            }
        }
        all_finished
    }
}

/// Starts the workers, the job-watch poller, the gauges and webhook
/// delivery (the relay and `WEBHOOK_CONCURRENCY` senders).
pub fn start(context: Arc<WorkerContext>) -> Background {
    let (shutdown, receiver) = watch::channel(false);
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    if context.config.worker_concurrency > 0 {
        tasks.push(tokio::spawn(run_jobs(
            Arc::clone(&context),
            receiver.clone(),
        )));
    }
    tasks.push(tokio::spawn(watch_waiters(
        Arc::clone(&context),
        receiver.clone(),
    )));
    // The settings were checked when the configuration was validated.
    match context.config.webhook_settings().map(|settings| {
        crate::webhooks::delivery::start(
            context.pool.clone(),
            Arc::clone(&context.metrics),
            settings,
            &receiver,
        )
    }) {
        Ok(Ok(webhook_tasks)) => tasks.extend(webhook_tasks),
        Ok(Err(error)) => tracing::error!(?error, "webhook delivery could not start"),
        Err(error) => tracing::error!(%error, "webhook delivery could not start"),
    }
    tasks.push(tokio::spawn(refresh_gauges(Arc::clone(&context), receiver)));
    Background { shutdown, tasks }
}

/// Runs `work` with a pooled connection on the blocking pool.
async fn blocking<T, F>(pool: &DbPool, work: F) -> Result<T, ApiError>
where
    F: FnOnce(&mut diesel::PgConnection) -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let pool = pool.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = pool.get()?;
        work(&mut conn)
    })
    .await
    .map_err(|error| ApiError::Internal(format!("blocking task failed: {error}")))?
}

/// Refreshes the database-derived gauges every `GAUGE_REFRESH` (one query).
async fn refresh_gauges(context: Arc<WorkerContext>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let metrics = Arc::clone(&context.metrics);
        if let Err(error) = blocking(&context.pool, move |conn| {
            metrics.refresh_database_gauges(conn)
        })
        .await
        {
            tracing::warn!(?error, "refreshing gauges failed");
        }
        if let Some(replica) = &context.read_replica {
            let lag = blocking(replica.pool(), crate::db::read_replica::replay_lag_seconds).await;
            // -1: the replica cannot be asked (its reads go to the primary).
            context
                .metrics
                .read_replica_lag_seconds
                .set(lag.unwrap_or(-1.0));
        }
        context.rate_limiter.forget_idle();
        context.auth_guard.forget_idle();
        tokio::select! {
            _ = shutdown.changed() => return,
            () = sleep(GAUGE_REFRESH) => {}
        }
    }
}

/// Wakes parked `wait_seconds` clients whose job another replica finished.
async fn watch_waiters(context: Arc<WorkerContext>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            () = sleep(JOB_WATCH_POLL) => {}
        }
        let watched = context.signals.watched();
        if watched.is_empty() {
            continue;
        }
        match blocking(&context.pool, move |conn| terminal_among(conn, &watched)).await {
            Ok(done) => done
                .into_iter()
                .for_each(|job| context.signals.finished(job)),
            Err(error) => tracing::warn!(?error, "checking waited-for jobs failed"),
        }
    }
}

/// How one provider attempt ended.
enum Attempt {
    Succeeded(Prediction, serde_json::Value),
    Failed(JobError),
    Retryable(JobError),
    /// The lease or the reservation was lost while working.
    Lost(Fenced),
}

/// The jobs this replica is working on, with how to tell each one's worker
/// that its lease or reservation was lost. The heartbeat ticker reads it.
#[derive(Default)]
struct InFlight {
    jobs: Mutex<HashMap<(Uuid, i64), oneshot::Sender<Fenced>>>,
}

impl InFlight {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<(Uuid, i64), oneshot::Sender<Fenced>>> {
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a job held under `token`; the receiver hears if it is lost.
    fn register(&self, job: Uuid, token: i64) -> oneshot::Receiver<Fenced> {
        let (sender, receiver) = oneshot::channel();
        self.jobs().insert((job, token), sender);
        receiver
    }

    fn remove(&self, job: Uuid, token: i64) {
        self.jobs().remove(&(job, token));
    }

    fn snapshot(&self) -> Vec<(Uuid, i64)> {
        self.jobs().keys().copied().collect()
    }

    /// Tells the job's worker (if it still holds `token`) what was lost.
    fn lost(&self, job: Uuid, token: i64, fenced: Fenced) {
        if let Some(sender) = self.jobs().remove(&(job, token)) {
            let _ = sender.send(fenced);
        }
    }
}

/// Removes a job from [`InFlight`] when its worker is done with it.
struct Registered<'a> {
    in_flight: &'a InFlight,
    job: Uuid,
    token: i64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.in_flight.remove(self.job, self.token);
    }
}

/// The replica's claimer: claims up to as many due jobs as there are idle
/// worker slots (`WORKER_CONCURRENCY`) in one call, runs each in a worker
/// task, and keeps the heartbeat ticker going while any runs. On shutdown
/// it stops claiming and waits for its running jobs.
async fn run_jobs(context: Arc<WorkerContext>, mut shutdown: watch::Receiver<bool>) {
    let config = &context.config;
    let (lease_seconds, max_attempts) = (config.job_lease_seconds, config.job_max_attempts);
    let slots = Arc::new(Semaphore::new(
        usize::try_from(config.worker_concurrency).unwrap_or(1),
    ));
    let in_flight = Arc::new(InFlight::default());
    // Dropped (and so aborted) with this task.
    let mut ticker = JoinSet::new();
    ticker.spawn(heartbeat_ticker(
        Arc::clone(&context),
        Arc::clone(&in_flight),
    ));
    let mut running = JoinSet::new();
    let owner = format!("{}/jobs", context.replica);
    loop {
        while running.try_join_next().is_some() {}
        if *shutdown.borrow() {
            break;
        }
        let first = tokio::select! {
            _ = shutdown.changed() => continue,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let mut permits = vec![first];
        while let Ok(permit) = Arc::clone(&slots).try_acquire_owned() {
            permits.push(permit);
        }
        let limit = i32::try_from(permits.len()).unwrap_or(i32::MAX);
        let claimer = owner.clone();
        let claimed = blocking(&context.pool, move |conn| {
            job_leases::claim_jobs(conn, &claimer, lease_seconds, max_attempts, limit)
        })
        .await;
        let idle = match claimed {
            Ok(jobs) => {
                let drained = jobs.len() < permits.len();
                for (claimed, permit) in jobs.into_iter().zip(permits.drain(..)) {
                    let worker = Worker {
                        context: Arc::clone(&context),
                        in_flight: Arc::clone(&in_flight),
                    };
                    running.spawn(async move {
                        worker.process(claimed).await;
                        drop(permit);
                    });
                }
                drained
            }
            Err(error) => {
                tracing::warn!(?error, "claiming jobs failed; retrying");
                true
            }
        };
        drop(permits);
        if idle {
            tokio::select! {
                _ = shutdown.changed() => {}
                () = context.signals.queued.notified() => {}
                () = sleep(WORKER_IDLE_POLL) => {}
            }
        }
    }
    while running.join_next().await.is_some() {}
}

/// One heartbeat per replica every half lease, for all its in-flight jobs
/// in one transaction; a job found lost is cancelled by its worker.
async fn heartbeat_ticker(context: Arc<WorkerContext>, in_flight: Arc<InFlight>) {
    let (lease, ttl) = (
        context.config.job_lease_seconds,
        context.config.reservation_ttl_seconds,
    );
    let mut ticks = tokio::time::interval(context.config.lease() / 2);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let jobs = in_flight.snapshot();
        if jobs.is_empty() {
            continue;
        }
        let answers = blocking(&context.pool, move |conn| {
            job_leases::heartbeat_many(conn, &jobs, lease, ttl)
        })
        .await;
        match answers {
            Ok(answers) => answers
                .into_iter()
                .filter(|(_, _, fenced)| *fenced != Fenced::Done)
                .for_each(|(job, token, fenced)| in_flight.lost(job, token, fenced)),
            Err(error) => tracing::warn!(?error, "heartbeat failed; retrying at the next tick"),
        }
    }
}

struct Worker {
    context: Arc<WorkerContext>,
    in_flight: Arc<InFlight>,
}

impl Worker {
    async fn process(&self, claimed: job_leases::Claimed) {
        let job_leases::Claimed {
            job,
            reservation_outlasts_lease,
            over_limit,
            last_attempt,
        } = claimed;
        let started = Instant::now();
        let token = job.lease_token;
        // A reservation that may not outlast the first half lease is checked
        // and extended before the provider is called; one that does is
        // extended by the heartbeats, the first of them at half the lease.
        let first_heartbeat = if reservation_outlasts_lease {
            Ok(Fenced::Done)
        } else {
            self.heartbeat(&job).await
        };
        match first_heartbeat {
            Ok(Fenced::Done) => {}
            Ok(Fenced::LeaseLost) => return,
            Ok(Fenced::ReservationLost) => {
                // The engine failed the job in the same transaction
                // (engine_fail_unreserved_jobs): nothing is left to write.
                record_finished(&self.context.metrics, &job, JobStatus::Failed);
                self.context.signals.finished(job.id);
                return;
            }
            Err(error) => {
                tracing::warn!(job_id = %job.id, ?error, "first heartbeat failed; the lease will expire");
                return;
            }
        }
        let attempt = if over_limit {
            self.exhausted(&job).await
        } else {
            let lost = self.in_flight.register(job.id, token);
            let _registered = Registered {
                in_flight: &self.in_flight,
                job: job.id,
                token,
            };
            tokio::select! {
                attempt = self.attempt(&job) => attempt,
                Ok(lost) = lost => Attempt::Lost(lost),
            }
        };
        let outcome = match attempt {
            Attempt::Succeeded(prediction, output) => {
                let result = json!({"output": output, "provider_job_id": prediction.id});
                self.finish(&job, Ok(&result)).await
            }
            Attempt::Failed(error) => Ok(self.finish_failure(&job, error).await),
            Attempt::Retryable(error) if !last_attempt => {
                let delay_ms = backoff_ms(self.context.config.job_retry_backoff_ms, job.attempts);
                let ttl = self.context.config.reservation_ttl_seconds;
                let job_ref = job.clone();
                let result = blocking(&self.context.pool, move |conn| {
                    job_leases::retry_later(conn, &job_ref, token, &error, delay_ms, ttl)
                })
                .await;
                tracing::info!(job_id = %job.id, attempts = job.attempts, delay_ms, "provider attempt failed; retrying later");
                return log_fenced(&job, result);
            }
            Attempt::Retryable(error) => Ok(self.finish_failure(&job, error).await),
            Attempt::Lost(Fenced::ReservationLost) => {
                // Failed by the engine with the heartbeat that found it out.
                record_finished(&self.context.metrics, &job, JobStatus::Failed);
                Ok(Fenced::ReservationLost)
            }
            Attempt::Lost(fenced) => Ok(fenced),
        };
        log_fenced(&job, outcome);
        self.context.signals.finished(job.id);
        tracing::debug!(job_id = %job.id, elapsed_ms = started.elapsed().as_millis() as u64, "job processed");
    }

    /// The job's final status, fenced on its lease token, through the
    /// coalescer: the finish joins the batch of the requests around it (one
    /// transaction, one WAL flush for all of them).
    async fn finish(
        &self,
        job: &JobRow,
        outcome: Result<&Value, &JobError>,
    ) -> Result<Fenced, ApiError> {
        let status = if outcome.is_ok() {
            JobStatus::Succeeded
        } else {
            JobStatus::Failed
        };
        let operation = job_leases::finish_operation(job, job.lease_token, outcome);
        let (_, answer) = self.context.coalescer.submit(operation).await;
        let finish = job_leases::finished(answer?)?;
        record_finish(&self.context.metrics, job, &finish, status);
        Ok(finish.fenced)
    }

    async fn finish_failure(&self, job: &JobRow, error: JobError) -> Fenced {
        let result = self.finish(job, Err(&error)).await;
        result.unwrap_or_else(|error| {
            tracing::error!(job_id = %job.id, ?error, "recording a job failure failed; the lease will expire");
            Fenced::LeaseLost
        })
    }

    async fn heartbeat(&self, job: &JobRow) -> Result<Fenced, ApiError> {
        let (id, token) = (job.id, job.lease_token);
        let (lease, ttl) = (
            self.context.config.job_lease_seconds,
            self.context.config.reservation_ttl_seconds,
        );
        blocking(&self.context.pool, move |conn| {
            job_leases::heartbeat(conn, id, token, lease, ttl)
        })
        .await
    }

    /// A job reclaimed more often than `JOB_MAX_ATTEMPTS` (its workers kept
    /// dying): take the provider's result if it has one, else fail.
    async fn exhausted(&self, job: &JobRow) -> Attempt {
        if let Some(prediction_id) = &job.provider_job_id {
            if let Ok(prediction) = self
                .observed(self.context.provider.fetch(prediction_id))
                .await
            {
                if let PredictionStatus::Succeeded(output) = prediction.status.clone() {
                    return Attempt::Succeeded(prediction, output);
                }
            }
        }
        Attempt::Failed(JobError::new(
            "attempts_exhausted",
            "the job was attempted too many times",
        ))
    }

    /// One provider attempt, bounded by `PROVIDER_TIMEOUT_SECONDS`. A job
    /// that already has a provider id asks the provider about it first.
    async fn attempt(&self, job: &JobRow) -> Attempt {
        let deadline = self.context.config.provider_timeout();
        match timeout(deadline, self.generate(job)).await {
            Ok(attempt) => attempt,
            Err(_) => Attempt::Retryable(JobError::new(
                "provider_timeout",
                format!(
                    "the provider did not finish within {} s",
                    deadline.as_secs()
                ),
            )),
        }
    }

    /// Times one provider request and counts its outcome.
    async fn observed(
        &self,
        request: impl std::future::Future<Output = ProviderResult>,
    ) -> ProviderResult {
        let started = Instant::now();
        let result = request.await;
        let metrics = &self.context.metrics;
        metrics
            .provider_request_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        let outcome = result
            .as_ref()
            .map_or_else(ProviderError::outcome, |_| "ok");
        metrics
            .provider_requests_total
            .with_label_values(&[outcome])
            .inc();
        result
    }

    async fn generate(&self, job: &JobRow) -> Attempt {
        let provider = &self.context.provider;
        let known = match &job.provider_job_id {
            Some(prediction_id) => match self.observed(provider.fetch(prediction_id)).await {
                Ok(prediction) => Some(prediction),
                Err(ProviderError::NotFound) => None,
                Err(error) => return provider_error(job, error),
            },
            None => None,
        };
        let mut prediction = match known {
            Some(prediction) => prediction,
            None => match self.observed(provider.submit(job.id, &job.params)).await {
                // Already finished: the finishing transaction follows at
                // once and a reclaim would resubmit under the same
                // Idempotency-Key, so there is nothing to remember.
                Ok(prediction) if prediction.status != PredictionStatus::Pending => prediction,
                Ok(prediction) => {
                    let (id, token, prediction_id) =
                        (job.id, job.lease_token, prediction.id.clone());
                    let recorded = blocking(&self.context.pool, move |conn| {
                        job_leases::record_provider_job_id(conn, id, token, &prediction_id)
                    })
                    .await;
                    match recorded {
                        Ok(Fenced::Done) => {}
                        Ok(lost) => return Attempt::Lost(lost),
                        Err(error) => {
                            tracing::warn!(job_id = %job.id, ?error, "recording the provider id failed")
                        }
                    }
                    prediction
                }
                Err(error) => return provider_error(job, error),
            },
        };
        let mut poll = PROVIDER_POLL_INITIAL;
        loop {
            match prediction.status.clone() {
                PredictionStatus::Succeeded(output) => {
                    return Attempt::Succeeded(prediction, output)
                }
                PredictionStatus::Failed(detail) => {
                    return Attempt::Failed(kiosk_visible(job, "provider_failed", &detail))
                }
                PredictionStatus::Pending => {}
            }
            sleep(poll).await;
            poll = (poll * 5 / 4).min(PROVIDER_POLL_MAX);
            prediction = match self.observed(provider.fetch(&prediction.id)).await {
                Ok(prediction) => prediction,
                Err(error) => return provider_error(job, error),
            };
        }
    }
}

/// Counts a job that reached a terminal status (inside the committing closure).
/// Counts a fenced finish (inside the blocking closure, after its commit):
/// the job's final status and the tokens its reservation moved.
fn record_finish(metrics: &Metrics, job: &JobRow, finish: &job_leases::Finish, status: JobStatus) {
    match finish.fenced {
        Fenced::Done => record_finished(metrics, job, status),
        Fenced::ReservationLost => record_finished(metrics, job, JobStatus::Failed),
        Fenced::LeaseLost => return,
    }
    if let Some(reservation) = &finish.resolved {
        metrics.resolved(reservation);
    }
}

fn record_finished(metrics: &Metrics, job: &JobRow, status: JobStatus) {
    metrics
        .jobs_total
        .with_label_values(&[status.as_str()])
        .inc();
    let elapsed = chrono::Utc::now().signed_duration_since(job.created_at);
    metrics
        .job_duration_seconds
        .observe(elapsed.num_milliseconds().max(0) as f64 / 1000.0);
}

fn provider_error(job: &JobRow, error: ProviderError) -> Attempt {
    match error {
        ProviderError::Retryable { code, message } => {
            Attempt::Retryable(kiosk_visible(job, code, &message))
        }
        ProviderError::Rejected(message) => {
            Attempt::Failed(kiosk_visible(job, "provider_rejected", &message))
        }
        ProviderError::NotFound => Attempt::Retryable(kiosk_visible(
            job,
            "provider_unavailable",
            "the provider lost the prediction",
        )),
    }
}

/// The error a kiosk reads (the job's `error`, `job.failed`): the code, in
/// the service's own words. The provider's words (`detail`: its answers,
/// the transport's errors, which may name its URL) go to the admins' log
/// only.
fn kiosk_visible(job: &JobRow, code: &'static str, detail: &str) -> JobError {
    tracing::warn!(job_id = %job.id, code, detail, "provider attempt failed");
    JobError::new(code, kiosk_message(code))
}

/// The service's words for each provider failure code.
fn kiosk_message(code: &str) -> &'static str {
    match code {
        "provider_timeout" => "the image provider did not answer in time",
        "provider_rejected" => "the image provider refused this request",
        "provider_failed" => "the image provider could not generate this request",
        _ => "the image provider could not be reached",
    }
}

/// Exponential backoff: `base × 2^(attempt-1)`, capped.
pub fn backoff_ms(base_ms: u64, attempt: i32) -> u64 {
    let exponent = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(20);
    base_ms
        .saturating_mul(1 << exponent)
        .min(JOB_RETRY_BACKOFF_MAX_MS)
}

fn log_fenced(job: &JobRow, outcome: Result<Fenced, ApiError>) {
    match outcome {
        Ok(Fenced::Done) => {}
        Ok(Fenced::LeaseLost) => {
            tracing::warn!(job_id = %job.id, "lease lost: another worker owns this job now")
        }
        Ok(Fenced::ReservationLost) => {
            tracing::warn!(job_id = %job.id, "reservation expired under the job")
        }
        Err(error) => {
            tracing::error!(job_id = %job.id, ?error, "finishing a job failed; the lease will expire")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::backoff_ms;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff_ms(1_000, 1), 1_000);
        assert_eq!(backoff_ms(1_000, 3), 4_000);
        assert_eq!(backoff_ms(1_000, 40), 60_000);
    }
}
