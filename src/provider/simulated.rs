//! The in-process provider: the fake backend without the network. A
//! dropped connection shows up as the connection error it would cause.

use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::fake::{FakeBackend, SubmitOutcome};
use super::{Provider, ProviderError, ProviderResult};

pub struct SimulatedProvider {
    backend: Arc<FakeBackend>,
}

impl SimulatedProvider {
    pub fn new(backend: Arc<FakeBackend>) -> SimulatedProvider {
        SimulatedProvider { backend }
    }

    pub fn backend(&self) -> &Arc<FakeBackend> {
        &self.backend
    }
}

impl Provider for SimulatedProvider {
    async fn submit(&self, job_id: Uuid, input: &Value) -> ProviderResult {
        match self.backend.submit(&job_id.to_string(), input) {
            SubmitOutcome::Accepted(prediction) => Ok(prediction),
            SubmitOutcome::Unavailable => Err(ProviderError::unavailable(
                "simulated provider answered 503",
            )),
            SubmitOutcome::DropConnection(_) => Err(ProviderError::unavailable(
                "simulated provider dropped the connection",
            )),
            // The worker's attempt deadline ends the wait.
            SubmitOutcome::Hang => std::future::pending().await,
        }
    }

    async fn fetch(&self, prediction_id: &str) -> ProviderResult {
        self.backend
            .fetch(prediction_id)
            .ok_or(ProviderError::NotFound)
    }
}
