//! The real provider over HTTP: `POST {url}/predictions` with
//! `Idempotency-Key: <job_id>` and `{"input": params}`, then
//! `GET {url}/predictions/{id}` until `succeeded` or `failed`.
//! Timeouts, 5xx, 429 and connection errors are retryable; other 4xx are
//! the provider refusing the request.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{Prediction, PredictionStatus, Provider, ProviderError, ProviderResult};

pub struct HttpProvider {
    client: reqwest::Client,
    base_url: String,
}

#[derive(Deserialize)]
struct PredictionBody {
    id: String,
    status: String,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

impl HttpProvider {
    pub fn new(base_url: &str, timeout: Duration) -> anyhow::Result<HttpProvider> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(HttpProvider {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    async fn read(response: Result<reqwest::Response, reqwest::Error>) -> ProviderResult {
        let response = response.map_err(transport_error)?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Err(ProviderError::NotFound);
        }
        if status.is_server_error()
            || status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT
        {
            return Err(ProviderError::unavailable(format!(
                "provider answered {status}"
            )));
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ProviderError::Rejected(format!(
                "provider answered {status}: {}",
                truncate(&body)
            )));
        }
        // A connection dropped while the body is read is a transport error.
        let body = response.bytes().await.map_err(transport_error)?;
        let parsed: PredictionBody = serde_json::from_slice(&body).map_err(|error| {
            ProviderError::unavailable(format!("unreadable provider answer: {error}"))
        })?;
        let status = match parsed.status.as_str() {
            "succeeded" => PredictionStatus::Succeeded(parsed.output.unwrap_or(Value::Null)),
            "failed" | "canceled" => PredictionStatus::Failed(parsed.error.map_or_else(
                || "the provider reported a failure".to_owned(),
                |error| match error {
                    Value::String(text) => text,
                    other => other.to_string(),
                },
            )),
            _ => PredictionStatus::Pending,
        };
        Ok(Prediction {
            id: parsed.id,
            status,
        })
    }
}

/// A transport error, without the request's URL (`PROVIDER_URL` may carry
/// a credential in its query or userinfo).
fn transport_error(error: reqwest::Error) -> ProviderError {
    let error = error.without_url();
    if error.is_timeout() {
        ProviderError::timeout(format!("provider did not answer in time: {error}"))
    } else {
        ProviderError::unavailable(format!("provider unreachable: {error}"))
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(200).collect()
}

impl Provider for HttpProvider {
    async fn submit(&self, job_id: Uuid, input: &Value) -> ProviderResult {
        let response = self
            .client
            .post(format!("{}/predictions", self.base_url))
            .header("Idempotency-Key", job_id.to_string())
            .json(&json!({"input": input}))
            .send()
            .await;
        Self::read(response).await
    }

    async fn fetch(&self, prediction_id: &str) -> ProviderResult {
        let response = self
            .client
            .get(format!("{}/predictions/{prediction_id}", self.base_url))
            .send()
            .await;
        Self::read(response).await
    }
}
