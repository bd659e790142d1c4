//! Finance reconciliation: a realistic history balances to hand-computed
//! totals; each kind of corruption is named with its account and check;
//! period boundaries; CSV = JSON; determinism; the CLI's exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

fn stamp(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Micros, true)
}

async fn report(app: &TestApp, from: DateTime<Utc>, to: DateTime<Utc>) -> Value {
    let path = format!("/v1/reconciliation?from={}&to={}", stamp(from), stamp(to));
    let response = app.get(&path.replace('+', "%2B"), ADMIN_KEY).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("json")
}

fn line(report: &Value, account: Uuid) -> &Value {
    report["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .find(|line| line["account_id"] == account.to_string())
        .expect("account in report")
}

/// Credits, jobs that succeed and fail, a partial commit, an expiry and
/// two adjustments on one account.
async fn history(app: &TestApp) -> Uuid {
    let account = app.funded_account(20).await;
    for outcome in ["succeed", "succeed", "succeed", "fail"] {
        let params = json!({"simulate": {"outcome": outcome, "delay_ms": 0}});
        assert_eq!(
            app.create_job(account, ADMIN_KEY, Uuid::new_v4(), &params)
                .await
                .status(),
            StatusCode::CREATED
        );
    }
    app.all_jobs_terminal(Duration::from_secs(20)).await;
    let partial: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 4)
        .await
        .json()
        .await
        .expect("json");
    let commit = format!(
        "/v1/accounts/{account}/reservations/{}/commit",
        partial["reservation_id"].as_str().expect("id")
    );
    assert_eq!(
        app.post(&commit, ADMIN_KEY, &json!({"amount": 1}))
            .await
            .status(),
        StatusCode::OK
    );
    let expiring: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 2)
        .await
        .json()
        .await
        .expect("json");
    let expiring = expiring["reservation_id"].as_str().expect("id").to_owned();
    diesel::sql_query(
        "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
    )
    .bind::<diesel::sql_types::Text, _>(&expiring)
    .execute(&mut app.conn())
    .expect("age");
    let extend = format!("/v1/accounts/{account}/reservations/{expiring}/extend");
    assert_eq!(
        app.post(&extend, ADMIN_KEY, &json!({"ttl_seconds": 60}))
            .await
            .status(),
        StatusCode::CONFLICT
    );
    for (amount, reference) in [(-2, "adj-down"), (1, "adj-up")] {
        let body = json!({"amount": amount, "reason": "correction", "external_ref": format!("{account}-{reference}")});
        assert_eq!(
            app.post(
                &format!("/v1/accounts/{account}/adjustments"),
                ADMIN_KEY,
                &body
            )
            .await
            .status(),
            StatusCode::CREATED
        );
    }
    account
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realistic_history_balances_to_hand_computed_totals() {
    let app = TestApp::spawn().await;
    let start = Utc::now() - chrono::Duration::seconds(5);
    let account = history(&app).await;
    let other = app.funded_account(5).await;
    // A closed period (it ended before the report is read), so the report
    // cannot change any more.
    let end = Utc::now();
    let report = report(&app, start, end).await;
    assert_eq!(report["status"], "ok", "{report:#}");
    assert_eq!(report["discrepancies"], json!([]));
    let expected = [
        ("opening", 0),
        ("credited", 20),
        ("adjusted", -1),
        ("committed", 4),
        ("closing", 15),
        ("reserved", 10),
        ("released", 4),
        ("expired", 2),
        ("closing_used", 4),
        ("jobs_succeeded", 3),
        ("job_commit_entries", 3),
    ];
    let row = line(&report, account);
    for (field, value) in expected {
        assert_eq!(row[field], value, "{field}: {row:#}");
    }
    assert_eq!(line(&report, other)["closing"], 5);
    let totals = &report["totals"];
    assert_eq!(
        (
            totals["accounts"].as_i64(),
            totals["credited"].as_i64(),
            totals["closing"].as_i64()
        ),
        (Some(2), Some(25), Some(20))
    );
    assert_eq!(
        (report["from"].as_str(), report["to"].as_str()),
        (Some(stamp(start).as_str()), Some(stamp(end).as_str()))
    );

    // Deterministic: the same period over the same data, byte for byte.
    assert_eq!(
        report["generated_at"].as_str(),
        Some(stamp(end).as_str()),
        "a closed period is read up to its end"
    );
    let path = format!("/v1/reconciliation?from={}&to={}", stamp(start), stamp(end));
    let first = app.get(&path, ADMIN_KEY).await.text().await.expect("text");
    let second = app.get(&path, ADMIN_KEY).await.text().await.expect("text");
    assert_eq!(first, second);

    // CSV carries the same numbers.
    let csv = app
        .client
        .get(app.url(&path))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("sent");
    assert!(csv.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/csv"));
    let csv = csv.text().await.expect("text");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let mut rows: Vec<Vec<&str>> = lines.map(|row| row.split(',').collect()).collect();
    assert_eq!(rows.len(), 3, "two accounts and the totals: {csv}");
    // The last row sums every column: the JSON's totals where it has them.
    let totals_row = rows.pop().expect("totals row");
    assert_eq!(totals_row[..3], ["totals", "2 accounts", "ok"], "{csv}");
    for (column, (name, value)) in header.iter().zip(&totals_row).enumerate().skip(3) {
        let summed: i64 = rows
            .iter()
            .map(|row| row[column].parse::<i64>().unwrap_or(0))
            .sum();
        if *name == "failed_checks" {
            assert_eq!(*value, "0");
            continue;
        }
        assert_eq!(value.parse::<i64>().expect("a number"), summed, "{name}");
        if let Some(total) = report["totals"].get(*name) {
            assert_eq!(total.as_i64(), Some(summed), "totals.{name}");
        }
    }
    for row in rows {
        assert_eq!(row.len(), header.len());
        let json_line = line(&report, row[0].parse().expect("uuid"));
        for (name, value) in header.iter().zip(&row).skip(1) {
            match json_line.get(*name) {
                Some(Value::Number(number)) => assert_eq!(number.to_string(), *value, "{name}"),
                Some(Value::String(text)) => assert_eq!(text, *value, "{name}"),
                _ => assert_eq!(*name, "failed_checks"),
            }
        }
    }
}

fn corrupt(app: &TestApp, statement: &str, id: Uuid) {
    diesel::sql_query(statement)
        .bind::<SqlUuid, _>(id)
        .execute(&mut app.conn())
        .expect(statement);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_corruption_is_named_with_its_account_and_check() {
    let app = TestApp::spawn_with(|config| config.reaper_schedule = "0 0 0 1 1 *".into()).await;
    let start = Utc::now() - chrono::Duration::seconds(5);
    let balance = history(&app).await;
    let ledger = history(&app).await;
    let reservation = history(&app).await;
    let job = history(&app).await;
    let healthy = history(&app).await;

    // The database refuses broken books; the audit is tested without that guard.
    app.allow_broken_books();
    corrupt(
        &app,
        "UPDATE accounts SET available = available + 5 WHERE id = $1",
        balance,
    );
    // The ledger is append-only: deleting needs its trigger switched off.
    let mut conn = app.conn();
    diesel::sql_query("ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete")
        .execute(&mut conn)
        .expect("disable");
    diesel::sql_query(
        "DELETE FROM ledger_entries WHERE id = (SELECT id FROM ledger_entries \
         WHERE account_id = $1 AND kind = 'adjustment' ORDER BY id LIMIT 1)",
    )
    .bind::<SqlUuid, _>(ledger)
    .execute(&mut conn)
    .expect("delete");
    diesel::sql_query("ALTER TABLE ledger_entries ENABLE TRIGGER ledger_entries_no_update_delete")
        .execute(&mut conn)
        .expect("enable");
    let held: Value = app
        .reserve(reservation, ADMIN_KEY, Uuid::new_v4(), 1)
        .await
        .json()
        .await
        .expect("json");
    let held: Uuid = held["reservation_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    corrupt(
        &app,
        "UPDATE reservations SET state = 'released', resolved_at = now() WHERE id = $1",
        held,
    );
    corrupt(
        &app,
        "UPDATE generation_jobs SET status = 'succeeded', error = NULL WHERE account_id = $1 AND status = 'failed'",
        job,
    );

    let report = report(&app, start, Utc::now() + chrono::Duration::seconds(5)).await;
    assert_eq!(report["status"], "mismatch");
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for discrepancy in report["discrepancies"].as_array().expect("discrepancies") {
        named
            .entry(discrepancy["account_id"].as_str().expect("id").to_owned())
            .or_default()
            .insert(discrepancy["check"].as_str().expect("check").to_owned());
    }
    let expect = |account: Uuid, checks: &[&str]| {
        let found = named.get(&account.to_string()).cloned().unwrap_or_default();
        let wanted: BTreeSet<String> = checks.iter().map(|c| (*c).to_owned()).collect();
        assert_eq!(found, wanted, "account {account}");
    };
    // Its grants hold what it held: the grants check names it too.
    expect(
        balance,
        &[
            "balance_invariant",
            "ledger_replay_available",
            "grants_remaining_equals_available",
        ],
    );
    expect(ledger, &["roll_forward", "ledger_replay_available"]);
    expect(
        reservation,
        &[
            "reserved_equals_held_reservations",
            "active_reservations_equals_held_count",
        ],
    );
    expect(job, &["succeeded_jobs_match_commits"]);
    assert!(
        !named.contains_key(&healthy.to_string()),
        "a healthy account is not named"
    );
    assert_eq!(named.len(), 4);
    assert_eq!(line(&report, healthy)["status"], "ok");
    assert_eq!(line(&report, balance)["status"], "mismatch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn period_boundaries_include_from_and_exclude_to() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(7).await;
    app.credit(account, 3).await;
    let stamps: Vec<DateTime<Utc>> = token_billing::db::schema::ledger_entries::table
        .filter(token_billing::db::schema::ledger_entries::account_id.eq(account))
        .order(token_billing::db::schema::ledger_entries::id.asc())
        .select(token_billing::db::schema::ledger_entries::created_at)
        .load(&mut app.conn())
        .expect("stamps");
    let (first, second) = (stamps[0], stamps[1]);
    let micro = chrono::Duration::microseconds(1);

    // [second, second + 1µs): exactly the second credit.
    let at_from = report(&app, second, second + micro).await;
    let row = line(&at_from, account);
    assert_eq!(
        (
            row["opening"].as_i64(),
            row["credited"].as_i64(),
            row["closing"].as_i64()
        ),
        (Some(7), Some(3), Some(10))
    );
    // [first, second): the first credit only; the entry at `to` is out.
    let at_to = report(&app, first, second).await;
    let row = line(&at_to, account);
    assert_eq!(
        (
            row["opening"].as_i64(),
            row["credited"].as_i64(),
            row["closing"].as_i64()
        ),
        (Some(0), Some(7), Some(7))
    );
    // An empty period: no movements, opening = closing.
    let later = Utc::now() + chrono::Duration::hours(1);
    let empty = report(&app, later, later + chrono::Duration::hours(1)).await;
    let row = line(&empty, account);
    assert_eq!(
        (
            row["credited"].as_i64(),
            row["committed"].as_i64(),
            row["reserved"].as_i64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(
        (row["opening"].as_i64(), row["closing"].as_i64()),
        (Some(10), Some(10))
    );
    assert_eq!(empty["status"], "ok");

    // Bad periods and scopes.
    for query in [
        "from=yesterday",
        "from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
        "from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z",
    ] {
        let (status, _) = problem(
            app.get(&format!("/v1/reconciliation?{query}"), ADMIN_KEY)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
    }
    let kiosk = app.kiosk_key(account).await;
    let (status, _) = problem(app.get("/v1/reconciliation", &kiosk).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_command_exits_non_zero_on_mismatch() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_token-billing"))
            .args(["reconcile", "--csv", "--database-url", &app.database.url])
            .env("RUST_LOG", "error")
            .output()
            .expect("runs")
    };
    let clean = run();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(String::from_utf8_lossy(&clean.stdout).contains(&format!("{account},kiosk fleet,ok,")));
    app.allow_broken_books();
    corrupt(
        &app,
        "UPDATE accounts SET used = used + 1 WHERE id = $1",
        account,
    );
    let broken = run();
    assert_eq!(broken.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&broken.stdout)
        .contains(&format!("{account},kiosk fleet,mismatch,")));
}

/// A person can read the report: names in JSON and CSV (quoted where a
/// spreadsheet needs it, never a formula), the CSV named after its period,
/// bare dates as bounds, and an offset sent without URL encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_dates_and_the_download_name_make_the_report_readable() {
    let app = TestApp::spawn().await;
    let tricky = "Smith, \"Jones\" & Co";
    let formula = "=HYPERLINK(\"http://x\")";
    let mut accounts = Vec::new();
    for name in [tricky, formula] {
        let account = app.create_account_from(&json!({"name": name})).await;
        app.credit(account, 7).await;
        accounts.push((account, name));
    }
    let today = Utc::now().date_naive();
    let tomorrow = today.succ_opt().expect("tomorrow");
    let path = format!("/v1/reconciliation?from={today}&to={tomorrow}");
    let response = app.get(&path, ADMIN_KEY).await;
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = response.json().await.expect("json");
    assert_eq!(report["from"], format!("{today}T00:00:00.000000Z"));
    assert_eq!(report["to"], format!("{tomorrow}T00:00:00.000000Z"));
    for (account, name) in &accounts {
        assert_eq!(line(&report, *account)["name"], *name);
        assert_eq!(line(&report, *account)["credited"], 7);
    }

    let csv = app
        .client
        .get(app.url(&path))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        csv.headers()["content-disposition"]
            .to_str()
            .expect("ascii"),
        format!("attachment; filename=\"reconciliation_{today}_{tomorrow}.csv\"")
    );
    let csv = csv.text().await.expect("text");
    assert!(csv.starts_with("account_id,name,status,"), "{csv}");
    assert!(
        csv.contains(&format!(
            "{},\"Smith, \"\"Jones\"\" & Co\",ok,",
            accounts[0].0
        )),
        "{csv}"
    );
    assert!(
        csv.contains(&format!(
            "{},\"'=HYPERLINK(\"\"http://x\"\")\",ok,",
            accounts[1].0
        )),
        "{csv}"
    );

    // `+01:00` typed into a URL unencoded arrives as a space: still read
    // as the offset it was. The same instants as above.
    let path = format!(
        "/v1/reconciliation?from={}T01:00:00+01:00&to={}T01:00:00+01:00",
        today, tomorrow
    );
    let offset: Value = app.get(&path, ADMIN_KEY).await.json().await.expect("json");
    assert_eq!(offset["from"], report["from"]);
    assert_eq!(offset["to"], report["to"]);
    for query in [
        "from=2026-11",
        "from=11/01/2026",
        "from=2026-11-01T00:00:00",
    ] {
        let (status, body) = problem(
            app.get(&format!("/v1/reconciliation?{query}"), ADMIN_KEY)
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            body["detail"]
                .as_str()
                .expect("detail")
                .contains("YYYY-MM-DD"),
            "{body}"
        );
    }

    // The CLI takes the same dates.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_token-billing"))
        .args([
            "reconcile",
            "--from",
            &today.to_string(),
            "--to",
            &tomorrow.to_string(),
        ])
        .args(["--database-url", &app.database.url])
        .env("RUST_LOG", "error")
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cli: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(cli["from"], report["from"]);
    assert_eq!(line(&cli, accounts[0].0)["name"], tricky);
}
