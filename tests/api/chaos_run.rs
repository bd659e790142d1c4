//! The chaos run's own rules (`token-billing-tools chaos`): a restart
//! command that fails fails the run.

use std::process::{Command, Stdio};

use diesel::prelude::*;

use crate::helpers::server_url;

/// Drops the run's scratch database, however the test ends.
struct DropDatabase(String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&format!("{}/postgres", server_url())) {
            let _ = diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.0
            ))
            .execute(&mut admin);
        }
    }
}

/// A `--postgres-restart-command` that exits 1 (`false`: nothing is
/// restarted, the main cluster included) is a violation and the run exits
/// 1. Seed 1 draws a PostgreSQL restart as its first fault, 3–6 s in.
#[test]
fn a_failing_restart_command_fails_the_chaos_run() {
    let name = format!("tb_chaos_restart_fails_{}", std::process::id());
    let _dropper = DropDatabase(name.clone());
    let output = Command::new(crate::helpers::tools_binary())
        .args(["--database-url", &format!("{}/{name}", server_url())])
        .args(["chaos", "--seed", "1", "--seconds", "8"])
        .args(["--replicas", "1", "--kiosks", "2", "--accounts", "1"])
        .args(["--postgres-restart-command", "false"])
        .env("RUST_LOG", "error")
        .stderr(Stdio::null())
        .output()
        .expect("run the chaos run");
    let report = String::from_utf8_lossy(&output.stdout);
    let faults = report
        .lines()
        .find(|line| line.starts_with("faults: "))
        .unwrap_or_default();
    assert!(
        faults.contains(r#""postgres_restart": "#),
        "seed 1 no longer draws a restart first: pick another seed\n{report}"
    );
    assert!(
        report.contains("VIOLATION: the PostgreSQL restart command failed (exit status: 1)"),
        "{report}"
    );
    assert_eq!(output.status.code(), Some(1), "{report}");
}
