//! Every SQL query of the docs (each ```sql block of README.md,
//! ARCHITECTURE.md and docs/*.md, statement by statement, `<account_id>`
//! read as the account's id) runs on a migrated database whose account has
//! a lapsed grant (lapsed both while free and while held), an adjustment, a
//! partial commit and a held reservation. Each must run; each that looks
//! for disagreement (it compares with `<>`: the runbook's drift queries)
//! must find none, as the service's own checks find none. The identity the
//! docs state is checked in tests/repository/books_identity.rs.

use diesel::prelude::*;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::checks::find_violations;
use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{TestApp, ADMIN_KEY};

/// (page, line of the block, statement) for every statement of every
/// ```sql block of the docs.
fn documented_queries() -> Vec<(String, usize, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec!["README.md".to_owned(), "ARCHITECTURE.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut found = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(root.join(&page)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim() == "```sql" {
                let start = i + 1;
                let mut end = start;
                while end < lines.len() && !lines[end].trim().starts_with("```") {
                    end += 1;
                }
                let block = lines[start..end].join("\n");
                for statement in block.split(';') {
                    let code: Vec<&str> = statement
                        .lines()
                        .filter(|line| !line.trim().starts_with("--"))
                        .collect();
                    let code = code.join("\n");
                    if !code.trim().is_empty() {
                        found.push((page.clone(), start, code.trim().to_owned()));
                    }
                }
                i = end;
            }
            i += 1;
        }
    }
    found
}

async fn post(app: &TestApp, path: &str, body: Value) -> Value {
    let response = app.post(path, ADMIN_KEY, &body).await;
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

fn id(value: &Value, field: &str) -> String {
    value[field].as_str().expect(field).to_owned()
}

/// The rows `sql` selects, as one JSON array.
fn rows(app: &TestApp, sql: &str) -> Result<Value, diesel::result::Error> {
    #[derive(QueryableByName)]
    struct Rows {
        #[diesel(sql_type = Text)]
        rows: String,
    }
    let wrapped =
        format!("SELECT COALESCE(json_agg(q), '[]'::json)::text AS rows FROM (\n{sql}\n) q");
    let loaded: Rows = diesel::sql_query(wrapped).get_result(&mut app.conn())?;
    Ok(serde_json::from_str(&loaded.rows).expect("JSON rows"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_query_of_the_docs_runs_and_finds_no_drift_on_sound_books() {
    let queries = documented_queries();
    let drift_queries = queries
        .iter()
        .filter(|(_, _, sql)| sql.contains("<>"))
        .count();
    assert!(
        drift_queries >= 3,
        "the runbook's drift queries were not found: {queries:#?}"
    );

    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let accounts = format!("/v1/accounts/{account}");
    let soon = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let event = post(
        &app,
        &format!("{accounts}/credits"),
        json!({"amount": 10, "external_ref": "event", "expires_at": soon}),
    )
    .await;
    post(
        &app,
        &format!("{accounts}/credits"),
        json!({"amount": 20, "external_ref": "season"}),
    )
    .await;
    let reserve = |amount: i64| {
        let body = json!({"request_id": Uuid::new_v4(), "amount": amount});
        let path = format!("{accounts}/reservations");
        let app = &app;
        async move { post(app, &path, body).await }
    };
    // Drawn from the event grant, which expires first; it lapses while
    // held, and returns to the lapsed grant when released.
    let held_at_lapse = reserve(4).await;
    post(
        &app,
        &format!("{accounts}/adjustments"),
        json!({"amount": -1, "reason": "correction", "external_ref": "adjustment-1"}),
    )
    .await;
    let committed = reserve(3).await;
    post(
        &app,
        &format!(
            "{accounts}/reservations/{}/commit",
            id(&committed, "reservation_id")
        ),
        json!({"amount": 2}),
    )
    .await;

    diesel::sql_query("UPDATE credit_grants SET expires_at = clock_timestamp() WHERE id = $1")
        .bind::<SqlUuid, _>(id(&event, "grant_id").parse::<Uuid>().expect("grant id"))
        .execute(&mut app.conn())
        .expect("the event grant lapses now");
    let settings = ReaperSettings {
        batch: 500,
        job_max_attempts: 3,
        grant_expiring_notice_hours: 72,
    };
    run_pass(&mut app.conn(), &settings, None).expect("reaper pass");
    post(
        &app,
        &format!(
            "{accounts}/reservations/{}/release",
            id(&held_at_lapse, "reservation_id")
        ),
        json!({}),
    )
    .await;
    reserve(5).await;

    let balances = app.account(account).await;
    for (field, positive) in [("grant_expired", true), ("reserved", true), ("used", true)] {
        assert_eq!(
            balances[field].as_i64().is_some_and(|n| n > 0),
            positive,
            "{field} in {balances}"
        );
    }
    assert_ne!(balances["adjusted"], json!(0), "{balances}");
    let violations = find_violations(&mut app.conn()).expect("checks");
    assert!(
        violations.is_empty(),
        "the books are sound: {violations:#?}"
    );
    let lapses: i64 = diesel::sql_query(
        "SELECT count(*)::bigint AS n FROM ledger_entries WHERE account_id = $1 AND kind = 'grant_expire'",
    )
    .bind::<SqlUuid, _>(account)
    .get_result::<Count>(&mut app.conn())
    .expect("count")
    .n;
    assert!(
        lapses >= 2,
        "a lapse while free and one while held: {lapses}"
    );

    let mut failures = Vec::new();
    for (page, line, sql) in &queries {
        let sql = sql.replace("<account_id>", &account.to_string());
        match rows(&app, &sql) {
            Err(error) => failures.push(format!("{page}:{line}: {error}\n{sql}")),
            Ok(found) if sql.contains("<>") && found != json!([]) => failures.push(format!(
                "{page}:{line}: reports drift on sound books: {found}\n{sql}"
            )),
            Ok(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(app.get(&accounts, ADMIN_KEY).await.status(), StatusCode::OK);
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}
