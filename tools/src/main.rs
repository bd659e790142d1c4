//! `token-billing-tools`: the test and operations tools of token-billing,
//! kept out of the service binary and its image — the chaos run (which
//! recreates databases and restarts PostgreSQL) and the fake provider. The
//! load generators are `token-billing-bench` (bench/). Results go to
//! stdout, logs to stderr.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use token_billing::config::{LogFormat, DEFAULT_DATABASE_URL};
use token_billing::provider::fake::FakeBackend;
use token_billing::startup::shutdown_signal;
use token_billing::telemetry;
use token_billing_tools::fake_provider::build_fake_provider;

#[derive(Debug, Parser)]
#[command(
    name = "token-billing-tools",
    version,
    about = "Test and operations tools of token-billing (not shipped in the service image)"
)]
struct Cli {
    /// PostgreSQL connection URL, for `chaos` (given before the command; the
    /// fake provider uses no database).
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,

    /// Log format (logs go to stderr; `RUST_LOG` sets the filter).
    #[arg(long, env = "LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Tool,
}

#[derive(Debug, Subcommand)]
enum Tool {
    /// Seeded fault run: replicas of `token-billing`, the fake provider, a
    /// kiosk workload, SIGKILL / SIGSTOP / PostgreSQL restarts, then the books
    /// are checked (exit 1 on a violation). The database must be a scratch
    /// one named `tb_chaos…`: it is recreated.
    #[command(after_help = "Example:\n  \
        token-billing-tools --database-url postgres://postgres@127.0.0.1:5432/tb_chaos \\\n    \
        chaos --seed 42 --seconds 60 --restart-postgres --skewed-clock")]
    Chaos(token_billing_tools::chaos::ChaosArgs),
    /// Serve the fake provider (the `http` provider protocol, with fault injection).
    #[command(after_help = "Example:\n  \
        token-billing-tools fake-provider --bind 127.0.0.1:8090")]
    FakeProvider {
        /// Address to listen on (not 9090: compose gives that to Prometheus).
        #[arg(long, default_value = token_billing_tools::fake_provider::DEFAULT_BIND)]
        bind: String,
        /// Mean latency of a generation, in milliseconds (±50 %).
        #[arg(long, env = "SIMULATED_LATENCY_MS", default_value_t = 500)]
        latency_ms: u64,
        /// Share of generations that fail (0.0 … 1.0).
        #[arg(long, env = "SIMULATED_FAILURE_RATE", default_value_t = 0.0)]
        failure_rate: f64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    token_billing::secrets::register_environment();
    token_billing::secrets::install_panic_hook();
    let cli = token_billing::cli::plain_env_markers(<Cli as clap::CommandFactory>::command())
        .try_get_matches()
        .and_then(|matches| <Cli as clap::FromArgMatches>::from_arg_matches(&matches))
        .unwrap_or_else(|error| token_billing::cli::exit_scrubbed(error));
    token_billing::secrets::register_connection_string(&cli.database_url);
    telemetry::init(cli.log_format);
    let result = match cli.command {
        // On SIGINT / SIGTERM the run is dropped: its replicas (each in its
        // own process group) are killed by the cluster's guard.
        Tool::Chaos(args) => tokio::select! {
            outcome = token_billing_tools::chaos::run(&cli.database_url, args) => match outcome {
                Ok(true) => Ok(()),
                Ok(false) => return ExitCode::FAILURE,
                Err(error) => Err(error),
            },
            signal = shutdown_signal() => Err(anyhow::anyhow!("chaos run stopped by {signal}")),
        },
        Tool::FakeProvider {
            bind,
            latency_ms,
            failure_rate,
        } => fake_provider(&bind, latency_ms, failure_rate).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "token-billing-tools: {}",
                token_billing::secrets::scrub(&format!("{error:#}"))
            );
            ExitCode::FAILURE
        }
    }
}

async fn fake_provider(bind: &str, latency_ms: u64, failure_rate: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&failure_rate),
        "--failure-rate must be between 0.0 and 1.0"
    );
    let backend = Arc::new(FakeBackend::new(latency_ms, failure_rate));
    let (server, address) = build_fake_provider(bind, backend)?;
    tracing::info!(%address, "fake provider serving");
    let handle = server.handle();
    let server = tokio::spawn(server);
    let signal = shutdown_signal().await;
    tracing::info!(signal, "fake provider stopping");
    handle.stop(true).await;
    server.await??;
    Ok(())
}
