//! Usage per key (docs/fleet.md, "Usage"): every ledger entry names the key
//! whose request wrote it, and `GET /v1/accounts/{id}/usage` adds the
//! account's spending up per key, per job kind and per day. The report is
//! held to a count of the exported ledger made here, without the service's
//! code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use diesel::RunQueryDsl;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::reaper::{run_pass, ReaperSettings};

use crate::helpers::{TestApp, ADMIN_KEY};

const REAPER: ReaperSettings = ReaperSettings {
    batch: 500,
    job_max_attempts: 3,
    grant_expiring_notice_hours: 72,
};

/// A key (its secret and id) with `scope` and `label`.
async fn key(app: &TestApp, account: Option<Uuid>, scope: &str, label: &str) -> (String, Uuid) {
    let path = account.map_or_else(
        || "/v1/api-keys".to_owned(),
        |account| format!("/v1/accounts/{account}/api-keys"),
    );
    let response = app
        .post(&path, ADMIN_KEY, &json!({"scope": scope, "label": label}))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.expect("json");
    (
        body["key"].as_str().expect("key").to_owned(),
        body["key_id"].as_str().expect("id").parse().expect("uuid"),
    )
}

/// The whole ledger of `account`, oldest first, as finance exports it.
async fn ledger(app: &TestApp, account: Uuid) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = app
            .get(
                &format!("/v1/accounts/{account}/ledger?after={after}&limit=1000"),
                ADMIN_KEY,
            )
            .await
            .json()
            .await
            .expect("json");
        entries.extend(page["entries"].as_array().expect("entries").iter().cloned());
        match page["next_after"].as_i64() {
            Some(next) => after = next,
            None => return entries,
        }
    }
}

/// Per key (null: none), the figures `[reserved, used, released, expired,
/// jobs succeeded, jobs failed]` counted from the entries: a reservation's
/// entries count for the key on its `reserve` entry.
fn count(entries: &[Value]) -> BTreeMap<Option<String>, [i64; 6]> {
    let mut maker: BTreeMap<String, Option<String>> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e["kind"] == "reserve") {
        let reservation = entry["reservation_id"]
            .as_str()
            .expect("reservation")
            .to_owned();
        maker
            .entry(reservation)
            .or_insert_with(|| entry["api_key_id"].as_str().map(str::to_owned));
    }
    let mut figures: BTreeMap<Option<String>, [i64; 6]> = BTreeMap::new();
    let mut jobs: BTreeMap<Option<String>, [BTreeSet<String>; 2]> = BTreeMap::new();
    for entry in entries {
        let Some(reservation) = entry["reservation_id"].as_str() else {
            continue;
        };
        let column = match entry["kind"].as_str().expect("kind") {
            "reserve" => 0,
            "commit" => 1,
            "release" => 2,
            "expire" | "grant_expire" => 3,
            _ => continue,
        };
        let key = maker[reservation].clone();
        figures.entry(key.clone()).or_default()[column] += entry["amount"].as_i64().expect("n");
        if let (Some(job), true) = (entry["job_id"].as_str(), column > 0) {
            let outcome = usize::from(column != 1);
            jobs.entry(key).or_default()[outcome].insert(job.to_owned());
        }
    }
    for (key, [succeeded, failed]) in jobs {
        let line = figures.entry(key).or_default();
        line[4] = i64::try_from(succeeded.len()).expect("jobs");
        line[5] = i64::try_from(failed.len()).expect("jobs");
    }
    figures
}

fn figures_of(line: &Value) -> [i64; 6] {
    [
        "reserved",
        "used",
        "released",
        "expired",
        "jobs_succeeded",
        "jobs_failed",
    ]
    .map(|name| {
        line[name]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} in {line}"))
    })
}

/// What one booth does: reserve and commit all, commit part, release,
/// leave a reservation to expire, or run a job that succeeds or fails.
async fn booth(app: Arc<TestApp>, account: Uuid, key: String, seed: u64) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut left_to_expire = Vec::new();
    for _ in 0..10 {
        let amount = rng.gen_range(1..=4);
        let choice = rng.gen_range(0..6);
        if choice >= 4 {
            let outcome = if choice == 4 { "succeed" } else { "fail" };
            let params = json!({"simulate": {"outcome": outcome, "delay_ms": 0}});
            let response = app.create_job(account, &key, Uuid::new_v4(), &params).await;
            assert_eq!(response.status(), StatusCode::CREATED);
            continue;
        }
        let response = app.reserve(account, &key, Uuid::new_v4(), amount).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let reservation: Value = response.json().await.expect("json");
        let id = reservation["reservation_id"]
            .as_str()
            .expect("id")
            .to_owned();
        let path = format!("/v1/accounts/{account}/reservations/{id}");
        let settled = match choice {
            0 => app.post(&format!("{path}/commit"), &key, &json!({})).await,
            1 => {
                let part = json!({"amount": (amount - 1).max(1)});
                app.post(&format!("{path}/commit"), &key, &part).await
            }
            2 => app.post(&format!("{path}/release"), &key, &json!({})).await,
            _ => {
                left_to_expire.push(id);
                continue;
            }
        };
        assert_eq!(settled.status(), StatusCode::OK);
    }
    left_to_expire
}

