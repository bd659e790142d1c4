//! Image-generation providers behind one trait, speaking an
//! async-predictions protocol: submit (idempotent on the job id), then poll
//! the prediction until it succeeds or fails.
//!
//! - `http`: a real provider over HTTP (`POST /predictions`,
//!   `GET /predictions/{id}`), `Idempotency-Key: <job_id>`;
//! - `simulated`: in-process, the default, so the service runs out of the box;
//! - `fake`: the shared fault-injection backend of `simulated` and of the
//!   stand-alone fake provider server of `token-billing-tools`
//!   (`tools/src/fake_provider.rs`).

pub mod fake;
pub mod http;
pub mod simulated;

use std::future::Future;

use serde_json::Value;
use uuid::Uuid;

/// Where a prediction stands.
#[derive(Clone, Debug, PartialEq)]
pub enum PredictionStatus {
    Pending,
    Succeeded(Value),
    Failed(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub id: String,
    pub status: PredictionStatus,
}

/// What went wrong talking to the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderError {
    /// Worth retrying (timeout, 5xx, connection): `code` is what the kiosk
    /// sees if the retries run out (`provider_timeout`, `provider_unavailable`).
    Retryable { code: &'static str, message: String },
    /// The provider refused the request itself (4xx): retrying cannot help.
    Rejected(String),
    /// The provider does not know this prediction id.
    NotFound,
}

impl ProviderError {
    pub fn timeout(message: impl Into<String>) -> ProviderError {
        ProviderError::Retryable {
            code: "provider_timeout",
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ProviderError {
        ProviderError::Retryable {
            code: "provider_unavailable",
            message: message.into(),
        }
    }

    /// A label for metrics and logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            ProviderError::Retryable { code, .. } => code,
            ProviderError::Rejected(_) => "rejected",
            ProviderError::NotFound => "not_found",
        }
    }
}

pub type ProviderResult = Result<Prediction, ProviderError>;

/// The provider protocol. `submit` must be idempotent on `job_id`.
pub trait Provider: Send + Sync + 'static {
    fn submit(&self, job_id: Uuid, input: &Value) -> impl Future<Output = ProviderResult> + Send;
    fn fetch(&self, prediction_id: &str) -> impl Future<Output = ProviderResult> + Send;
}

/// The configured provider.
pub enum AnyProvider {
    Simulated(simulated::SimulatedProvider),
    Http(http::HttpProvider),
}

impl Provider for AnyProvider {
    async fn submit(&self, job_id: Uuid, input: &Value) -> ProviderResult {
        match self {
            AnyProvider::Simulated(provider) => provider.submit(job_id, input).await,
            AnyProvider::Http(provider) => provider.submit(job_id, input).await,
        }
    }

    async fn fetch(&self, prediction_id: &str) -> ProviderResult {
        match self {
            AnyProvider::Simulated(provider) => provider.fetch(prediction_id).await,
            AnyProvider::Http(provider) => provider.fetch(prediction_id).await,
        }
    }
}

impl AnyProvider {
    pub fn from_config(config: &crate::config::Config) -> anyhow::Result<AnyProvider> {
        Ok(match config.provider {
            crate::config::ProviderKind::Simulated => AnyProvider::Simulated(
                simulated::SimulatedProvider::new(std::sync::Arc::new(fake::FakeBackend::new(
                    config.simulated_latency_ms,
                    config.simulated_failure_rate,
                ))),
            ),
            crate::config::ProviderKind::Http => {
                let url = config
                    .provider_url
                    .clone()
                    .ok_or_else(|| anyhow::anyhow!("PROVIDER=http needs PROVIDER_URL"))?;
                AnyProvider::Http(http::HttpProvider::new(&url, config.provider_timeout())?)
            }
        })
    }
}
