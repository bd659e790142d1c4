//! Job workers: `WORKER_CONCURRENCY` tokio tasks per replica. Each claims a
//! due job (`FOR UPDATE SKIP LOCKED`, fenced lease), heartbeats at half the
//! lease (extending the lease and the reservation), runs one provider
//! attempt, and finishes with a fenced write: success commits the tokens,
//! a retryable error requeues with backoff (tokens stay reserved), a final
//! failure releases them. A worker that lost its lease writes nothing.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use crate::config::{
    Config, GAUGE_REFRESH, JOB_RETRY_BACKOFF_MAX_MS, JOB_WATCH_POLL, PROVIDER_POLL_INITIAL,
    PROVIDER_POLL_MAX, WORKER_IDLE_POLL,
};
use crate::db::models::JobRow;
use crate::db::DbPool;
use crate::domain::job_leases::{self, Fenced, JobError};
use crate::domain::jobs::terminal_among;
use crate::domain::states::JobStatus;
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
    let mut tasks: Vec<JoinHandle<()>> = (0..context.config.worker_concurrency)
        .map(|index| {
            let worker = Worker {
                context: Arc::clone(&context),
                owner: format!("{}/w{index}", context.replica),
                shutdown: receiver.clone(),
            };
            tokio::spawn(worker.run())
        })
        .collect();
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

struct Worker {
    context: Arc<WorkerContext>,
    owner: String,
    shutdown: watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self) {
        let config = &self.context.config;
        let lease_seconds = config.job_lease_seconds;
        let max_attempts = config.job_max_attempts;
        loop {
            if *self.shutdown.borrow() {
                return;
            }
            let owner = self.owner.clone();
            let claimed = blocking(&self.context.pool, move |conn| {
                job_leases::claim_next_checked(conn, &owner, lease_seconds, max_attempts)
            })
            .await;
            match claimed {
                Ok(Some(claimed)) => self.process(claimed).await,
                Ok(None) => {
                    tokio::select! {
                        _ = self.shutdown.changed() => {}
                        () = self.context.signals.queued.notified() => {}
                        () = sleep(WORKER_IDLE_POLL) => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(?error, "claiming a job failed; retrying");
                    tokio::select! {
                        _ = self.shutdown.changed() => {}
                        () = sleep(WORKER_IDLE_POLL) => {}
                    }
                }
            }
        }
    }

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
            tokio::select! {
                attempt = self.attempt(&job) => attempt,
                lost = self.heartbeat_until_lost(&job) => Attempt::Lost(lost),
            }
        };
        let outcome = match attempt {
            Attempt::Succeeded(prediction, output) => {
                let result = json!({"output": output, "provider_job_id": prediction.id});
                let (job_ref, metrics) = (job.clone(), Arc::clone(&self.context.metrics));
                blocking(&self.context.pool, move |conn| {
                    let finish = job_leases::finish_success(conn, &job_ref, token, &result)?;
                    record_finish(&metrics, &job_ref, &finish, JobStatus::Succeeded);
                    Ok(finish.fenced)
                })
                .await
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

    async fn finish_failure(&self, job: &JobRow, error: JobError) -> Fenced {
        let (job_ref, token) = (job.clone(), job.lease_token);
        let metrics = Arc::clone(&self.context.metrics);
        let result = blocking(&self.context.pool, move |conn| {
            let finish = job_leases::finish_failure(conn, &job_ref, token, &error)?;
            record_finish(&metrics, &job_ref, &finish, JobStatus::Failed);
            Ok(finish.fenced)
        })
        .await;
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

    /// Heartbeats at half the lease; returns only when the lease or the
    /// reservation is lost.
    async fn heartbeat_until_lost(&self, job: &JobRow) -> Fenced {
        let interval = self.context.config.lease() / 2;
        loop {
            sleep(interval).await;
            match self.heartbeat(job).await {
                Ok(Fenced::Done) => {}
                Ok(lost) => return lost,
                Err(error) => {
                    tracing::warn!(job_id = %job.id, ?error, "heartbeat failed; retrying")
                }
            }
        }
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
                Err(error) => return provider_error(error),
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
                Err(error) => return provider_error(error),
            },
        };
        let mut poll = PROVIDER_POLL_INITIAL;
        loop {
            match prediction.status.clone() {
                PredictionStatus::Succeeded(output) => {
                    return Attempt::Succeeded(prediction, output)
                }
                PredictionStatus::Failed(message) => {
                    return Attempt::Failed(JobError::new("provider_failed", message))
                }
                PredictionStatus::Pending => {}
            }
            sleep(poll).await;
            poll = (poll * 5 / 4).min(PROVIDER_POLL_MAX);
            prediction = match self.observed(provider.fetch(&prediction.id)).await {
                Ok(prediction) => prediction,
                Err(error) => return provider_error(error),
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

fn provider_error(error: ProviderError) -> Attempt {
    match error {
        ProviderError::Retryable { code, message } => {
            Attempt::Retryable(JobError::new(code, message))
        }
        ProviderError::Rejected(message) => {
            Attempt::Failed(JobError::new("provider_rejected", message))
        }
        ProviderError::NotFound => Attempt::Retryable(JobError::new(
            "provider_unavailable",
            "the provider lost the prediction",
        )),
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
