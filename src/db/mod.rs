//! Connection pool, embedded migrations and `run_blocking`, the one way the
//! async handlers reach the (blocking) database.

pub mod models;
pub mod prepared;
pub mod schema;
pub mod states;

pub use prepared::{prepared, PreparedSql};

use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

/// `DATABASE_URL` checks are the configuration's (`crate::config`).
pub use crate::config::{check_multi_host, conninfo_pairs, database_hosts, redact_database_url};
use crate::config::{DB_CHECKOUT_TIMEOUT, DB_STATEMENT_TIMEOUT_MS};
use crate::error::ApiError;

mod failover;
pub mod read_replica;

pub use failover::{connection_lost, lost_on_this_thread, FailoverAwareManager, IDLE_CHECK};

pub type DbPool = Pool<FailoverAwareManager>;

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// The schema of this build's money engine (`build.rs`, `engine::install`):
/// on every connection's `search_path`, after `public` (where the tables and
/// diesel's bookkeeping live, and no engine function does), so each build
/// calls its own engine's functions while another build's run beside them.
pub const ENGINE_SCHEMA: &str = env!("TOKEN_BILLING_ENGINE_SCHEMA");

/// Sets per-session limits on every new pooled connection, so no statement
/// or lock wait can hold a connection (and the rows it locked) forever, and
/// puts this build's engine schema on its `search_path`.
#[derive(Debug)]
struct SessionLimits;

impl CustomizeConnection<PgConnection, diesel::r2d2::Error> for SessionLimits {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        set_session(conn).map_err(diesel::r2d2::Error::QueryError)
    }
}

/// The session settings of every connection (see [`SessionLimits`]).
///
/// JIT is off: PostgreSQL compiles a statement whose estimated cost is
/// high, and the ones that reach it here (the history reads over every
/// account: reconciliation, `as_of` of the list) spent longer compiling
/// than compiled code saved them (BENCHMARKS.md, "History at scale").
pub fn set_session(conn: &mut PgConnection) -> QueryResult<()> {
    conn.batch_execute(&format!(
        "SET statement_timeout = {DB_STATEMENT_TIMEOUT_MS}; \
         SET idle_in_transaction_session_timeout = {DB_STATEMENT_TIMEOUT_MS}; \
         SET jit = off; \
         SET TIME ZONE 'UTC'; \
         SET search_path TO public, {ENGINE_SCHEMA}"
    ))
}

/// One connection outside the pool, set up like the pool's.
pub fn connect_session(database_url: &str) -> anyhow::Result<PgConnection> {
    let mut conn = PgConnection::establish(database_url).map_err(|error| {
        anyhow::anyhow!(
            "connecting to {}: {error}",
            redact_database_url(database_url)
        )
    })?;
    set_session(&mut conn)?;
    Ok(conn)
}

/// Builds the pool without connecting: a bad `DATABASE_URL` must not block
/// start-up for 30 s; it shows up at the first checkout as a 503.
///
/// `database_url` may list several hosts
/// (`postgres://u@h1,h2/db?target_session_attrs=read-write`): every new
/// connection goes to whichever of them is the primary then. After a
/// connection is found dead (the primary went away), the manager discards
/// it and checks the other idle ones before handing them out, so the pool
/// moves to the new primary by itself (see `failover`).
pub fn build_pool(database_url: &str, size: u32) -> DbPool {
    build_pool_with(database_url, size, DB_CHECKOUT_TIMEOUT)
}

/// [`build_pool`] with its own checkout timeout.
pub fn build_pool_with(
    database_url: &str,
    size: u32,
    checkout_timeout: std::time::Duration,
) -> DbPool {
    let manager = FailoverAwareManager::new(ConnectionManager::<PgConnection>::new(database_url));
    Pool::builder()
        .max_size(size)
        .min_idle(Some(size.min(2)))
        .connection_timeout(checkout_timeout)
        // r2d2 calls `is_valid` on every checkout; the manager's costs
        // nothing (no `SELECT 1`) except shortly after a lost connection
        // and for a connection idle for `IDLE_CHECK` or longer.
        .test_on_check_out(true)
        .connection_customizer(Box::new(SessionLimits))
        .build_unchecked(manager)
}

/// Runs the embedded migrations that are not applied yet, after refusing a
/// database that holds migrations this binary does not know.
pub fn run_migrations(conn: &mut PgConnection) -> anyhow::Result<Vec<String>> {
    refuse_unknown_migrations(conn)?;
    let applied = conn
        .run_pending_migrations(MIGRATIONS)
        .map_err(|error| anyhow::anyhow!("running migrations: {error}"))?;
    Ok(applied.iter().map(ToString::to_string).collect())
}

