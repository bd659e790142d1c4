//! The command line of the service binary `token-billing`:
//!
//! - `serve` (the default): create the database if missing, migrate, serve;
//! - `migrate`: create the database if missing and migrate;
//! - `account create`, `account list`, `api-key create`, `api-key list`,
//!   `api-key revoke`, `credit`, `reconcile`, `balances`, `ledger-digest`:
//!   management commands on a database that `serve` or `migrate` prepared
//!   (they never create or migrate one themselves).
//!
//! Global options (`--database-url`, `--log-format`) are defined once here;
//! every setting of the running service has its `--flag` under `serve`
//! only. The test and operations tools (chaos run, fake provider) are
//! another binary, `token-billing-tools`; the benchmarks' load generators a
//! third, `token-billing-bench` (`bench/`).

pub mod commands;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{Config, LogFormat, DEFAULT_DATABASE_URL};
use crate::domain::api_keys::Scope;

#[derive(Debug, Parser)]
#[command(
    name = "token-billing",
    version,
    about = "Prepaid token billing for AI photo kiosks: the HTTP service and its management commands",
    after_help = "Examples:\n  \
        ADMIN_API_KEY=dev-admin-key-change-me token-billing serve\n  \
        token-billing migrate\n  \
        token-billing account create --name \"Wedding Müller\" | jq -r .account_id\n\n\
        Logs go to stderr; results (JSON) go alone to stdout."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options every command reads.
