//! docs/scaling.md's rule, kept by the catalogue: every table says its role
//! in the plan past one primary (`COMMENT ON TABLE … IS 'distribution: …'`),
//! and a table carrying `account_id` is distributed by it, colocated.

use diesel::prelude::*;
use diesel::sql_types::{Bool, Nullable, Text};

use crate::helpers::TestDatabase;

#[derive(QueryableByName, Debug)]
struct TableRole {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<Text>)]
    role: Option<String>,
    #[diesel(sql_type = Bool)]
    has_account_id: bool,
}

#[test]
fn every_table_declares_its_distribution() {
    let database = TestDatabase::create();
    let tables: Vec<TableRole> = diesel::sql_query(
        "SELECT c.relname AS name, obj_description(c.oid, 'pg_class') AS role, \
                EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid \
                        AND a.attname = 'account_id' AND NOT a.attisdropped) AS has_account_id \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') \
           AND c.relname <> '__diesel_schema_migrations' ORDER BY 1",
    )
    .load(&mut database.connect())
    .expect("read the catalogue");
    assert!(tables.len() >= 10, "{tables:?}");
    let mut wrong = Vec::new();
    for table in &tables {
        let role = table.role.as_deref().unwrap_or("");
        let declared = role.starts_with("distribution: ");
        let distributed = role.contains("distributed by account_id, colocated with accounts");
        let reference = role.contains("reference table");
        if !declared || (table.has_account_id && !distributed && !reference) {
            wrong.push(format!("{} ({role:?})", table.name));
        }
    }
    assert!(
        wrong.is_empty(),
        "tables without their role in docs/scaling.md's plan — add \
         COMMENT ON TABLE <name> IS 'distribution: distributed by account_id, colocated with accounts' \
         (or 'distribution: reference table …'): {wrong:?}"
    );
}
