//! The service binary's commands: `serve`, `migrate` and the management
//! commands, run from the parsed command line (`src/main.rs` only parses it
//! and calls [`run`]). A command's result (JSON) is printed alone on
//! stdout; logs go to stderr.

use std::process::ExitCode;
use std::time::Duration;

use diesel::prelude::*;

use crate::cli::{AccountCommand, ApiKeyCommand, Cli, Command};
use crate::config::Config;
use crate::db;
use crate::domain::{accounts, api_keys};
use crate::engine::{self, install::Installed, types};
use crate::provider::AnyProvider;
use crate::startup::{shutdown_signal, start_replica, AppState};
use crate::{secrets, telemetry};

/// Runs the command `cli` names (`serve` when it names none); its exit code.
pub async fn run(cli: Cli) -> ExitCode {
    secrets::register_connection_string(&cli.global.database_url);
    telemetry::init(cli.global.log_format);
    let database_url = cli.global.database_url.clone();
    let result = match cli.command {
        None | Some(Command::Serve(_)) => {
            let config = match cli.serve_config() {
                Ok(config) => config,
                Err(error) => crate::cli::exit_scrubbed(crate::cli::name_the_variable(
                    error,
                    &Cli::command_for_help(),
                )),
            };
            if let Some(read_url) = &config.database_read_url {
                secrets::register_connection_string(read_url);
            }
            if let Some(key) = &config.admin_api_key {
                secrets::register(secrecy::ExposeSecret::expose_secret(key));
            }
            if let Err(message) = config.validate() {
                eprintln!(
                    "token-billing: invalid configuration: {}",
                    secrets::scrub(&message)
                );
                return ExitCode::from(2);
            }
            serve(config).await
        }
        Some(Command::Migrate) => migrate_command(&database_url),
        Some(Command::Account { action }) => account_command(&database_url, action),
        Some(Command::ApiKey { action }) => api_key_command(&database_url, action),
        Some(Command::Reconcile {
            from,
            to,
            account,
            csv,
        }) => {
            return reconcile_command(&database_url, from.as_deref(), to.as_deref(), account, csv)
        }
        Some(Command::LedgerDigest { until, format }) => {
            ledger_digest_command(&database_url, &until, format)
        }
        Some(Command::Balances { as_of, csv }) => balances_command(&database_url, &as_of, csv),
        Some(Command::Credit(args)) => credit_command(&database_url, args),
        Some(Command::CloseDays) => close_days_command(&database_url),
        Some(Command::Prune {
            retention_idempotency_keys,
            retention_events,
            retention_webhook_attempts,
            retention_audit_events,
            archive_dir,
            batch,
            pause,
        }) => prune_command(
            &database_url,
            [
                retention_idempotency_keys,
                retention_events,
                retention_webhook_attempts,
                retention_audit_events,
            ],
            archive_dir,
            batch,
            pause,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("token-billing: {}", secrets::scrub(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

/// What `prepare_database` did.
struct Prepared {
    conn: PgConnection,
    created: bool,
    applied: Vec<String>,
    /// The money engine's schema, and whether it was installed now.
    engine: Installed,
}

/// Creates the database when missing, applies pending migrations (under an
/// advisory lock so replicas starting together migrate once) and installs
/// this build's money engine.
fn prepare_database(database_url: &str) -> anyhow::Result<Prepared> {
    let created = db::create_database_if_missing(database_url)?;
    if created {
        tracing::info!("created the database");
    }
    let mut conn = PgConnection::establish(database_url)
        .map_err(|error| anyhow::anyhow!("connecting to the database (DATABASE_URL): {error}"))?;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<diesel::sql_types::BigInt, _>(db::lock_keys::MIGRATE)
        .execute(&mut conn)?;
    let applied = db::run_migrations(&mut conn);
    diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(db::lock_keys::MIGRATE)
        .execute(&mut conn)?;
    let applied = applied?;
    for migration in &applied {
        tracing::info!(%migration, "applied migration");
    }
    let engine = engine::install::install(&mut conn)?;
    match engine {
        Installed::Created(schema) => tracing::info!(%schema, "installed the money engine"),
        Installed::Present(schema) => tracing::debug!(%schema, "the money engine is installed"),
    }
    Ok(Prepared {
        conn,
        created,
        applied,
        engine,
    })
}

/// A connection for a management command: to a migrated database, with
/// this build's engine installed.
fn connect(database_url: &str) -> anyhow::Result<PgConnection> {
    let mut conn = db::connect_prepared(database_url)?;
    engine::install::install(&mut conn)?;
    Ok(conn)
}

/// `migrate`: says what it did, on stderr for people and as JSON on stdout
/// (`{database, created, applied, engine, engine_installed, up_to_date}`),
/// also when there was nothing to do.
fn migrate_command(database_url: &str) -> anyhow::Result<()> {
    let prepared = prepare_database(database_url)?;
    let (name, _) = db::split_database_url(database_url)?;
    let total = db::migrations_total();
    let (engine, engine_installed) = match prepared.engine {
        Installed::Created(schema) => (schema, true),
        Installed::Present(schema) => (schema, false),
    };
    if prepared.applied.is_empty() && !engine_installed {
        tracing::info!(
            database = %name,
            "nothing to do: the database is up to date ({total} migrations already applied, \
             engine {engine} installed)"
        );
    } else {
        tracing::info!(
            database = %name,
            "{} the database; applied {} of {total} migrations; engine {engine} {}",
            if prepared.created { "created" } else { "migrated" },
            prepared.applied.len(),
            if engine_installed { "installed" } else { "already installed" }
        );
    }
    print_json(&serde_json::json!({
        "database": name,
        "created": prepared.created,
        "applied": prepared.applied,
        "engine": engine,
        "engine_installed": engine_installed,
        "up_to_date": true,
    }))
}

/// A loud start: without `ADMIN_API_KEY` and without any usable admin key
/// in the database, nobody can administer the service; say how to fix it.
fn warn_without_admin(conn: &mut PgConnection, bootstrap: bool) -> anyhow::Result<()> {
    if bootstrap {
        return Ok(());
    }
    if !api_keys::usable_admin_key_exists(conn)? {
        tracing::warn!(
            "no admin key: ADMIN_API_KEY is not set and the database holds no usable admin key, \
             so every /v1 call will be answered 401. Create one with \
             `token-billing api-key create --scope admin --label ops` (printed once), \
             or start with ADMIN_API_KEY set (at least 16 characters)"
        );
    }
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    for weakened in config.weakened_guards() {
        tracing::warn!("a guard is weakened: {weakened}");
    }
    let database_url = config.database_url.clone();
    let bootstrap = config.admin_api_key.is_some();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut prepared = prepare_database(&database_url)?;
        warn_without_admin(&mut prepared.conn, bootstrap)
    })
    .await??;
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

/// Prints the report; exit 0 when `ok`, 3 on `mismatch`, 1 on error.
fn reconcile_command(
    database_url: &str,
    from: Option<&str>,
    to: Option<&str>,
    account: Option<uuid::Uuid>,
    csv: bool,
) -> ExitCode {
    use crate::domain::reconciliation::{reconcile, report_period, to_csv};
    let result = (|| -> anyhow::Result<bool> {
        let (from, to) = report_period(from, to)?;
        let mut conn = connect(database_url)?;
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
            eprintln!("token-billing: {}", secrets::scrub(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Prints every account's balances at `as_of` (domain::history), a page
/// of accounts at a time, as JSON lines or CSV.
fn balances_command(database_url: &str, as_of: &str, csv: bool) -> anyhow::Result<()> {
    use crate::domain::history::{list_as_of, parse_as_of, BalancesAsOf};
    use std::io::Write;
    let as_of = parse_as_of(as_of, chrono::Utc::now())?;
    let mut conn = connect(database_url)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if csv {
        writeln!(out, "{}", BalancesAsOf::CSV_HEADER)?;
    }
    let mut after = None;
    loop {
        let page = list_as_of(&mut conn, as_of, after, 1_000)?;
        for line in &page.balances {
            if csv {
                writeln!(out, "{}", line.csv_line())?;
            } else {
                writeln!(out, "{}", serde_json::to_string(line)?)?;
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    out.flush()?;
    Ok(())
}

/// Closes every UTC day that has ended (domain::history::close_days) and
/// prints what it did as JSON.
fn close_days_command(database_url: &str) -> anyhow::Result<()> {
    use crate::domain::history::close_days;
    let mut conn = connect(database_url)?;
    let closed = close_days(&mut conn, chrono::Utc::now(), usize::MAX)?;
    println!("{}", serde_json::to_string(&closed)?);
    Ok(())
}

/// One retention pass now (crate::domain::retention), printed as JSON.
fn prune_command(
    database_url: &str,
    durations: [String; 4],
    archive_dir: Option<std::path::PathBuf>,
    batch: i64,
    pause: Duration,
) -> anyhow::Result<()> {
    use crate::domain::retention::{run_pass_exclusive, RetentionSettings};
    let parse = |text: &str| -> anyhow::Result<Option<std::time::Duration>> {
        let duration = humantime::parse_duration(text.trim())
            .map_err(|error| anyhow::anyhow!("{text:?} is not a duration such as 30d: {error}"))?;
        Ok((!duration.is_zero()).then_some(duration))
    };
    anyhow::ensure!(batch >= 1, "--batch must be at least 1");
    let settings = RetentionSettings {
        idempotency_keys: parse(&durations[0])?,
        events: parse(&durations[1])?,
        webhook_attempts: parse(&durations[2])?,
        audit_events: parse(&durations[3])?,
        archive_dir,
        batch,
        batches_max: usize::MAX,
        pause,
    };
    let mut conn = connect(database_url)?;
    match run_pass_exclusive(&mut conn, &settings, None)? {
        Some(report) => println!("{}", serde_json::to_string(&report)?),
        None => anyhow::bail!("another replica is running a retention pass; try again later"),
    }
    Ok(())
}

/// Prints the ledger's hash chain up to `until` (domain::ledger_digest).
fn ledger_digest_command(database_url: &str, until: &str, format: u8) -> anyhow::Result<()> {
    use crate::domain::ledger_digest::{ledger_digest, Format};
    let format = Format::parse(format).map_err(anyhow::Error::msg)?;
    let until = crate::time::instant_of("--until", until).map_err(anyhow::Error::msg)?;
    let mut conn = db::connect_prepared(database_url)?;
    let digest = ledger_digest(&mut conn, until, format)
        .map_err(|error| anyhow::anyhow!(cli_message(&error)))?;
    // On a terminal, indented for a person; anywhere else (a file, a pipe,
    // the nightly `>> digests.jsonl`) one line per digest: JSON Lines.
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        print_json(&digest)
    } else {
        println!("{}", serde_json::to_string(&digest)?);
        Ok(())
    }
}

fn account_command(database_url: &str, action: AccountCommand) -> anyhow::Result<()> {
    let mut conn = connect(database_url)?;
    match action {
        AccountCommand::Create {
            name,
            max_active_reservations,
        } => {
            let name =
                types::Name::try_from(name).map_err(|error| anyhow::anyhow!("--name: {error}"))?;
            let limit = accounts::parse_max_active_reservations(max_active_reservations)
                .map_err(|error| anyhow::anyhow!(cli_message(&error)))?;
            let row = accounts::create_account(&mut conn, &name, limit)?;
            print_json(&accounts::AccountView::from(row))
        }
        AccountCommand::List {
            q,
            status,
            after,
            limit,
        } => {
            let filter =
                accounts::AccountFilter::parse(after, Some(limit), q.as_deref(), status.as_deref())
                    .map_err(|error| anyhow::anyhow!(cli_message(&error)))?;
            print_json(&accounts::list_accounts(&mut conn, &filter)?)
        }
    }
}

fn api_key_command(database_url: &str, action: ApiKeyCommand) -> anyhow::Result<()> {
    let (scope, account, label, budget) = match action {
        ApiKeyCommand::Create {
            scope,
            account,
            label,
            budget_tokens,
            budget_period,
            budget_time_zone,
        } => {
            let budget = budget_tokens.zip(budget_period).map(|(tokens, period)| {
                crate::domain::key_budgets::BudgetSpec {
                    budget_tokens: tokens,
                    budget_period: period.into(),
                    budget_time_zone,
                    budget_low_percent: None,
                }
            });
            (scope, account, label, budget)
        }
        ApiKeyCommand::List {
            account,
            after,
            limit,
        } => {
            let mut conn = connect(database_url)?;
            let page = api_keys::list_api_keys(
                &mut conn,
                after.map(types::ApiKeyId),
                Some(limit),
                account.map(types::AccountId),
            )
            .map_err(|error| anyhow::anyhow!(cli_message(&error)))?;
            return print_json(&page);
        }
        ApiKeyCommand::Revoke { key_id } => {
            let mut conn = connect(database_url)?;
            let audit = crate::domain::audit::Audit::local();
            let revoked_at = api_keys::revoke_api_key(&mut conn, &audit, types::ApiKeyId(key_id))
                .map_err(|error| match error {
                crate::error::ApiError::NotFound(_) => anyhow::anyhow!(
                    "no key has the id {key_id} (`token-billing api-key list` shows them)"
                ),
                other => anyhow::anyhow!(cli_message(&other)),
            })?;
            return print_json(&serde_json::json!({
                "key_id": key_id,
                "revoked": true,
                "revoked_at": crate::time::rfc3339(revoked_at),
            }));
        }
    };
    let label =
        types::Label::try_from(label).map_err(|error| anyhow::anyhow!("--label: {error}"))?;
    let scope = api_keys::Scope::from(scope);
    match (scope, account) {
        (api_keys::Scope::Kiosk, None) => {
            anyhow::bail!(
                "--scope kiosk needs --account <ACCOUNT_ID>: a kiosk key is bound to one account"
            )
        }
        (api_keys::Scope::Admin | api_keys::Scope::Finance, Some(_)) => {
            anyhow::bail!("--account is only for --scope kiosk: admin and finance keys are not bound to an account")
        }
        _ => {}
    }
    let mut conn = connect(database_url)?;
    let key = api_keys::create_api_key(
        &mut conn,
        scope,
        account.map(types::AccountId),
        &label,
        budget.as_ref(),
    )
    .map_err(|error| match error {
        crate::error::ApiError::NotFound(_) => anyhow::anyhow!(
            "no account has the id given with --account (`token-billing account list` shows them)"
        ),
        other => anyhow::anyhow!(cli_message(&other)),
    })?;
    print_json(&key)
}

/// Credits an account through the money engine, as the API does (the same
/// rules, ledger entry, grant, event and audit event; actor `cli`):
/// idempotent by `external_ref`. Prints the credit as the API answers it,
/// and says on stderr when it was a replay.
fn credit_command(database_url: &str, args: crate::cli::CreditArgs) -> anyhow::Result<()> {
    use crate::engine::{Authority, Op, Operation, Replay};
    let crate::cli::CreditArgs {
        account,
        amount,
        external_ref,
        note,
        priority,
        expires_at,
        amount_paid,
        currency,
    } = args;
    let amount_paid = amount_paid
        .map(types::MinorUnits::try_from)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--amount-paid: {error}"))?;
    let currency = currency
        .map(types::Currency::try_from)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--currency: {error}"))?;
    let price = types::Price::of(amount_paid, currency).map_err(anyhow::Error::msg)?;
    let amount =
        types::Tokens::parse(amount).map_err(|error| anyhow::anyhow!("--amount: {error}"))?;
    let external_ref = types::ExternalRef::try_from(external_ref)
        .map_err(|error| anyhow::anyhow!("--external-ref: {error}"))?;
    let note = note
        .map(types::Note::try_from)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--note: {error}"))?;
    let priority = priority
        .map(types::Priority::try_from)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--priority: {error}"))?
        .unwrap_or_default();
    let expires_at = expires_at
        .map(types::GrantExpiry::try_from)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--{}", error.replace('_', "-")))?;
    let operation = Operation {
        account: types::AccountId(account),
        authority: Authority::Request {
            actor: crate::domain::audit::LOCAL_ACTOR.to_owned(),
            request_id: None,
            key: None,
        },
        op: Op::Credit {
            amount,
            external_ref,
            note,
            priority,
            expires_at,
            price,
        },
    };
    let mut conn = connect(database_url)?;
    let answer = engine::apply_one(&mut conn, operation.clone())
        .map_err(|error| anyhow::anyhow!(cli_message(&error)))?;
    let (credit, replay) = answer
        .into_credit(&operation)
        .map_err(|error| match error {
            crate::error::ApiError::NotFound(_) => anyhow::anyhow!(
            "no account has the id given with --account (`token-billing account list` shows them)"
        ),
            other => anyhow::anyhow!(cli_message(&other)),
        })?;
    if replay == Replay::Replayed {
        eprintln!(
            "token-billing: --external-ref was credited before with the same amount: nothing \
             changed, this is that credit"
        );
    }
    print_json(&credit)
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// An API error in the words of the command line: field names become
/// flags, and no HTTP path or status is mentioned.
fn cli_message(error: &crate::error::ApiError) -> String {
    let text = error.to_string();
    let text = text.strip_prefix("invalid request: ").unwrap_or(&text);
    ["max_active_reservations", "limit", "status", "q", "until"]
        .iter()
        .fold(text.to_owned(), |message, field| {
            let flag = format!("--{}", field.replace('_', "-"));
            message.replacen(&format!("{field} must"), &format!("{flag} must"), 1)
        })
}