#[derive(Clone, Debug, Args)]
pub struct GlobalArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true, default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,

    /// Log format (logs go to stderr; `RUST_LOG` sets the filter).
    #[arg(long, env = "LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if missing, migrate it, and serve the HTTP API (the default).
    #[command(after_help = "Example:\n  \
        ADMIN_API_KEY=dev-admin-key-change-me token-billing serve --bind-addr 127.0.0.1:8080")]
    Serve(Box<ServeArgs>),
    /// Create the database if missing and apply pending migrations.
    #[command(after_help = "Example:\n  \
        token-billing --database-url postgres://postgres@localhost:5432/token_billing migrate")]
    Migrate,
    /// Manage accounts.
    Account {
        #[command(subcommand)]
        action: AccountCommand,
    },
    /// Manage API keys.
    ApiKey {
        #[command(subcommand)]
        action: ApiKeyCommand,
    },
    /// Print the finance reconciliation of a period as JSON (or CSV); exits 3 on mismatch.
    #[command(after_help = "Examples:\n  \
        token-billing reconcile | jq -r .status\n  \
        token-billing reconcile --from 2026-11-01 --to 2026-12-01 --csv > november.csv\n  \
        token-billing reconcile --from 2026-11-01T00:00:00+01:00 --to 2026-12-01T00:00:00+01:00\n\n\
        Amounts are tokens; a bare date is that day's midnight UTC. docs/finance.md explains the columns.")]
    Reconcile {
        /// Start of the period, included: YYYY-MM-DD (midnight UTC) or RFC 3339;
        /// default: 30 days before `--to`.
        #[arg(long)]
        from: Option<String>,
        /// End of the period, excluded: YYYY-MM-DD (midnight UTC) or RFC 3339;
        /// default: now.
        #[arg(long)]
        to: Option<String>,
        /// Only this account (its id).
        #[arg(long)]
        account: Option<uuid::Uuid>,
        /// CSV instead of JSON.
        #[arg(long)]
        csv: bool,
    },
    /// Credit tokens to an account (a top-up), as POST /v1/accounts/{id}/credits does:
    /// idempotent by --external-ref (the same command again changes nothing and prints
    /// the same credit).
    #[command(after_help = "Examples:\n  \
        token-billing credit --account <ACCOUNT_ID> --amount 500 --external-ref invoice-2026-0042\n  \
        token-billing credit --account <ACCOUNT_ID> --amount 100 --external-ref promo-12 \\\n    \
          --expires-at 2027-01-01 --priority 0 --note \"December promotion\"")]
    Credit(CreditArgs),
    /// Print every account's balances as the books stood at an instant, as
    /// JSON lines (or CSV): finance's month-end statement.
    #[command(after_help = "Examples:\n  \
        token-billing balances --as-of 2026-12-01 --csv > november-closing.csv\n  \
        token-billing balances --as-of 2026-11-30T23:59:59.999999Z | jq -c '{account_id, available}'\n\n\
        Entries written at the instant count; a bare date is its midnight UTC. docs/api.md explains `as_of`.")]
    Balances {
        /// The instant: RFC 3339, or YYYY-MM-DD (midnight UTC); not in the future.
        #[arg(long)]
        as_of: String,
        /// CSV instead of JSON lines.
        #[arg(long)]
        csv: bool,
    },
    /// Write the daily closing balances of every UTC day that has ended and is
    /// not closed yet (the service does this on RETENTION_SCHEDULE too).
    #[command(after_help = "Example:\n  token-billing close-days")]
    CloseDays,
    /// Run one retention pass now (RETENTION_* and ARCHIVE_DIR as for `serve`)
    /// and print what it pruned and archived as JSON.
    #[command(
        after_help = "Examples:\n  ARCHIVE_DIR=/var/lib/token-billing/archive RETENTION_EVENTS=90d token-billing prune\n  \
            token-billing prune --pause 500ms   # gentler on the kiosks during opening hours"
    )]
    Prune {
        /// How long idempotency keys are kept (humantime: `30d`, `12h`; `0` keeps them forever).
        #[arg(long, env = "RETENTION_IDEMPOTENCY_KEYS", default_value = "30d")]
        retention_idempotency_keys: String,
        /// How long events (the feed, webhooks' payloads) are kept; `0` keeps them forever.
        #[arg(long, env = "RETENTION_EVENTS", default_value = "90d")]
        retention_events: String,
        /// How long finished webhook deliveries and their attempts are kept; `0` keeps them
        /// forever.
        #[arg(long, env = "RETENTION_WEBHOOK_ATTEMPTS", default_value = "30d")]
        retention_webhook_attempts: String,
        /// How long audit events are kept; `0` (the default) keeps them forever.
        #[arg(long, env = "RETENTION_AUDIT_EVENTS", default_value = "0")]
        retention_audit_events: String,
        /// Where pruned rows are archived first (gzip JSON Lines under `<dir>/<table>/`);
        /// unset: no archive.
        #[arg(long, env = "ARCHIVE_DIR")]
        archive_dir: Option<std::path::PathBuf>,
        /// Rows per batch (one transaction each).
        #[arg(long, default_value_t = crate::config::RETENTION_BATCH_MAX)]
        batch: i64,
        /// The pause after a batch that deleted rows, before the next one (`100ms`, `1s`; `0`:
        /// none; at most 10s); overrides RETENTION_PAUSE.
        #[arg(
            long,
            visible_alias = "retention-pause",
            env = "RETENTION_PAUSE",
            default_value = crate::config::RETENTION_PAUSE_DEFAULT,
            value_parser = crate::config::parse_retention_pause
        )]
        pause: std::time::Duration,
    },
    /// Print the ledger's hash chain up to an instant as JSON `{digest, entries, until,
    /// last_entry_id, format}`: keep it, and compare it after a restore or in an audit.
    #[command(after_help = "Examples:\n  \
        token-billing ledger-digest --until 2026-12-01T14:03:00Z\n  \
        token-billing ledger-digest --until \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" | jq -r .digest\n  \
        token-billing ledger-digest --until 2026-12-01 --format 1\n\n\
        The chain and how to recompute it without this binary: docs/backup.md.")]
    LedgerDigest {
        /// The instant: RFC 3339, or a date (YYYY-MM-DD) as its midnight UTC. Every entry
        /// created at or before it is chained.
        #[arg(long)]
        until: String,
        /// 2: sha256-chain-v2, every column of each entry (the default). 1: sha256-chain-v1,
        /// to compare with a digest kept before format 2.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
        format: u8,
    },
}