/// Three booths spend at once (reserves, full and partial commits,
/// releases, jobs that succeed or fail, reservations the reaper expires),
/// an admin key credits: the usage per key equals the count of the
/// exported ledger, per kind and per day add up to the same totals, and a
/// kiosk key reads its own line alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_per_key_equals_a_count_of_the_ledger() {
    let app = Arc::new(TestApp::spawn().await);
    let account = app.funded_account(1_000).await;
    let from = chrono::Utc::now();
    let mut booths = Vec::new();
    for n in 1..=3u64 {
        booths.push(key(&app, Some(account), "kiosk", &format!("booth {n}")).await);
    }
    // A label a spreadsheet would run as a formula.
    booths[2] = {
        let (secret, id) = key(&app, Some(account), "kiosk", "=SUM(A1)").await;
        (secret, id)
    };
    let (admin, admin_id) = key(&app, None, "admin", "front desk").await;
    let tasks: Vec<_> = booths
        .iter()
        .enumerate()
        .map(|(n, (secret, _))| {
            tokio::spawn(booth(
                Arc::clone(&app),
                account,
                secret.clone(),
                n as u64 + 7,
            ))
        })
        .collect();
    let mut to_expire = Vec::new();
    for task in tasks {
        to_expire.extend(task.await.expect("a booth"));
    }
    let credit = app
        .post(
            &format!("/v1/accounts/{account}/credits"),
            &admin,
            &json!({"amount": 5, "external_ref": "desk-1"}),
        )
        .await;
    assert_eq!(credit.status(), StatusCode::CREATED);
    app.all_jobs_terminal(std::time::Duration::from_secs(30))
        .await;
    {
        let mut conn = app.conn();
        for id in &to_expire {
            diesel::sql_query(
                "UPDATE reservations SET expires_at = now() - interval '1 second' WHERE id = $1",
            )
            .bind::<diesel::sql_types::Uuid, _>(id.parse::<Uuid>().expect("uuid"))
            .execute(&mut conn)
            .expect("due");
        }
        let report = run_pass(&mut conn, &REAPER, None).expect("pass");
        assert_eq!(report.reservations_expired as usize, to_expire.len());
    }
    let to = chrono::Utc::now();
    let period = format!(
        "from={}&to={}",
        from.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        to.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
    .replace('+', "%2B");

    // The ledger names the keys: each reserve its booth, the credit its
    // admin key, the worker's settlements and the reaper's expiries none.
    let entries = ledger(&app, account).await;
    let booth_ids: BTreeSet<String> = booths.iter().map(|(_, id)| id.to_string()).collect();
    for entry in &entries {
        let named = entry["api_key_id"].as_str();
        match entry["kind"].as_str().expect("kind") {
            "reserve" => assert!(booth_ids.contains(named.expect("a key")), "{entry}"),
            "credit" if entry["external_ref"] == "desk-1" => {
                assert_eq!(named, Some(admin_id.to_string().as_str()), "{entry}");
            }
            "credit" | "expire" => assert_eq!(named, None, "{entry}"),
            "commit" | "release" if entry["job_id"].is_string() => {
                assert_eq!(named, None, "the worker's: {entry}");
            }
            "commit" | "release" => assert!(booth_ids.contains(named.expect("a key"))),
            other => panic!("an entry of kind {other}: {entry}"),
        }
    }
    let expected = count(&entries);
    assert_eq!(expected.len(), 3, "three booths spent: {expected:?}");
    assert!(
        expected.values().all(|f| f[0] > 0) && expected.values().map(|f| f[3]).sum::<i64>() > 0,
        "every booth reserved and some reservation expired: {expected:?}"
    );

    let report: Value = app
        .get(&format!("/v1/accounts/{account}/usage?{period}"), ADMIN_KEY)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(report["group_by"], "key", "{report}");
    let lines = report["lines"].as_array().expect("lines");
    let found: BTreeMap<Option<String>, [i64; 6]> = lines
        .iter()
        .map(|line| {
            (
                line["api_key_id"].as_str().map(str::to_owned),
                figures_of(line),
            )
        })
        .collect();
    assert_eq!(found, expected);
    let totals = figures_of(&report["totals"]);
    let sum = expected.values().fold([0; 6], |mut sum, line| {
        sum.iter_mut().zip(line).for_each(|(s, n)| *s += n);
        sum
    });
    assert_eq!(totals, sum);
    for line in lines {
        let id: Uuid = line["api_key_id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("uuid");
        let (n, _) = booths
            .iter()
            .enumerate()
            .find(|(_, (_, booth))| *booth == id)
            .expect("a booth");
        let label = if n == 2 {
            "=SUM(A1)".to_owned()
        } else {
            format!("booth {}", n + 1)
        };
        assert_eq!(line["label"], label.as_str());
    }
    let doc = crate::openapi_types::document(&app).await;
    let schema = json!({"$ref": "#/components/schemas/UsageReport"});
    let broken = crate::openapi_types::violations(&doc, &schema, &report, "usage");
    assert!(broken.is_empty(), "{broken:?}");

    // Per job kind and per day: the same totals.
    for group_by in ["kind", "day"] {
        let other: Value = app
            .get(
                &format!("/v1/accounts/{account}/usage?{period}&group_by={group_by}"),
                ADMIN_KEY,
            )
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(figures_of(&other["totals"]), sum, "{other}");
        let lines = other["lines"].as_array().expect("lines");
        let sum_of_lines = lines.iter().map(figures_of).fold([0; 6], |mut sum, line| {
            sum.iter_mut().zip(line).for_each(|(s, n)| *s += n);
            sum
        });
        assert_eq!(sum_of_lines, sum, "{other}");
        if group_by == "kind" {
            // Jobs are all of kind `standard`; plain reservations have none.
            let kinds: Vec<Value> = lines.iter().map(|l| l["kind"].clone()).collect();
            assert_eq!(kinds, vec![json!("standard"), Value::Null], "{other}");
            let jobs = figures_of(&lines[0]);
            assert_eq!((jobs[4], jobs[5]), (sum[4], sum[5]), "{other}");
        }
    }

    // A kiosk key reads its own line alone, the same as finance reads it.
    let (first_key, first_id) = &booths[0];
    let own: Value = app
        .get(&format!("/v1/accounts/{account}/usage?{period}"), first_key)
        .await
        .json()
        .await
        .expect("json");
    let own_lines = own["lines"].as_array().expect("lines");
    assert_eq!(own_lines.len(), 1, "{own}");
    assert_eq!(own_lines[0]["api_key_id"], first_id.to_string().as_str());
    assert_eq!(
        figures_of(&own_lines[0]),
        expected[&Some(first_id.to_string())]
    );
    assert_eq!(own["only_key"], first_id.to_string().as_str());

    // CSV: one row per key and a totals row, the formula defused.
    let csv = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}/usage?{period}")))
        .bearer_auth(ADMIN_KEY)
        .header("Accept", "text/csv")
        .send()
        .await
        .expect("csv");
    assert_eq!(csv.status(), StatusCode::OK);
    let text = csv.text().await.expect("text");
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 1 + 3 + 1, "{text}");
    assert!(text.contains(",'=SUM(A1),"), "{text}");
    assert!(
        rows[4].starts_with("totals,,")
            && rows[4].ends_with(&format!(
                "{},{},{},{},{},{}",
                sum[0], sum[1], sum[2], sum[3], sum[4], sum[5]
            )),
        "{text}"
    );
}

/// Who may read usage, and what a bad query answers: another account's
/// kiosk gets 404, a bad `group_by` or period 400, a period not closed yet
/// waits for it.
#[tokio::test]
async fn usage_is_refused_to_others_and_checks_its_query() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let other = app.funded_account(10).await;
    let other_kiosk = app.kiosk_key(other).await;
    let finance = app.finance_key().await;
    let path = format!("/v1/accounts/{account}/usage");
    assert_eq!(
        app.get(&path, &other_kiosk).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(app.get(&path, &finance).await.status(), StatusCode::OK);
    for query in [
        "group_by=booth",
        "from=2026-12-02&to=2026-12-01",
        "from=2024-01-01&to=2026-01-01",
        "since=2026-12-01",
    ] {
        let (status, problem) =
            crate::helpers::problem(app.get(&format!("{path}?{query}"), ADMIN_KEY).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {problem}");
        assert_eq!(problem["code"], "invalid_request", "{query}: {problem}");
    }
    let missing = app
        .get(&format!("/v1/accounts/{}/usage", Uuid::new_v4()), ADMIN_KEY)
        .await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}
