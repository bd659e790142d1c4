//! The tools' binary answers `--help` for each tool. (Being an integration
//! test of this package, it also makes `cargo test` build the binary that
//! the service's tests and the scripts run: `target/*/token-billing-tools`.)

use std::process::Command;

#[test]
fn every_tool_has_its_help_screen() {
    for args in [
        &["--help"][..],
        &["chaos", "--help"],
        &["fake-provider", "--help"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_token-billing-tools"))
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .expect("the tools' binary runs");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert!(
            help.contains("Usage: token-billing-tools"),
            "{args:?}:\n{help}"
        );
    }
    // A command that is not a tool fails; the load generators are
    // `token-billing-bench`'s (bench/).
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing-tools"))
        .arg("serve")
        .output()
        .expect("the tools' binary runs");
    assert!(!output.status.success(), "`token-billing-tools serve` runs");
    let output = Command::new(env!("CARGO_BIN_EXE_token-billing-tools"))
        .args(["bench", "load", "--help"])
        .output()
        .expect("the tools' binary runs");
    assert!(!output.status.success(), "`token-billing-tools bench` runs");
}
