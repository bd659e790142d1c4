//! A real webhook receiver for the tests: `tests/webhooks/receiver.py`, a
//! Python HTTP server on loopback verifying every delivery with the
//! `standardwebhooks` package from PyPI — an independent implementation of
//! the specification, sharing no code with the service.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The Python interpreter that has `standardwebhooks`: the system's when it
/// has it (CI installs it), else a virtual environment made once under the
/// target directory (`pip install standardwebhooks`, under a lock).
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let system = PathBuf::from("python3");
        let has_package = |python: &PathBuf| {
            Command::new(python)
                .args(["-c", "import standardwebhooks"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        if has_package(&system) {
            return system;
        }
        let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
            |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            PathBuf::from,
        );
        let venv = target.join("webhook-receiver-venv");
        std::fs::create_dir_all(&target).expect("target directory");
        let script = format!(
            "test -x {venv}/bin/python && {venv}/bin/python -c 'import standardwebhooks' || \
             {{ python3 -m venv {venv} && {venv}/bin/python -m pip install --quiet \
             --disable-pip-version-check standardwebhooks==1.1.0; }}",
            venv = venv.display()
        );
        let status = Command::new("flock")
            .arg(target.join("webhook-receiver-venv.lock"))
            .args(["sh", "-c", &script])
            .status()
            .expect("flock and sh run");
        assert!(
            status.success(),
            "could not install the test receiver's verifier: \
             python3 -m pip install standardwebhooks==1.1.0"
        );
        venv.join("bin/python")
    })
}

/// The receiver process; killed when dropped.
pub struct Receiver {
    child: Child,
    pub base: String,
    client: reqwest::Client,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    pub fn start() -> Receiver {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/receiver.py");
        let mut child = Command::new(python())
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("receiver starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("receiver prints its port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("receiver said {line:?}"));
        Receiver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        }
    }

    /// The URL of a hook path with its behaviour (`fail=2`, `status=410`, …).
    pub fn hook(&self, name: &str, query: &str) -> String {
        format!("{}/hook/{name}?{query}", self.base)
    }

    /// The secrets the receiver verifies every delivery with.
    pub async fn verify_with(&self, secrets: &[&str]) {
        let response = self
            .client
            .post(format!("{}/_control/secrets", self.base))
            .json(&json!({"secrets": secrets}))
            .send()
            .await
            .expect("receiver answers");
        assert!(response.status().is_success());
    }

    /// Every delivery so far, in arrival order.
    pub async fn received(&self) -> Vec<Value> {
        self.client
            .get(format!("{}/_control/received", self.base))
            .send()
            .await
            .expect("receiver answers")
            .json()
            .await
            .expect("json")
    }

    /// Polls until `check` accepts the deliveries (or panics after `limit`).
    pub async fn wait_for(
        &self,
        what: &str,
        limit: std::time::Duration,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let received = self.received().await;
            if check(&received) {
                return received;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; received: {received:#?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Whether a delivery verified with the secret (the receiver keys its
/// verdicts by the secret's last six characters).
pub fn verified_with(delivery: &Value, secret: &str) -> bool {
    delivery["verified"][&secret[secret.len() - 6..]] == json!(true)
}
