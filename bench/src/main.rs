//! `token-billing-bench`: the load generators of token-billing's benchmarks
//! (the scripts in `bench/` run them), kept out of the service binary and
//! its image. Results go to stdout, logs to stderr.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use token_billing::config::{LogFormat, DEFAULT_DATABASE_URL};
use token_billing::telemetry;
use token_billing_bench::{flood, history, jobs, load, reconciliation, sink, throttle};

#[derive(Debug, Parser)]
#[command(
    name = "token-billing-bench",
    version,
    about = "Load generators of token-billing's benchmarks (bench/; not shipped in the service image)"
)]
struct Cli {
    /// PostgreSQL connection URL, for `reconciliation` and `history` (given
    /// before the command; the other load generators use no database).
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,

    /// Log format (logs go to stderr; `RUST_LOG` sets the filter).
    #[arg(long, env = "LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Job pipeline overhead beyond provider time.
    #[command(after_help = "Example:\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-bench jobs --jobs 500 --concurrency 8")]
    Jobs(jobs::JobBenchArgs),
    /// Kiosk fleets: reserve→commit cycles (spread, hot) or jobs.
    Load(load::LoadArgs),
    /// A flood of made-up keys from new addresses; the service's RSS before and after.
    #[command(
        after_help = "Example (the service started with TRUSTED_PROXIES=127.0.0.1/32):\n  \
        token-billing-bench auth-flood --requests 1000000 --service-pid $(pgrep -f 'token-billing serve')"
    )]
    AuthFlood(flood::FloodArgs),
    /// The address throttle as an attacker meets it: guesses from many
    /// addresses, anonymous requests and kiosks at a venue's address.
    #[command(
        after_help = "Example (the service started with TRUSTED_PROXIES=127.0.0.1/32):\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-bench throttle-probe \\\n    \
        --seconds 60 --addresses 1000 --anonymous-per-second 60 --kiosks"
    )]
    ThrottleProbe(throttle::ProbeArgs),
    /// Seed a scratch database (--database-url) and time reconciliation reports.
    Reconciliation(reconciliation::ReconciliationBenchArgs),
    /// Build a long history through the engine on a scratch database
    /// (--database-url), then measure a service's history reads over it.
    #[command(after_help = "Example:\n  \
        token-billing-bench --database-url postgres://postgres@127.0.0.1:5432/tb_history \\\n    \
        history --entries 20000000 --accounts 10000\n  \
        BENCH_ADMIN_KEY=dev-admin-key-change-me token-billing-bench \\\n    \
        --database-url postgres://postgres@127.0.0.1:5432/tb_history \\\n    \
        history --skip-build --url http://127.0.0.1:8080")]
    History(history::HistoryBenchArgs),
    /// A webhook receiver that answers 204 and counts (`GET /count`).
    #[command(after_help = "Example:\n  \
        token-billing-bench webhook-sink --bind 127.0.0.1:18099")]
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
    let url = cli.database_url;
    let result = match cli.command {
        Bench::Load(args) => load::run_load(args).await,
        Bench::AuthFlood(args) => flood::run_flood(args).await,
        Bench::ThrottleProbe(args) => throttle::run_probe(args).await,
        Bench::Reconciliation(args) => tokio::task::spawn_blocking(move || {
            reconciliation::run_reconciliation_bench(&url, &args)
        })
        .await
        .map_err(anyhow::Error::from)
        .and_then(|result| result),
        Bench::History(args) => {
            let args = Arc::new(args);
            let build = if args.skip_build {
                Ok(())
            } else {
                let (url, args) = (url.clone(), Arc::clone(&args));
                tokio::task::spawn_blocking(move || history::build(&url, &args))
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|result| result)
            };
            match build {
                Ok(()) => history::measure(&url, &args).await,
                Err(error) => Err(error),
            }
        }
        Bench::WebhookSink { bind } => sink::run_sink(&bind).await,
        Bench::Jobs(args) => jobs::run_job_bench(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "token-billing-bench: {}",
                token_billing::secrets::scrub(&format!("{error:#}"))
            );
            ExitCode::FAILURE
        }
    }
}