/// The settings of a running service; each has an environment variable twin.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: Config,
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Create an account with no tokens; prints it as JSON.
    #[command(after_help = "Example:\n  \
        token-billing account create --name \"Wedding Müller\" | jq -r .account_id")]
    Create {
        /// The account's name (1–200 characters, no control characters).
        #[arg(long)]
        name: String,
        /// Held reservations allowed at once (0: unlimited; default 50: about two per booth for 20 booths).
        #[arg(long, allow_negative_numbers = true)]
        max_active_reservations: Option<i64>,
    },
    /// List accounts, oldest first, as JSON `{accounts, next_after}`.
    #[command(after_help = "Example:\n  \
        token-billing account list --q müller | jq -r '.accounts[] | [.account_id, .name] | @tsv'")]
    List {
        /// Only accounts whose name contains this text (case-insensitive).
        #[arg(long)]
        q: Option<String>,
        /// Only accounts in this status.
        #[arg(long, value_parser = ["active", "suspended"])]
        status: Option<String>,
        /// Start after this account id (the `next_after` of a previous page).
        #[arg(long)]
        after: Option<uuid::Uuid>,
        /// Most accounts printed (1–1000).
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key; prints it as JSON, with its secret `key` shown this once only.
    #[command(after_help = "Examples:\n  \
        token-billing api-key create --scope admin --label ops | jq -r .key\n  \
        token-billing api-key create --scope kiosk --account <ACCOUNT_ID> --label \"booth 1\"\n  \
        token-billing api-key create --scope kiosk --account <ACCOUNT_ID> --label \"booth 2\" \\\n    \
          --budget-tokens 200 --budget-period day --budget-time-zone Europe/Berlin")]
    Create {
        /// What the key may do: admin (everything), finance (read), kiosk (one account).
        #[arg(long, value_enum)]
        scope: CliScope,
        /// The account a kiosk key is bound to (kiosk keys only).
        #[arg(long)]
        account: Option<uuid::Uuid>,
        /// A note telling people what the key is for (1–200 characters).
        #[arg(long, default_value = "created from the command line")]
        label: String,
        /// A kiosk key's spending limit per --budget-period, 1–1,000,000,000
        /// tokens (docs/fleet.md); none by default.
        #[arg(long, requires = "budget_period")]
        budget_tokens: Option<i64>,
        /// The budget's period.
        #[arg(long, value_enum, requires = "budget_tokens")]
        budget_period: Option<CliBudgetPeriod>,
        /// The budget's time zone, an IANA name (default UTC).
        #[arg(long, requires = "budget_tokens")]
        budget_time_zone: Option<String>,
    },
    /// List keys in creation order as JSON `{keys, next_after}`, without their secrets.
    #[command(after_help = "Examples:\n  \
        token-billing api-key list | jq -r '.keys[] | [.key_id, .scope, .label, .revoked_at] | @tsv'\n  \
        token-billing api-key list --account <ACCOUNT_ID>")]
    List {
        /// Only the kiosk keys of this account.
        #[arg(long)]
        account: Option<uuid::Uuid>,
        /// Start after this key id (the `next_after` of a previous page).
        #[arg(long)]
        after: Option<uuid::Uuid>,
        /// Most keys printed (1–1000).
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Revoke a key: it stops working at once, on every replica. Revoking a revoked key
    /// again changes nothing.
    #[command(after_help = "Example:\n  token-billing api-key revoke <KEY_ID>")]
    Revoke {
        /// The key's id (`key_id` of `api-key list`).
        key_id: uuid::Uuid,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CliScope {
    Admin,
    Finance,
    Kiosk,
}

impl From<CliScope> for Scope {
    fn from(scope: CliScope) -> Scope {
        match scope {
            CliScope::Admin => Scope::Admin,
            CliScope::Finance => Scope::Finance,
            CliScope::Kiosk => Scope::Kiosk,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CliBudgetPeriod {
    Day,
    Week,
    Month,
    Total,
}

impl From<CliBudgetPeriod> for crate::domain::key_budgets::BudgetPeriod {
    fn from(period: CliBudgetPeriod) -> Self {
        match period {
            CliBudgetPeriod::Day => Self::Day,
            CliBudgetPeriod::Week => Self::Week,
            CliBudgetPeriod::Month => Self::Month,
            CliBudgetPeriod::Total => Self::Total,
        }
    }
}

impl Cli {
    /// Parses the process's arguments, exiting with clap's message on an
    /// error (and after `--help` / `--version`).
    pub fn parse_args() -> Cli {
        let command = Self::command_for_help();
        let matches = command
            .clone()
            .try_get_matches()
            .unwrap_or_else(|error| exit_scrubbed(name_the_variable(error, &command)));
        Cli::from_arg_matches(&matches)
            .unwrap_or_else(|error| exit_scrubbed(name_the_variable(error, &command)))
    }

    /// The command line with the global options documented once, in
    /// `token-billing --help`: each subcommand still accepts them (`account
    /// list --database-url …` works) but lists only its own options.
    pub fn command_for_help() -> clap::Command {
        let command = plain_env_markers(Cli::command());
        let globals: Vec<clap::Arg> = command
            .get_arguments()
            .filter(|argument| argument.is_global_set())
            .cloned()
            .collect();
        quiet_globals(command, &globals)
    }

    /// The service's configuration: the `serve` options (their defaults and
    /// environment variables when `serve` is implied) with the global ones.
    pub fn serve_config(&self) -> Result<Config, clap::Error> {
        let mut config = match &self.command {
            Some(Command::Serve(args)) => args.config.clone(),
            _ => {
                // `token-billing` alone serves: read the serve options from
                // the environment and their defaults.
                ServeOnly::try_parse_from(["token-billing"])?.config
            }
        };
        config.database_url.clone_from(&self.global.database_url);
        config.log_format = self.global.log_format;
        Ok(config)
    }
}

/// Prints a command-line error as clap would (`--help` and `--version` to
/// standard output, errors to standard error) and exits with clap's code,
/// with every secret masked ([`crate::secrets::scrub`]): clap repeats the
/// refused argument, which may be a connection string pasted in the wrong
/// place (`token-billing migrate postgres://user:secret@host/db`).
pub fn exit_scrubbed(error: clap::Error) -> ! {
    let rendered = crate::secrets::scrub(&error.render().to_string());
    if error.use_stderr() {
        eprint!("{rendered}");
    } else {
        print!("{rendered}");
    }
    std::process::exit(error.exit_code())
}

/// A refused value that came from the environment (not from a flag on the
/// command line) gets a tip naming the variable that was set: clap itself
/// names only the flag (`--db-pool-size <DB_POOL_SIZE>`).
pub fn name_the_variable(mut error: clap::Error, command: &clap::Command) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidArg).cloned() else {
        return error;
    };
    let Some(long) = invalid
        .split_whitespace()
        .next()
        .and_then(|flag| flag.strip_prefix("--"))
    else {
        return error;
    };
    let on_command_line = std::env::args().any(|argument| {
        argument == format!("--{long}") || argument.starts_with(&format!("--{long}="))
    });
    let variable = all_arguments(command)
        .into_iter()
        .find(|argument| argument.get_long() == Some(long))
        .and_then(|argument| {
            argument
                .get_env()
                .map(|env| env.to_string_lossy().into_owned())
        });
    if let Some(variable) =
        variable.filter(|variable| !on_command_line && std::env::var_os(variable).is_some())
    {
        error.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![format!(
                "the value comes from the environment variable {variable}: correct or unset it"
            )
            .into()]),
        );
    }
    error
}

fn all_arguments(command: &clap::Command) -> Vec<clap::Arg> {
    let mut arguments: Vec<clap::Arg> = command.get_arguments().cloned().collect();
    for subcommand in command.get_subcommands() {
        arguments.extend(all_arguments(subcommand));
    }
    arguments
}

/// Gives every subcommand (at any depth) a hidden copy of each global
/// option: clap then does not add the visible one, and the value still
/// reaches `GlobalArgs` (same id, still global).
/// Every option's environment variable shown as `[env: NAME]`, never with
/// its value: clap writes `[env: NAME=]` for a variable that is not set (a
/// bare marker that reads like a bug) and the value of one that is (which
/// may be a secret).
pub fn plain_env_markers(command: clap::Command) -> clap::Command {
    let mut command = command.mut_args(|argument| argument.hide_env_values(true));
    let names: Vec<String> = command
        .get_subcommands()
        .map(|subcommand| subcommand.get_name().to_owned())
        .collect();
    for name in names {
        command = command.mut_subcommand(name, plain_env_markers);
    }
    command
}

fn quiet_globals(mut command: clap::Command, globals: &[clap::Arg]) -> clap::Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|subcommand| subcommand.get_name().to_owned())
        .collect();
    for name in names {
        command = command.mut_subcommand(name, |mut subcommand| {
            for global in globals {
                let present = subcommand
                    .get_arguments()
                    .any(|argument| argument.get_id() == global.get_id());
                if !present {
                    subcommand = subcommand.arg(global.clone().hide(true));
                }
            }
            let note = "Global options (--database-url, --log-format): see `token-billing --help`.";
            let after = match subcommand.get_after_help() {
                Some(text) => format!("{text}\n\n{note}"),
                None => note.to_owned(),
            };
            quiet_globals(subcommand.after_help(after), globals)
        });
    }
    command
}

