//! `token-billing-tools`: the test and operations tools of token-billing,
//! kept out of the service binary and its image — the chaos run (which
//! recreates databases and restarts PostgreSQL), the load generators and
//! the fake provider. Results go to stdout, logs to stderr.

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
    /// PostgreSQL connection URL, for `chaos`, `bench reconciliation` and `bench history`
    /// (given before the command; the other tools use no database).
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
    /// Load generators against a running service.
    Bench {
        #[command(subcommand)]
        target: BenchCommand,
    },
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

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Job pipeline overhead beyond provider time.
    #[command(after_help = "Example:\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-tools bench jobs --jobs 500 --concurrency 8")]
    Jobs(token_billing_tools::bench::JobBenchArgs),
    /// Kiosk fleets: reserve→commit cycles (spread, hot) or jobs.
    Load(token_billing_tools::bench::load::LoadArgs),
    /// A flood of made-up keys from new addresses; the service's RSS before and after.
    #[command(
        after_help = "Example (the service started with TRUSTED_PROXIES=127.0.0.1/32):\n  \
        token-billing-tools bench auth-flood --requests 1000000 --service-pid $(pgrep -f 'token-billing serve')"
    )]
    AuthFlood(token_billing_tools::bench::flood::FloodArgs),
    /// The address throttle as an attacker meets it: guesses from many
    /// addresses, anonymous requests and kiosks at a venue's address.
    #[command(
        after_help = "Example (the service started with TRUSTED_PROXIES=127.0.0.1/32):\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-tools bench throttle-probe \\\n    \
        --seconds 60 --addresses 1000 --anonymous-per-second 60 --kiosks"
    )]
    ThrottleProbe(token_billing_tools::bench::throttle::ProbeArgs),
    /// Seed a scratch database (--database-url) and time reconciliation reports.
    Reconciliation(token_billing_tools::bench::ReconciliationBenchArgs),
    /// Build a long history through the engine on a scratch database
    /// (--database-url), then measure a service's history reads over it.
    #[command(after_help = "Example:\n  \
        token-billing-tools --database-url postgres://postgres@127.0.0.1:5432/tb_history \\\n    \
        bench history --entries 20000000 --accounts 10000\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-tools \\\n    \
        --database-url postgres://postgres@127.0.0.1:5432/tb_history \\\n    \
        bench history --skip-build --url http://127.0.0.1:8080")]
    History(token_billing_tools::bench::history::HistoryBenchArgs),
    /// A webhook receiver that answers 204 and counts (`GET /count`).
    #[command(after_help = "Example:\n  \
        token-billing-tools bench webhook-sink --bind 127.0.0.1:18099")]
    WebhookSink {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:18099")]
        bind: String,
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
        Tool::Bench {
            target: BenchCommand::Load(args),
        } => token_billing_tools::bench::load::run_load(args).await,
        Tool::Bench {
            target: BenchCommand::AuthFlood(args),
        } => token_billing_tools::bench::flood::run_flood(args).await,
        Tool::Bench {
            target: BenchCommand::ThrottleProbe(args),
        } => token_billing_tools::bench::throttle::run_probe(args).await,
        Tool::Bench {
            target: BenchCommand::Reconciliation(args),
        } => {
            let url = cli.database_url.clone();
            tokio::task::spawn_blocking(move || {
                token_billing_tools::bench::run_reconciliation_bench(&url, &args)
            })
            .await
            .map_err(anyhow::Error::from)
            .and_then(|result| result)
        }
        Tool::Bench {
            target: BenchCommand::History(args),
        } => {
            let url = cli.database_url.clone();
            let args = std::sync::Arc::new(args);
            let build = if args.skip_build {
                Ok(())
            } else {
                let (url, args) = (url.clone(), std::sync::Arc::clone(&args));
                tokio::task::spawn_blocking(move || {
                    token_billing_tools::bench::history::build(&url, &args)
                })
                .await
                .map_err(anyhow::Error::from)
                .and_then(|result| result)
            };
            match build {
                Ok(()) => token_billing_tools::bench::history::measure(&url, &args).await,
                Err(error) => Err(error),
            }
        }
        Tool::Bench {
            target: BenchCommand::WebhookSink { bind },
        } => token_billing_tools::bench::sink::run_sink(&bind).await,
        Tool::Bench {
            target: BenchCommand::Jobs(args),
        } => token_billing_tools::bench::run_job_bench(args).await,
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
