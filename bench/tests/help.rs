//! The load generators' binary answers `--help` for each of them. (Being an
//! integration test of this package, it also makes `cargo test` build the
//! binary that the scripts in `bench/` and the service's tests run:
//! `target/*/token-billing-bench`.)

use std::process::Command;

#[test]
fn every_load_generator_has_its_help_screen() {
    for args in [
        &["--help"][..],
        &["jobs", "--help"],
        &["load", "--help"],
        &["auth-flood", "--help"],
        &["throttle-probe", "--help"],
        &["reconciliation", "--help"],
        &["history", "--help"],
        &["webhook-sink", "--help"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_token-billing-bench"))
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .expect("the load generators' binary runs");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert!(
            help.contains("Usage: token-billing-bench"),
            "{args:?}:\n{help}"
        );
    }
    // What is not a load generator fails: the service's commands, the tools'.
    for command in ["serve", "chaos", "fake-provider"] {
        let output = Command::new(env!("CARGO_BIN_EXE_token-billing-bench"))
            .arg(command)
            .output()
            .expect("the load generators' binary runs");
        assert!(
            !output.status.success(),
            "`token-billing-bench {command}` runs"
        );
    }
}
