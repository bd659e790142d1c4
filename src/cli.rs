//! The command line: `serve` (default), `migrate`, `account create`,
//! `api-key create`. Every configuration variable has a `--flag` twin.

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::domain::api_keys::Scope;

#[derive(Debug, Parser)]
#[command(
    name = "token-billing",
    version,
    about = "Prepaid token billing for AI photo kiosks"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if missing, migrate, and serve the HTTP API (default).
    Serve,
    /// Create the database if missing and apply pending migrations.
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
    /// Print the finance reconciliation of a period; exits 3 on mismatch.
    Reconcile {
        /// Start of the period (RFC 3339, included); default: 30 days before `--to`.
        #[arg(long)]
        from: Option<String>,
        /// End of the period (RFC 3339, excluded); default: now.
        #[arg(long)]
        to: Option<String>,
        /// Only this account.
        #[arg(long)]
        account: Option<uuid::Uuid>,
        /// CSV instead of JSON.
        #[arg(long)]
        csv: bool,
    },
    /// Seeded fault run: replicas of this binary, the fake provider, a kiosk
    /// workload, SIGKILL / SIGSTOP / PostgreSQL restarts, then the books are
    /// checked (exit 1 on a violation). DATABASE_URL must name a scratch
    /// database `tb_chaos…`, which is recreated.
    Chaos(crate::chaos::ChaosArgs),
    /// Load generators against a running service.
    Bench {
        #[command(subcommand)]
        target: BenchCommand,
    },
    /// Serve the fake provider (the `http` protocol with fault injection).
    FakeProvider {
        #[arg(long, default_value = "127.0.0.1:9090")]
        bind: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Job pipeline overhead beyond provider time.
    Jobs(crate::bench::JobBenchArgs),
    /// Kiosk fleets: reserve→commit cycles (spread, hot) or jobs.
    Load(crate::bench::load::LoadArgs),
    /// Print the pgbench twin of a kiosk cycle (the service's own SQL).
    PgbenchScript,
    /// Seed a scratch database (DATABASE_URL) and time reconciliation reports.
    Reconciliation(crate::bench::ReconciliationBenchArgs),
}

#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Create an account; prints it as JSON.
    Create {
        #[arg(long)]
        name: String,
        /// 0 means unlimited.
        #[arg(long)]
        max_active_reservations: Option<i64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key; prints it as JSON. The key is shown this once only.
    Create {
        #[arg(long, value_enum)]
        scope: CliScope,
        /// The account a kiosk key is bound to.
        #[arg(long)]
        account: Option<uuid::Uuid>,
        #[arg(long, default_value = "created from the command line")]
        label: String,
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
