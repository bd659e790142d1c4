//! Installs the engine's SQL (`src/engine/sql/*.sql`, in name order) into
//! a schema named by its content (`engine_<hash>`, see `build.rs`).
//!
//! Installation runs on every start (`serve`), on `migrate` and before
//! every management command, after the migrations: in one transaction,
//! under an advisory lock, so replicas starting together install once and
//! a half-installed schema is never seen. A schema that exists already
//! holds exactly these files (its name is their hash) and is left as it is.
//! An older and a newer build therefore run side by side during a rolling
//! deploy, each calling the functions of its own schema: every pooled
//! connection puts its build's schema on its `search_path` (after
//! `public`, which holds the tables and no engine function).
//!
//! Migrations hold tables and data only; changing a rule is changing its
//! file. Schemas of builds that have not started for
//! [`UNUSED_SCHEMA_DAYS`] days are dropped by the next install.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Integer, Text};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/engine_sql.rs"));
}

pub use embedded::{FILES, SCHEMA};

/// An engine schema that no build has installed or started with for this
/// long is dropped (its replicas are long gone).
pub const UNUSED_SCHEMA_DAYS: i32 = 7;

/// Serialises installs across replicas (any constant of this service's own).
const INSTALL_LOCK: i64 = crate::db::lock_keys::ENGINE_INSTALL;

/// What an install did.
#[derive(Debug, PartialEq, Eq)]
pub enum Installed {
    /// The schema was created now.
    Created(&'static str),
    /// It was there already.
    Present(&'static str),
}

/// Makes sure this build's engine schema exists, records that this build
/// started with it, drops schemas unused for [`UNUSED_SCHEMA_DAYS`] days,
/// and puts the schema on this connection's `search_path`.
pub fn install(conn: &mut PgConnection) -> anyhow::Result<Installed> {
    let installed = conn.transaction(|conn| -> anyhow::Result<Installed> {
        diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
            .bind::<diesel::sql_types::BigInt, _>(INSTALL_LOCK)
            .execute(conn)?;
        #[derive(QueryableByName)]
        struct Exists {
            #[diesel(sql_type = Bool)]
            exists: bool,
        }
        let present = diesel::sql_query(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) AS exists",
        )
        .bind::<Text, _>(SCHEMA)
        .get_result::<Exists>(conn)?
        .exists;
        if !present {
            conn.batch_execute(&format!(
                "CREATE SCHEMA {SCHEMA}; SET LOCAL search_path TO {SCHEMA}, public;"
            ))?;
            for (name, text) in FILES {
                conn.batch_execute(text)
                    .map_err(|error| anyhow::anyhow!("installing engine file {name}: {error}"))?;
            }
        }
        diesel::sql_query(
            "INSERT INTO engine_schemas (name) VALUES ($1) \
             ON CONFLICT (name) DO UPDATE SET last_started_at = now()",
        )
        .bind::<Text, _>(SCHEMA)
        .execute(conn)?;
        drop_unused_schemas(conn)?;
        Ok(if present {
            Installed::Present(SCHEMA)
        } else {
            Installed::Created(SCHEMA)
        })
    })?;
    conn.batch_execute(&format!("SET search_path TO public, {SCHEMA}"))?;
    Ok(installed)
}

/// Drops the engine schemas no build has started with for a while.
fn drop_unused_schemas(conn: &mut PgConnection) -> anyhow::Result<()> {
    #[derive(QueryableByName)]
    struct Unused {
        #[diesel(sql_type = Text)]
        name: String,
    }
    let unused: Vec<Unused> = diesel::sql_query(
        "DELETE FROM engine_schemas \
         WHERE name <> $1 AND last_started_at < now() - make_interval(days => $2) \
         RETURNING name",
    )
    .bind::<Text, _>(SCHEMA)
    .bind::<Integer, _>(UNUSED_SCHEMA_DAYS)
    .load(conn)?;
    for schema in unused {
        // Names come from this table, which only install writes; quote anyway.
        conn.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            schema.name.replace('"', "\"\"")
        ))?;
        tracing::info!(schema = %schema.name, "dropped an unused engine schema");
    }
    Ok(())
}