/// The versions applied to the database that this binary does not embed:
/// the database was migrated by a newer release.
pub fn unknown_applied_migrations(conn: &mut PgConnection) -> anyhow::Result<Vec<String>> {
    let known: std::collections::HashSet<String> =
        MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
            .map_err(|error| anyhow::anyhow!("reading the embedded migrations: {error}"))?
            .iter()
            .map(|migration| migration.name().version().to_string())
            .collect();
    let mut unknown: Vec<String> = conn
        .applied_migrations()
        .map_err(|error| anyhow::anyhow!("reading the database's migrations: {error}"))?
        .iter()
        .map(ToString::to_string)
        .filter(|version| !known.contains(version))
        .collect();
    unknown.sort();
    Ok(unknown)
}

/// A binary older than its database would serve a schema it does not know
/// (after a restore with the wrong release, or a roll-back of the binary
/// alone): it would write rows the newer rules do not expect. Refuse, and
/// say what to do.
fn refuse_unknown_migrations(conn: &mut PgConnection) -> anyhow::Result<()> {
    let unknown = unknown_applied_migrations(conn)?;
    anyhow::ensure!(
        unknown.is_empty(),
        "refusing to serve or migrate: the database has {} migration(s) this binary does not know ({}), so a \
         newer release migrated it. Run that release (or a newer one) against this database, or \
         restore a backup taken before it was migrated; this binary changed nothing \
         (docs/backup.md, \"After a restore\")",
        unknown.len(),
        unknown.join(", ")
    );
    Ok(())
}

/// How many migrations this binary embeds.
pub fn migrations_total() -> usize {
    diesel::migration::MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .map_or(0, |migrations| migrations.len())
}

/// True when every embedded migration is applied (used by `/readyz`).
pub fn migrations_applied(conn: &mut PgConnection) -> Result<bool, ApiError> {
    conn.has_pending_migration(MIGRATIONS)
        .map(|pending| !pending)
        .map_err(|error| ApiError::Unavailable(error.to_string()))
}

/// Pairs back as a key=value connection string, every value quoted.
fn conninfo_of(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(key, value)| {
            format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Splits a `DATABASE_URL` into the database name and the connection
/// string of the server's `postgres` maintenance database, in either form
/// libpq accepts: `postgres://…/name?params` or `host=… dbname=name …`.
pub fn split_database_url(database_url: &str) -> anyhow::Result<(String, String)> {
    if let Some(mut pairs) = conninfo_pairs(database_url) {
        let named = pairs
            .iter()
            .rposition(|(key, value)| key == "dbname" && !value.is_empty());
        let Some(named) = named else {
            anyhow::bail!(
                "DATABASE_URL must name a database (dbname=… in the key=value form): {}",
                redact_database_url(database_url)
            );
        };
        let name = pairs[named].1.clone();
        pairs.retain(|(key, _)| key != "dbname");
        pairs.push(("dbname".into(), "postgres".into()));
        return Ok((name, conninfo_of(&pairs)));
    }
    let (base, query) = match database_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (database_url, None),
    };
    let (server, name) = base
        .rsplit_once('/')
        .filter(|(server, name)| {
            server.contains("://") && !server.ends_with('/') && !name.is_empty()
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "DATABASE_URL must name a database: {}",
                redact_database_url(base)
            )
        })?;
    let maintenance = match query {
        Some(query) => format!("{server}/postgres?{query}"),
        None => format!("{server}/postgres"),
    };
    Ok((name.to_owned(), maintenance))
}

/// The PostgreSQL advisory lock keys of this service, in one list, so no
/// two jobs share a key by accident (the engine's install once shared the
/// reaper's: a starting replica waited for another's reaper pass, and a
/// pass was skipped during an install). The tests' template databases use
/// 7_243_002 (tests/api/helpers.rs).
pub mod lock_keys {
    /// `migrate` and start-up: one replica migrates at a time.
    pub const MIGRATE: i64 = 7_243_001;
    /// A reaper pass (docs/operations.md names it for operators).
    pub const REAPER: i64 = 7_243_003;
    /// The engine's install (`engine::install`), a transaction lock.
    pub const ENGINE_INSTALL: i64 = 7_243_004;
    /// Closing days (`domain::history`), a transaction lock.
    pub const CLOSE_DAYS: i64 = 7_243_023;
    /// A retention pass.
    pub const RETENTION: i64 = 7_243_024;
}