#[derive(Parser)]
struct ServeOnly {
    #[command(flatten)]
    config: Config,
}

/// `token-billing credit`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CreditArgs {
    /// The account to credit (its id).
    #[arg(long)]
    pub account: uuid::Uuid,
    /// Tokens to credit (1–1,000,000).
    #[arg(long)]
    pub amount: i64,
    /// Your reference for this credit (an invoice number), unique across all credits:
    /// the same reference again is the same credit.
    #[arg(long)]
    pub external_ref: String,
    /// A note for people reading the books.
    #[arg(long)]
    pub note: Option<String>,
    /// The grant's priority, 0–100 (0 is drawn first; default 50).
    #[arg(long)]
    pub priority: Option<i64>,
    /// When the credited tokens lapse: RFC 3339, or a date (YYYY-MM-DD) as its midnight
    /// UTC; default: never.
    #[arg(long)]
    pub expires_at: Option<String>,
    /// What the customer paid for these tokens, in minor units of --currency (cents;
    /// 0 for a promotional grant). With --currency, or neither (an unpriced grant).
    #[arg(long, requires = "currency")]
    pub amount_paid: Option<i64>,
    /// ISO 4217 code of --amount-paid (EUR, USD, …).
    #[arg(long, requires = "amount_paid")]
    pub currency: Option<String>,
}
