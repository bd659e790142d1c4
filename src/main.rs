//! `token-billing`, the service binary: parse the command line and run
//! the command (`token_billing::cli::commands`: set up logging on stderr and
//! the database, then serve or run a management command whose result,
//! JSON, is printed alone on stdout). The test and operations tools are
//! another binary, `token-billing-tools`, the load generators a third,
//! `token-billing-bench`.

use std::process::ExitCode;

use token_billing::cli::Cli;
use token_billing::secrets;

#[tokio::main]
async fn main() -> ExitCode {
    // Before anything can print: the passwords to mask (see `secrets`).
    secrets::register_environment();
    secrets::install_panic_hook();
    let cli = Cli::parse_args();
    token_billing::cli::commands::run(cli).await
}