/// Runs `work` under the session advisory lock `key` when no other session
/// holds it (one replica at a time: the reaper, retention); `None` when
/// another does. The lock is released even when `work` fails (a broken
/// connection drops it too).
pub fn with_advisory_lock<T>(
    conn: &mut PgConnection,
    key: i64,
    work: impl FnOnce(&mut PgConnection) -> Result<T, ApiError>,
) -> Result<Option<T>, ApiError> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        locked: bool,
    }
    let Locked { locked } = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<diesel::sql_types::BigInt, _>(key)
        .get_result(conn)?;
    if !locked {
        return Ok(None);
    }
    let result = work(conn);
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(key)
        .execute(conn);
    let done = result?;
    unlocked?;
    Ok(Some(done))
}

/// Creates the database named in `database_url` when it does not exist.
pub fn create_database_if_missing(database_url: &str) -> anyhow::Result<bool> {
    check_multi_host(database_url).map_err(anyhow::Error::msg)?;
    let (name, maintenance_url) = split_database_url(database_url)?;
    // Named as asked for: the maintenance database is how, not what.
    let mut conn = PgConnection::establish(&maintenance_url).map_err(|error| {
        anyhow::anyhow!(
            "connecting to database {name} ({}): {error}",
            redact_database_url(database_url)
        )
    })?;
    let exists: bool = diesel::select(diesel::dsl::exists(
        pg_database::table.filter(pg_database::datname.eq(&name)),
    ))
    .get_result(&mut conn)?;
    if exists {
        return Ok(false);
    }
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match conn.batch_execute(&format!("CREATE DATABASE {quoted}")) {
        Ok(()) => Ok(true),
        // Another replica created it between our check and our CREATE.
        Err(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::UniqueViolation,
            _,
        )) => Ok(false),
        Err(error) if error.to_string().contains("already exists") => Ok(false),
        Err(error) => Err(anyhow::anyhow!("creating database {name}: {error}")),
    }
}

/// Connects to a database that `serve` or `migrate` has prepared, for the
/// management commands: they never create or migrate a database themselves,
/// so a missing or unmigrated one is an error that says what to run.
pub fn connect_prepared(database_url: &str) -> anyhow::Result<PgConnection> {
    check_multi_host(database_url).map_err(anyhow::Error::msg)?;
    let mut conn = match PgConnection::establish(database_url) {
        Ok(conn) => conn,
        Err(error) => {
            let text = error.to_string();
            if text.contains("does not exist") && text.contains("database") {
                let name = split_database_url(database_url)
                    .map(|(name, _)| name)
                    .unwrap_or_default();
                anyhow::bail!(
                    "the database {name:?} does not exist: create and migrate it first with \
                     `token-billing migrate` (or start `token-billing serve`), using the same \
                     --database-url / DATABASE_URL"
                );
            }
            anyhow::bail!("cannot connect to the database (--database-url / DATABASE_URL): {text}");
        }
    };
    // Asking diesel about pending migrations would create its bookkeeping
    // table in an empty database: look for it first.
    let bookkept: bool = diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
        "to_regclass('__diesel_schema_migrations') IS NOT NULL",
    ))
    .get_result(&mut conn)?;
    let pending = !bookkept
        || conn
            .has_pending_migration(MIGRATIONS)
            .map_err(|error| anyhow::anyhow!("reading the database's migrations: {error}"))?;
    anyhow::ensure!(
        !pending,
        "the database is not migrated to this version: run `token-billing migrate` (or start \
                     `token-billing serve`) first"
    );
    Ok(conn)
}

diesel::table! {
    pg_database (datname) {
        datname -> Text,
    }
}

/// Runs `work` with a pooled connection on the blocking thread pool.
///
/// The closure runs to completion even when the HTTP client disconnects and
/// the handler future is dropped, so anything that must happen after a
/// commit belongs inside it, not after the `.await`.
pub async fn run_blocking<T, F>(pool: &DbPool, work: F) -> Result<T, ApiError>
where
    F: FnOnce(&mut PgConnection) -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let pool = pool.clone();
    actix_web::web::block(move || {
        let mut conn = pool.get()?;
        work(&mut conn)
    })
    .await
    .map_err(|error| ApiError::Internal(format!("blocking task failed: {error}")))?
}

