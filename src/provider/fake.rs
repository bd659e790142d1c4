//! The fault-injecting fake provider: one in-memory backend behind both the
//! in-process `simulated` provider and the `fake-provider` HTTP server.
//!
//! A request's `params.simulate` object chooses the behaviour:
//! `{"delay_ms": n, "outcome": "succeed" | "fail" | "error_5xx" | "hang" |
//! "drop_after_success", "fail_times": n}`. Without it, a prediction
//! succeeds after a random delay around the configured latency (or fails at
//! the configured rate). Submissions are idempotent on the job id, and the
//! backend counts generations per job, so tests can prove "one generation".

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};

use super::{Prediction, PredictionStatus};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Succeed,
    Fail,
    Error5xx,
    Hang,
    DropAfterSuccess,
}

#[derive(Clone, Copy, Debug)]
struct Simulation {
    delay: Duration,
    behaviour: Behaviour,
    fail_times: u64,
}

/// What a submission gets.
#[derive(Clone, Debug, PartialEq)]
pub enum SubmitOutcome {
    Accepted(Prediction),
    /// Answer 5xx; nothing was created.
    Unavailable,
    /// Never answer.
    Hang,
    /// The prediction was created (and succeeds) but the answer is lost.
    DropConnection(Prediction),
}

struct Stored {
    id: String,
    ready_at: Instant,
    outcome: Result<Value, String>,
}

#[derive(Default)]
struct State {
    by_key: HashMap<String, String>,
    predictions: HashMap<String, Stored>,
    submissions: HashMap<String, u64>,
    generations: HashMap<String, u64>,
}

pub struct FakeBackend {
    latency_ms: u64,
    failure_rate: f64,
    state: Mutex<State>,
}

impl FakeBackend {
    pub fn new(latency_ms: u64, failure_rate: f64) -> FakeBackend {
        FakeBackend {
            latency_ms,
            failure_rate,
            state: Mutex::new(State::default()),
        }
    }

