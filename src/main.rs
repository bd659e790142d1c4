//! `token-billing`: parse the command line, validate the configuration,
//! set up logging and the database, then serve or run a subcommand.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use diesel::prelude::*;

use token_billing::cli::{AccountCommand, ApiKeyCommand, BenchCommand, Cli, Command};
use token_billing::config::Config;
use token_billing::db;
use token_billing::domain::{accounts, api_keys, types};
use token_billing::provider::fake::FakeBackend;
use token_billing::provider::fake_server::build_fake_provider;
use token_billing::provider::AnyProvider;
use token_billing::startup::{start_replica, AppState};
use token_billing::telemetry;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = cli.config.validate() {
        eprintln!("token-billing: invalid configuration: {message}");
        return ExitCode::from(2);
    }
    telemetry::init(cli.config.log_format);
    if let Some(Command::Reconcile {
        from,
        to,
        account,
        csv,
    }) = &cli.command
    {
        return reconcile_command(&cli.config, from.as_deref(), to.as_deref(), *account, *csv);
    }
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve(cli.config).await,
        Command::Migrate => prepare_database(&cli.config).map(|_| ()),
        Command::Account { action } => account_command(&cli.config, action),
        Command::ApiKey { action } => api_key_command(&cli.config, action),
        Command::Reconcile { .. } => Ok(()),
        Command::Chaos(args) => {
            match token_billing::chaos::run(&cli.config.database_url, args).await {
                Ok(true) => Ok(()),
                Ok(false) => return ExitCode::FAILURE,
                Err(error) => Err(error),
            }
        }
        Command::Bench {
            target: BenchCommand::Load(args),
        } => token_billing::bench::load::run_load(args).await,
        Command::Bench {
            target: BenchCommand::Reconciliation(args),
        } => {
            let url = cli.config.database_url.clone();
            tokio::task::spawn_blocking(move || {
                token_billing::bench::run_reconciliation_bench(&url, &args)
            })
            .await
            .map_err(anyhow::Error::from)
            .and_then(|result| result)
        }
        Command::Bench {
            target: BenchCommand::PgbenchScript,
        } => {
            print!("{}", token_billing::bench::pgbench_script());
            Ok(())
        }
        Command::Bench {
            target: BenchCommand::Jobs(args),
        } => token_billing::bench::run_job_bench(args).await,
        Command::FakeProvider { bind } => fake_provider(&cli.config, &bind).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("token-billing: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Creates the database when missing and applies pending migrations, under
/// an advisory lock so replicas starting together migrate once.
fn prepare_database(config: &Config) -> anyhow::Result<PgConnection> {
    if db::create_database_if_missing(&config.database_url)? {
        tracing::info!("created the database");
    }
    let mut conn = PgConnection::establish(&config.database_url)
        .map_err(|error| anyhow::anyhow!("connecting to DATABASE_URL: {error}"))?;
    diesel::sql_query("SELECT pg_advisory_lock(7243001)").execute(&mut conn)?;
    let applied = db::run_migrations(&mut conn);
    diesel::sql_query("SELECT pg_advisory_unlock(7243001)").execute(&mut conn)?;
    for migration in applied? {
        tracing::info!(%migration, "applied migration");
    }
    Ok(conn)
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let database_config = config.clone();
    tokio::task::spawn_blocking(move || prepare_database(&database_config)).await??;
    let provider = AnyProvider::from_config(&config)?;
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let pool = db::build_pool(&config.database_url, config.db_pool_size);
    let state = AppState::new(config, pool).map_err(anyhow::Error::msg)?;
    let http_workers = std::thread::available_parallelism().map_or(2, usize::from);
    let mut replica = start_replica(state, provider, http_workers).await?;
    tracing::info!(address = %replica.address, "serving");
    let server_handle = replica.server.handle();
    let mut server = tokio::spawn(replica.server);
    tokio::select! {
        result = &mut server => {
            result??;
            return Ok(());
        }
        signal = shutdown_signal() => tracing::info!(signal, "shutting down: draining jobs"),
    }
    // Stop claiming, let running jobs finish within the grace period (what
    // does not finish is reclaimed by another replica after its lease),
    // keep answering HTTP meanwhile with /readyz at 503, then stop.
    replica.state.stop_accepting();
    if let Err(error) = replica.scheduler.shutdown().await {
        tracing::warn!(?error, "stopping the reaper schedule failed");
    }
    let drained = replica.background.stop(grace).await;
    if !drained {
        tracing::warn!("some jobs did not finish in time; their leases will expire and another replica takes them");
    }
    server_handle.stop(true).await;
    server.await??;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    }
}

async fn fake_provider(config: &Config, bind: &str) -> anyhow::Result<()> {
    let backend = Arc::new(FakeBackend::new(
        config.simulated_latency_ms,
        config.simulated_failure_rate,
    ));
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

/// Prints the report; exit 0 when `ok`, 3 on `mismatch`, 1 on error.
fn reconcile_command(
    config: &Config,
    from: Option<&str>,
    to: Option<&str>,
    account: Option<uuid::Uuid>,
    csv: bool,
) -> ExitCode {
    use token_billing::config::{RECONCILIATION_RANGE_DEFAULT, RECONCILIATION_RANGE_MAX};
    use token_billing::domain::reconciliation::{parse_period, reconcile, to_csv};
    let result = (|| -> anyhow::Result<bool> {
        let (from, to) = parse_period(
            from,
            to,
            chrono::Utc::now(),
            RECONCILIATION_RANGE_DEFAULT,
            RECONCILIATION_RANGE_MAX,
        )?;
        let mut conn = PgConnection::establish(&config.database_url)
            .map_err(|error| anyhow::anyhow!("connecting to DATABASE_URL: {error}"))?;
        let report = reconcile(&mut conn, from, to, account)?;
        if csv {
            print!("{}", to_csv(&report));
        } else {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Ok(report.status == "ok")
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(error) => {
            eprintln!("token-billing: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn account_command(config: &Config, action: AccountCommand) -> anyhow::Result<()> {
    let mut conn = prepare_database(config)?;
    match action {
        AccountCommand::Create {
            name,
            max_active_reservations,
        } => {
            let name = types::Name::try_from(name).map_err(anyhow::Error::msg)?;
            let limit = accounts::parse_max_active_reservations(max_active_reservations)?;
            let row = accounts::create_account(&mut conn, &name, limit)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&accounts::AccountView::from(row))?
            );
        }
    }
    Ok(())
}

fn api_key_command(config: &Config, action: ApiKeyCommand) -> anyhow::Result<()> {
    let mut conn = prepare_database(config)?;
    match action {
        ApiKeyCommand::Create {
            scope,
            account,
            label,
        } => {
            let label = types::Label::try_from(label).map_err(anyhow::Error::msg)?;
            let key = api_keys::create_api_key(
                &mut conn,
                scope.into(),
                account.map(types::AccountId),
                &label,
            )?;
            println!("{}", serde_json::to_string_pretty(&key)?);
        }
    }
    Ok(())
}