#[cfg(test)]
mod tests {
    #[test]
    fn advisory_lock_keys_are_distinct() {
        use super::lock_keys::*;
        // 7_243_002: the tests' template databases.
        let mut keys = vec![
            MIGRATE,
            7_243_002,
            REAPER,
            ENGINE_INSTALL,
            CLOSE_DAYS,
            RETENTION,
        ];
        let count = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), count, "two jobs share an advisory lock key");
    }

    use super::split_database_url;

    #[test]
    fn redacts_passwords() {
        use super::redact_database_url;
        assert_eq!(
            redact_database_url("postgres://u:hunter2@h:5432/db?sslmode=disable"),
            "postgres://u:***@h:5432/db?sslmode=disable"
        );
        assert_eq!(
            redact_database_url("postgres://u@h1:5432,h2:5433/db?password=hunter2&x=1"),
            "postgres://u@h1:5432,h2:5433/db?password=***&x=1"
        );
        assert_eq!(
            redact_database_url("host=h user=u password=hunter2 dbname=db"),
            "host=h user=u password=*** dbname=db"
        );
        assert_eq!(
            redact_database_url("postgres://u@h/db"),
            "postgres://u@h/db"
        );
    }

    #[test]
    fn multi_host_urls_must_ask_for_the_primary() {
        use super::{check_multi_host, database_hosts};
        assert_eq!(
            database_hosts("postgres://u:p@h1:5441,h2:5442/db?x=1"),
            ["h1:5441", "h2:5442"]
        );
        assert_eq!(database_hosts("postgres://h/db"), ["h"]);
        assert_eq!(database_hosts("host=a,b dbname=db"), ["a", "b"]);
        assert!(check_multi_host("postgres://u@h/db").is_ok());
        assert!(check_multi_host("postgres://u@h1,h2/db?target_session_attrs=read-write").is_ok());
        assert!(check_multi_host("postgres://u@h1,h2/db?target_session_attrs=primary").is_ok());
        let refused = check_multi_host("postgres://u:hunter2@h1,h2/db").expect_err("refused");
        assert!(
            refused.contains("target_session_attrs=read-write"),
            "{refused}"
        );
        assert!(!refused.contains("hunter2"), "{refused}");
    }

    #[test]
    fn reads_the_key_value_form() {
        let (name, maintenance) =
            split_database_url("host=127.0.0.1 port=5432 dbname=token_billing user=postgres")
                .expect("valid");
        assert_eq!(name, "token_billing");
        assert_eq!(
            maintenance,
            "host='127.0.0.1' port='5432' user='postgres' dbname='postgres'"
        );
        let (name, maintenance) =
            split_database_url("dbname = 'my books' password='it\\'s' host=h").expect("valid");
        assert_eq!(name, "my books");
        assert_eq!(maintenance, "password='it\\'s' host='h' dbname='postgres'");
        assert_eq!(
            super::conninfo_pairs("host=a,b dbname=db target_session_attrs=read-write")
                .expect("pairs")
                .len(),
            3
        );
        for unnamed in [
            "host=h user=u",
            "host=h dbname=",
            "host=h dbname='unterminated",
        ] {
            assert!(split_database_url(unnamed).is_err(), "{unnamed}");
        }
        let refused = split_database_url("host=h password=hunter2")
            .expect_err("no dbname")
            .to_string();
        assert!(refused.contains("must name a database"), "{refused}");
        assert!(!refused.contains("hunter2"), "{refused}");
    }

    #[test]
    fn splits_database_urls() {
        let (name, maintenance) =
            split_database_url("postgres://postgres@localhost:5432/token_billing").expect("valid");
        assert_eq!(name, "token_billing");
        assert_eq!(maintenance, "postgres://postgres@localhost:5432/postgres");
        let (name, maintenance) =
            split_database_url("postgres://u:p@h/db?sslmode=disable").expect("valid");
        assert_eq!(
            (name.as_str(), maintenance.as_str()),
            ("db", "postgres://u:p@h/postgres?sslmode=disable")
        );
        let (name, maintenance) = split_database_url(
            "postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write&connect_timeout=2",
        )
        .expect("valid");
        assert_eq!(
            (name.as_str(), maintenance.as_str()),
            (
                "db",
                "postgres://u:p@h1:5432,h2:5433/postgres?target_session_attrs=read-write&connect_timeout=2"
            )
        );
        assert!(split_database_url("postgres://localhost").is_err());
        assert!(split_database_url("postgres://localhost/").is_err());
    }
}