    fn simulation(&self, input: &Value) -> Simulation {
        let simulate = input.get("simulate");
        let field = |name: &str| simulate.and_then(|s| s.get(name));
        let mut rng = rand::thread_rng();
        let delay_ms = field("delay_ms")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| {
                // ±50 % around the configured latency.
                let half = self.latency_ms / 2;
                rng.gen_range(self.latency_ms - half..=self.latency_ms + half)
            });
        let behaviour = match field("outcome").and_then(Value::as_str) {
            Some("fail") => Behaviour::Fail,
            Some("error_5xx") => Behaviour::Error5xx,
            Some("hang") => Behaviour::Hang,
            Some("drop_after_success") => Behaviour::DropAfterSuccess,
            Some(_) => Behaviour::Succeed,
            None if self.failure_rate > 0.0 && rng.gen_bool(self.failure_rate) => Behaviour::Fail,
            None => Behaviour::Succeed,
        };
        let fail_times = field("fail_times").and_then(Value::as_u64).unwrap_or(0);
        Simulation {
            delay: Duration::from_millis(delay_ms.min(3_600_000)),
            behaviour,
            fail_times,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // in a way that matters to a fake; keep serving.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Submits `input` under `key` (the job id).
    pub fn submit(&self, key: &str, input: &Value) -> SubmitOutcome {
        let simulation = self.simulation(input);
        let mut state = self.lock();
        let attempt = {
            let count = state.submissions.entry(key.to_owned()).or_insert(0);
            *count += 1;
            *count
        };
        if let Some(id) = state.by_key.get(key).cloned() {
            if let Some(prediction) = state.predictions.get(&id).map(view) {
                return SubmitOutcome::Accepted(prediction);
            }
        }
        match simulation.behaviour {
            Behaviour::Error5xx => return SubmitOutcome::Unavailable,
            _ if attempt <= simulation.fail_times => return SubmitOutcome::Unavailable,
            Behaviour::Hang => return SubmitOutcome::Hang,
            _ => {}
        }
        let id = format!("pred_{}", uuid::Uuid::new_v4().simple());
        let outcome = match simulation.behaviour {
            Behaviour::Fail => {
                Err("the provider could not generate this image (simulated)".to_owned())
            }
            _ => Ok(json!(format!("fake-provider://outputs/{id}.png"))),
        };
        let stored = Stored {
            id: id.clone(),
            ready_at: Instant::now() + simulation.delay,
            outcome,
        };
        let prediction = view(&stored);
        state.predictions.insert(id.clone(), stored);
        state.by_key.insert(key.to_owned(), id);
        *state.generations.entry(key.to_owned()).or_insert(0) += 1;
        if simulation.behaviour == Behaviour::DropAfterSuccess {
            SubmitOutcome::DropConnection(prediction)
        } else {
            SubmitOutcome::Accepted(prediction)
        }
    }

    pub fn fetch(&self, id: &str) -> Option<Prediction> {
        self.lock().predictions.get(id).map(view)
    }

    /// Predictions created for this key (job id): 1 means one generation.
    pub fn generations(&self, key: &str) -> u64 {
        self.lock().generations.get(key).copied().unwrap_or(0)
    }

    /// Submissions received for this key, including refused ones.
    pub fn submissions(&self, key: &str) -> u64 {
        self.lock().submissions.get(key).copied().unwrap_or(0)
    }

    pub fn total_generations(&self) -> u64 {
        self.lock().generations.values().sum()
    }

    pub fn stats(&self) -> Value {
        let state = self.lock();
        json!({
            "generations": state.generations.values().sum::<u64>(),
            "submissions": state.submissions.values().sum::<u64>(),
            "keys": state.by_key.len(),
        })
    }
}

fn view(stored: &Stored) -> Prediction {
    let status = if Instant::now() < stored.ready_at {
        PredictionStatus::Pending
    } else {
        match &stored.outcome {
            Ok(output) => PredictionStatus::Succeeded(output.clone()),
            Err(message) => PredictionStatus::Failed(message.clone()),
        }
    };
    Prediction {
        id: stored.id.clone(),
        status,
    }
}

/// The protocol's JSON form of a prediction.
pub fn prediction_json(prediction: &Prediction) -> Value {
    match &prediction.status {
        PredictionStatus::Pending => json!({"id": prediction.id, "status": "processing"}),
        PredictionStatus::Succeeded(output) => {
            json!({"id": prediction.id, "status": "succeeded", "output": output})
        }
        PredictionStatus::Failed(error) => {
            json!({"id": prediction.id, "status": "failed", "error": error})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submissions_are_idempotent_and_counted() {
        let backend = FakeBackend::new(0, 0.0);
        let input = json!({"simulate": {"delay_ms": 0}});
        let first = backend.submit("job-1", &input);
        let second = backend.submit("job-1", &input);
        assert_eq!(first, second);
        assert_eq!(
            (backend.generations("job-1"), backend.submissions("job-1")),
            (1, 2)
        );
    }

    #[test]
    fn fail_times_then_success() {
        let backend = FakeBackend::new(0, 0.0);
        let input = json!({"simulate": {"delay_ms": 0, "fail_times": 2}});
        assert_eq!(backend.submit("k", &input), SubmitOutcome::Unavailable);
        assert_eq!(backend.submit("k", &input), SubmitOutcome::Unavailable);
        let SubmitOutcome::Accepted(prediction) = backend.submit("k", &input) else {
            panic!("third submission is accepted");
        };
        assert!(matches!(prediction.status, PredictionStatus::Succeeded(_)));
        assert_eq!(backend.generations("k"), 1);
    }

    #[test]
    fn drop_after_success_creates_the_prediction() {
        let backend = FakeBackend::new(0, 0.0);
        let input = json!({"simulate": {"delay_ms": 0, "outcome": "drop_after_success"}});
        assert!(matches!(
            backend.submit("k", &input),
            SubmitOutcome::DropConnection(_)
        ));
        assert!(matches!(
            backend.submit("k", &input),
            SubmitOutcome::Accepted(_)
        ));
        assert_eq!(backend.generations("k"), 1);
        let hang = json!({"simulate": {"outcome": "hang"}});
        assert_eq!(backend.submit("h", &hang), SubmitOutcome::Hang);
        let fail = json!({"simulate": {"outcome": "fail", "delay_ms": 0}});
        let SubmitOutcome::Accepted(prediction) = backend.submit("f", &fail) else {
            panic!("accepted")
        };
        assert!(matches!(prediction.status, PredictionStatus::Failed(_)));
    }
}
