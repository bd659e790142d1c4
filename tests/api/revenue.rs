//! Revenue in money (`GET /v1/revenue`, `GET /v1/revenue/deferred`).
//!
//! The property: random histories on two accounts — credits priced in EUR
//! or USD (promotional ones at 0 among them) or unpriced, with and without
//! expiries; positive adjustments priced or not, removals; reserves, full
//! and partial commits, releases, extensions; grants made to lapse — and after every
//! step an instant; retention passes in between. At every instant the service's deferred revenue, and
//! over every step's period its sales, recognised revenue, breakage,
//! adjustments and tokens, must equal a replay of the exported ledger done
//! here, independently of the service's code: each priced grant's tokens
//! that left it for good, valued in entry order by a cumulative floor, so
//! that a grant used or lapsed entirely recognises exactly its price. The
//! reports' own checks must pass, their tokens must tie out to the
//! reconciliation of the same period, and a period asked twice must answer
//! the same.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Timestamptz, Uuid as SqlUuid};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::retention::{run_pass_exclusive, RetentionSettings};

use crate::helpers::{property_config, TestApp, ADMIN_KEY};

const CURRENCIES: [&str; 2] = ["EUR", "USD"];

#[derive(Clone, Debug)]
enum Price {
    Unpriced,
    Paid(usize, i64),
}

#[derive(Clone, Debug)]
enum Step {
    Credit {
        account: usize,
        tokens: i64,
        price: Price,
        expires: bool,
    },
    Add {
        account: usize,
        tokens: i64,
        price: Price,
    },
    Remove {
        account: usize,
        tokens: i64,
    },
    Reserve {
        account: usize,
        tokens: i64,
    },
    /// Commits `part` (1 … its amount, taken modulo) of a held reservation.
    Commit {
        which: usize,
        part: i64,
    },
    Release {
        which: usize,
    },
    /// Asks a held reservation for a day more (capped at its grants'
    /// lapse): it moves no token.
    Extend {
        which: usize,
    },
    /// One of the account's grants lapses now; the next reserve writes it.
    Lapse {
        account: usize,
        which: usize,
    },
    /// A retention pass pruning everything it may (it never touches the
    /// ledger, the grants or their prices).
    Retention,
}

fn price() -> impl Strategy<Value = Price> {
    prop_oneof![
        1 => Just(Price::Unpriced),
        1 => (0..CURRENCIES.len()).prop_map(|currency| Price::Paid(currency, 0)),
        4 => (0..CURRENCIES.len(), 1..5_000_i64).prop_map(|(c, paid)| Price::Paid(c, paid)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2_usize, 1..8_i64, price(), any::<bool>()).prop_map(
            |(account, tokens, price, expires)| Step::Credit { account, tokens, price, expires }
        ),
        1 => (0..2_usize, 1..5_i64, price())
            .prop_map(|(account, tokens, price)| Step::Add { account, tokens, price }),
        1 => (0..2_usize, 1..5_i64).prop_map(|(account, tokens)| Step::Remove { account, tokens }),
        4 => (0..2_usize, 1..6_i64).prop_map(|(account, tokens)| Step::Reserve { account, tokens }),
        4 => (any::<usize>(), 1..6_i64).prop_map(|(which, part)| Step::Commit { which, part }),
        1 => any::<usize>().prop_map(|which| Step::Release { which }),
        1 => any::<usize>().prop_map(|which| Step::Extend { which }),
        1 => (0..2_usize, any::<usize>()).prop_map(|(account, which)| Step::Lapse { account, which }),
        1 => Just(Step::Retention),
    ]
}

fn instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The database's clock now: after every transaction that answered before.
fn now(conn: &mut PgConnection) -> DateTime<Utc> {
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = Timestamptz)]
        now: DateTime<Utc>,
    }
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result::<Now>(conn)
        .expect("clock")
        .now
}

struct Grant {
    tokens: i64,
    /// (currency, amount_paid); None: unpriced.
    price: Option<(String, i64)>,
}

struct Entry {
    kind: String,
    amount: i64,
    grant: Option<Uuid>,
    at: DateTime<Utc>,
}

/// An admin's GET, as JSON.
async fn json_of(app: &TestApp, path: &str) -> Value {
    app.get(path, ADMIN_KEY).await.json().await.expect(path)
}

/// One account's exported books: its grants and its ledger in entry order.
async fn exported(app: &TestApp, account: Uuid) -> (HashMap<Uuid, Grant>, Vec<Entry>) {
    let mut grants = HashMap::new();
    let page = json_of(app, &format!("/v1/accounts/{account}/grants?limit=1000")).await;
    for grant in page["grants"].as_array().expect("grants") {
        let price = grant["amount_paid"].as_i64().map(|paid| {
            let currency = grant["currency"].as_str().expect("a price has a currency");
            (currency.to_owned(), paid)
        });
        grants.insert(
            grant["grant_id"]
                .as_str()
                .expect("id")
                .parse()
                .expect("uuid"),
            Grant {
                tokens: grant["amount"].as_i64().expect("amount"),
                price,
            },
        );
    }
    let mut entries = Vec::new();
    let mut after = 0_i64;
    loop {
        let path = format!("/v1/accounts/{account}/ledger?after={after}&limit=1000");
        let page = json_of(app, &path).await;
        for entry in page["entries"].as_array().expect("entries") {
            after = entry["entry_id"].as_i64().expect("id");
            entries.push(Entry {
                kind: entry["kind"].as_str().expect("kind").to_owned(),
                amount: entry["amount"].as_i64().expect("amount"),
                grant: entry["grant_id"]
                    .as_str()
                    .map(|id| id.parse().expect("uuid")),
                at: entry["created_at"]
                    .as_str()
                    .expect("at")
                    .parse()
                    .expect("instant"),
            });
        }
        if page["next_after"].is_null() {
            break;
        }
    }
    (grants, entries)
}

/// Money and tokens of one currency (or of the unpriced grants) over a
/// period, replayed from the export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Replayed {
    deferred_opening: i64,
    sales: i64,
    recognized: i64,
    breakage: i64,
    adjustments: i64,
    deferred_closing: i64,
    tokens: [i64; 6],
}

/// The replay of `[from, to)` per currency ("" for the unpriced grants'
/// tokens, whose money stays 0): the tokens each entry takes for good from
/// its grant are valued as floor(paid × gone so far / tokens) less the
/// same before it.
fn replay(
    grants: &HashMap<Uuid, Grant>,
    entries: &[Entry],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BTreeMap<String, Replayed> {
    let mut lines: BTreeMap<String, Replayed> = BTreeMap::new();
    let mut gone: HashMap<Uuid, i64> = HashMap::new();
    let value = |paid: i64, gone: i64, tokens: i64| {
        i64::try_from(i128::from(paid) * i128::from(gone) / i128::from(tokens)).expect("fits")
    };
    for entry in entries.iter().filter(|entry| entry.at < to) {
        let grant = entry
            .grant
            .and_then(|id| grants.get(&id).map(|grant| (id, grant)));
        let (currency, paid, tokens) = match grant {
            Some((
                _,
                Grant {
                    tokens,
                    price: Some((currency, paid)),
                },
            )) => (currency.clone(), *paid, *tokens),
            _ => (String::new(), 0, 1),
        };
        let line = lines.entry(currency.clone()).or_default();
        let before = entry.at < from;
        let made = entry.kind == "credit" || (entry.kind == "adjustment" && entry.amount > 0);
        let taken = match entry.kind.as_str() {
            "commit" | "grant_expire" => entry.amount,
            "adjustment" if entry.amount < 0 => -entry.amount,
            _ => 0,
        };
        let id = entry.grant.unwrap_or_default();
        let so_far = gone.entry(id).or_insert(0);
        let worth = if currency.is_empty() {
            0
        } else {
            value(paid, *so_far + taken, tokens) - value(paid, *so_far, tokens)
        };
        *so_far += taken;
        if made {
            // Deferred revenue is added at the grant's making and taken off
            // as its tokens leave: the balances follow from the flows.
            if before {
                line.deferred_opening += paid;
                line.tokens[0] += entry.amount;
            } else if entry.kind == "credit" {
                line.sales += paid;
                line.tokens[1] += entry.amount;
            } else {
                line.adjustments += paid;
                line.tokens[4] += entry.amount;
            }
            line.deferred_closing += paid;
            line.tokens[5] += entry.amount;
        }
        if taken > 0 {
            if before {
                line.deferred_opening -= worth;
                line.tokens[0] -= taken;
            } else {
                match entry.kind.as_str() {
                    "commit" => {
                        line.recognized += worth;
                        line.tokens[2] += taken;
                    }
                    "grant_expire" => {
                        line.breakage += worth;
                        line.tokens[3] += taken;
                    }
                    _ => {
                        line.adjustments -= worth;
                        line.tokens[4] -= taken;
                    }
                }
            }
            line.deferred_closing -= worth;
            line.tokens[5] -= taken;
        }
    }
    // Every grant's price is its recognised, lapsed, removed and deferred
    // parts (the replay's own check of the cumulative floor).
    for (id, grant) in grants {
        if let Some((_, paid)) = &grant.price {
            let left = gone.get(id).copied().unwrap_or(0);
            assert!(
                left <= grant.tokens,
                "grant {id}: more tokens left it than it held"
            );
            if left == grant.tokens {
                assert_eq!(value(*paid, left, grant.tokens), *paid);
            }
        }
    }
    lines
}

fn tokens_of(figures: &Value) -> [i64; 6] {
    [
        "deferred_opening",
        "sold",
        "used",
        "lapsed",
        "adjusted",
        "deferred_closing",
    ]
    .map(|name| figures[name].as_i64().expect(name))
}

/// The service's report of `[from, to)` for `account`, as the replay's shape.
fn served(report: &Value) -> BTreeMap<String, Replayed> {
    let account = &report["accounts"][0];
    let mut lines: BTreeMap<String, Replayed> = account["currencies"]
        .as_array()
        .expect("currencies")
        .iter()
        .map(|line| {
            let money = |name: &str| line[name].as_i64().expect(name);
            (
                line["currency"].as_str().expect("currency").to_owned(),
                Replayed {
                    deferred_opening: money("deferred_opening"),
                    sales: money("sales"),
                    recognized: money("recognized"),
                    breakage: money("breakage"),
                    adjustments: money("adjustments"),
                    deferred_closing: money("deferred_closing"),
                    tokens: tokens_of(&line["tokens"]),
                },
            )
        })
        .collect();
    lines.insert(
        String::new(),
        Replayed {
            tokens: tokens_of(&account["unpriced_tokens"]),
            ..Replayed::default()
        },
    );
    lines
}

/// A report once `to` has closed (409 instant_not_closed is retried).
async fn report(app: &TestApp, path: &str) -> Value {
    for _ in 0..50 {
        let response = app.get(path, ADMIN_KEY).await;
        if response.status() == StatusCode::CONFLICT {
            continue;
        }
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        return response.json().await.expect("json");
    }
    panic!("{path}: never closed");
}

struct History {
    accounts: [Uuid; 2],
    kiosks: [String; 2],
    /// Held reservations: (account, id, tokens).
    held: Vec<(usize, Uuid, i64)>,
    grants: [Vec<Uuid>; 2],
    references: u64,
}

impl History {
    fn reference(&mut self) -> String {
        self.references += 1;
        format!("revenue-{}-{}", Uuid::new_v4().simple(), self.references)
    }
}

fn priced(body: &mut Value, price: &Price) {
    if let Price::Paid(currency, paid) = price {
        body["amount_paid"] = json!(paid);
        body["currency"] = json!(CURRENCIES[*currency]);
    }
}

async fn apply(app: &TestApp, conn: &mut PgConnection, history: &mut History, step: &Step) {
    match step {
        Step::Retention => {
            let zero = Some(std::time::Duration::ZERO);
            let settings = RetentionSettings {
                idempotency_keys: zero,
                events: zero,
                webhook_attempts: zero,
                audit_events: zero,
                archive_dir: None,
                batch: 5_000,
                batches_max: usize::MAX,
                pause: std::time::Duration::ZERO,
            };
            // (None: another pass holds the lock; the next step goes on.)
            run_pass_exclusive(conn, &settings, None).expect("a retention pass");
        }
        Step::Credit {
            account,
            tokens,
            price,
            expires,
        } => {
            let mut body = json!({"amount": tokens, "external_ref": history.reference()});
            if *expires {
                body["expires_at"] = json!(instant(Utc::now() + chrono::Duration::days(30)));
            }
            priced(&mut body, price);
            let id = history.accounts[*account];
            let answer = app
                .post(&format!("/v1/accounts/{id}/credits"), ADMIN_KEY, &body)
                .await;
            assert_eq!(answer.status(), StatusCode::CREATED);
            let answer: Value = answer.json().await.expect("json");
            assert_eq!(
                answer["amount_paid"],
                body.get("amount_paid").cloned().unwrap_or(Value::Null)
            );
            let grant = answer["grant_id"]
                .as_str()
                .expect("grant")
                .parse()
                .expect("uuid");
            history.grants[*account].push(grant);
        }
        Step::Add {
            account,
            tokens,
            price,
        } => {
            let mut body = json!({"amount": tokens, "reason": "goodwill",
                                  "external_ref": history.reference()});
            priced(&mut body, price);
            let id = history.accounts[*account];
            let answer = app
                .post(&format!("/v1/accounts/{id}/adjustments"), ADMIN_KEY, &body)
                .await;
            assert_eq!(answer.status(), StatusCode::CREATED);
        }
        Step::Remove { account, tokens } => {
            let body = json!({"amount": -tokens, "reason": "correction",
                              "external_ref": history.reference()});
            let id = history.accounts[*account];
            let answer = app
                .post(&format!("/v1/accounts/{id}/adjustments"), ADMIN_KEY, &body)
                .await;
            assert!(
                [StatusCode::CREATED, StatusCode::PAYMENT_REQUIRED].contains(&answer.status()),
                "a removal: {}",
                answer.status()
            );
        }
        Step::Reserve { account, tokens } => {
            let id = history.accounts[*account];
            let answer = app
                .reserve(id, &history.kiosks[*account], Uuid::new_v4(), *tokens)
                .await;
            if answer.status() == StatusCode::CREATED {
                let body: Value = answer.json().await.expect("json");
                let reservation = body["reservation_id"]
                    .as_str()
                    .expect("id")
                    .parse()
                    .expect("uuid");
                history.held.push((*account, reservation, *tokens));
            }
        }
        Step::Commit { which, part } => {
            if history.held.is_empty() {
                return;
            }
            let (account, reservation, tokens) = history.held.remove(which % history.held.len());
            let id = history.accounts[account];
            let answer = app
                .post(
                    &format!("/v1/accounts/{id}/reservations/{reservation}/commit"),
                    &history.kiosks[account],
                    &json!({"amount": 1 + (part - 1) % tokens}),
                )
                .await;
            assert_eq!(answer.status(), StatusCode::OK, "a commit");
        }
        Step::Release { which } => {
            if history.held.is_empty() {
                return;
            }
            let (account, reservation, _) = history.held.remove(which % history.held.len());
            let id = history.accounts[account];
            let answer = app
                .post(
                    &format!("/v1/accounts/{id}/reservations/{reservation}/release"),
                    &history.kiosks[account],
                    &json!({}),
                )
                .await;
            assert_eq!(answer.status(), StatusCode::OK, "a release");
        }
        Step::Extend { which } => {
            if history.held.is_empty() {
                return;
            }
            let (account, reservation, _) = history.held[which % history.held.len()];
            let id = history.accounts[account];
            let answer = app
                .post(
                    &format!("/v1/accounts/{id}/reservations/{reservation}/extend"),
                    &history.kiosks[account],
                    &json!({"ttl_seconds": 86_400}),
                )
                .await;
            assert!(
                !answer.status().is_server_error(),
                "an extension: {}",
                answer.status()
            );
        }
        Step::Lapse { account, which } => {
            let grants = &history.grants[*account];
            if grants.is_empty() {
                return;
            }
            let grant = grants[which % grants.len()];
            diesel::sql_query(
                "UPDATE credit_grants SET expires_at = clock_timestamp() \
                 WHERE id = $1 AND expired_at IS NULL",
            )
            .bind::<SqlUuid, _>(grant)
            .execute(conn)
            .expect("lapse");
            // A reserve writes the lapse first, whatever it answers.
            let id = history.accounts[*account];
            let answer = app
                .reserve(id, &history.kiosks[*account], Uuid::new_v4(), 1)
                .await;
            if answer.status() == StatusCode::CREATED {
                let body: Value = answer.json().await.expect("json");
                let reservation = body["reservation_id"]
                    .as_str()
                    .expect("id")
                    .parse()
                    .expect("uuid");
                history.held.push((*account, reservation, 1));
            }
        }
    }
}

async fn run_history(steps: &[Step]) {
    let app = TestApp::spawn_with(|config| {
        config.worker_concurrency = 0;
        config.reaper_schedule = "0 0 0 1 1 *".into();
    })
    .await;
    let mut conn = app.database.connect();
    let mut accounts = [Uuid::nil(); 2];
    let mut kiosks = [String::new(), String::new()];
    for index in 0..2 {
        accounts[index] = app.create_account(0).await;
        kiosks[index] = app.kiosk_key(accounts[index]).await;
    }
    let mut history = History {
        accounts,
        kiosks,
        held: Vec::new(),
        grants: [Vec::new(), Vec::new()],
        references: 0,
    };
    let mut instants = vec![now(&mut conn)];
    for step in steps {
        apply(&app, &mut conn, &mut history, step).await;
        instants.push(now(&mut conn));
    }
    for (index, account) in accounts.iter().enumerate() {
        let (grants, entries) = exported(&app, *account).await;
        for pair in instants.windows(2) {
            let (from, to) = (instant(pair[0]), instant(pair[1]));
            let path = format!("/v1/revenue?from={from}&to={to}&account_id={account}");
            let period = report(&app, &path).await;
            assert_eq!(period["status"], "ok", "{}", period["discrepancies"]);
            let expected = replay(&grants, &entries, pair[0], pair[1]);
            let mut actual = served(&period);
            // The replay has an unpriced line only where an unpriced
            // grant (or an entry of none) moved before `to`.
            if !expected.contains_key("") && actual[""] == Replayed::default() {
                actual.remove("");
            }
            assert_eq!(actual, expected, "account {index}, period {from} .. {to}");
            // Tokens tie out with the reconciliation of the same period.
            let books = report(
                &app,
                &format!("/v1/reconciliation?from={from}&to={to}&account_id={account}"),
            )
            .await;
            let line = &books["accounts"][0];
            let sum = |figure: usize| actual.values().map(|line| line.tokens[figure]).sum::<i64>();
            for (figure, name) in [
                (0, "opening"),
                (1, "credited"),
                (2, "committed"),
                (3, "grant_expired"),
                (4, "adjusted"),
                (5, "closing"),
            ] {
                assert_eq!(sum(figure), line[name].as_i64().expect(name), "{name}");
            }
            // The deferred balance at `to` is the period's closing.
            let deferred = report(
                &app,
                &format!("/v1/revenue/deferred?as_of={to}&account_id={account}"),
            )
            .await;
            for line in deferred["accounts"].as_array().expect("lines") {
                let currency = line["currency"].as_str().expect("currency");
                assert_eq!(line["deferred"], json!(expected[currency].deferred_closing));
                assert_eq!(line["deferred_tokens"], json!(expected[currency].tokens[5]));
            }
        }
        // The whole history once more: asked twice, the same answer.
        let whole = format!(
            "/v1/revenue?from={}&to={}&account_id={account}",
            instant(instants[0]),
            instant(*instants.last().expect("instants"))
        );
        assert_eq!(
            report(&app, &whole).await["accounts"],
            report(&app, &whole).await["accounts"]
        );
    }
}

#[test]
fn revenue_replays_from_the_exported_ledger_at_every_instant() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cases = std::env::var("REVENUE_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(8);
    let mut runner = TestRunner::new(property_config(cases));
    runner
        .run(&prop::collection::vec(step(), 8..30), |steps| {
            runtime.block_on(run_history(&steps));
            Ok(())
        })
        .expect("the service's revenue equals the ledger's replay");
}

/// The cumulative floor by hand: 3 tokens bought for 10.00 EUR and used one
/// at a time recognise 3.33, 3.33 and 3.34 — exactly the price, where a
/// floor per draw would leave a cent deferred forever.
#[actix_web::test]
async fn a_grant_used_entirely_recognises_exactly_its_price() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let kiosk = app.kiosk_key(account).await;
    let credit = app
        .post(
            &format!("/v1/accounts/{account}/credits"),
            ADMIN_KEY,
            &json!({"amount": 3, "external_ref": "invoice-3-for-1000",
                    "amount_paid": 1000, "currency": "EUR"}),
        )
        .await;
    assert_eq!(credit.status(), StatusCode::CREATED);
    let mut conn = app.database.connect();
    let start = now(&mut conn);
    let mut recognized = Vec::new();
    let mut from = start;
    for _ in 0..3 {
        let held: Value = app
            .reserve(account, &kiosk, Uuid::new_v4(), 1)
            .await
            .json()
            .await
            .expect("json");
        let reservation = held["reservation_id"].as_str().expect("id");
        let committed = app
            .post(
                &format!("/v1/accounts/{account}/reservations/{reservation}/commit"),
                &kiosk,
                &json!({"amount": 1}),
            )
            .await;
        assert_eq!(committed.status(), StatusCode::OK);
        let to = now(&mut conn);
        let period = report(
            &app,
            &format!(
                "/v1/revenue?from={}&to={}&account_id={account}",
                instant(from),
                instant(to)
            ),
        )
        .await;
        recognized.push(
            period["currencies"][0]["recognized"]
                .as_i64()
                .expect("recognized"),
        );
        from = to;
    }
    assert_eq!(recognized, [333, 333, 334]);
    let deferred = report(
        &app,
        &format!(
            "/v1/revenue/deferred?as_of={}&account_id={account}",
            instant(from)
        ),
    )
    .await;
    assert_eq!(
        deferred["totals"],
        json!([{"currency": "EUR", "deferred": 0, "deferred_tokens": 0}])
    );
    // A kiosk cannot read the books.
    let refused = app.get("/v1/revenue", &kiosk).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // The CSV: the row of the account's EUR, in integer minor units.
    let csv = app
        .client
        .get(app.url(&format!(
            "/v1/revenue?from={}&to={}&account_id={account}",
            instant(start),
            instant(from)
        )))
        .bearer_auth(ADMIN_KEY)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("csv")
        .text()
        .await
        .expect("text");
    assert!(
        csv.lines().any(|row| row.starts_with(&format!(
            "{account},kiosk fleet,EUR,1000,0,1000,0,0,0,3,0,3,0,0,0,ok"
        ))),
        "{csv}"
    );
}

/// A price is both fields or neither, an ISO 4217 code, whole minor units,
/// never on a removal, and part of a credit's idempotent body.
#[actix_web::test]
async fn a_price_is_checked_and_replayed() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let path = format!("/v1/accounts/{account}/credits");
    for (body, says) in [
        (
            json!({"amount": 1, "external_ref": "p1", "amount_paid": 100}),
            "go together",
        ),
        (
            json!({"amount": 1, "external_ref": "p1", "currency": "EUR"}),
            "go together",
        ),
        (
            json!({"amount": 1, "external_ref": "p1", "amount_paid": 100, "currency": "EURO"}),
            "ISO 4217",
        ),
        (
            json!({"amount": 1, "external_ref": "p1", "amount_paid": 1.5, "currency": "EUR"}),
            "amount_paid",
        ),
        (
            json!({"amount": 1, "external_ref": "p1", "amount_paid": -1, "currency": "EUR"}),
            "amount_paid",
        ),
    ] {
        let answer = app.post(&path, ADMIN_KEY, &body).await;
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{body}");
        let problem: Value = answer.json().await.expect("json");
        assert!(
            problem["detail"].as_str().expect("detail").contains(says),
            "{problem}"
        );
    }
    let removal = app
        .post(
            &format!("/v1/accounts/{account}/adjustments"),
            ADMIN_KEY,
            &json!({"amount": -1, "reason": "x", "external_ref": "p2",
                    "amount_paid": 100, "currency": "EUR"}),
        )
        .await;
    assert_eq!(removal.status(), StatusCode::BAD_REQUEST);
    let body = json!({"amount": 2, "external_ref": "p3", "amount_paid": 500, "currency": "USD"});
    assert_eq!(
        app.post(&path, ADMIN_KEY, &body).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.post(&path, ADMIN_KEY, &body).await.status(),
        StatusCode::OK
    );
    let other = json!({"amount": 2, "external_ref": "p3", "amount_paid": 501, "currency": "USD"});
    assert_eq!(
        app.post(&path, ADMIN_KEY, &other).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // Nothing of the refusals was written: 5 unpriced tokens, 2 priced.
    let grants = json_of(&app, &format!("/v1/accounts/{account}/grants")).await;
    let prices: Vec<Value> = grants["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .map(|grant| json!([grant["amount"], grant["amount_paid"], grant["currency"]]))
        .collect();
    assert_eq!(prices, [json!([5, null, null]), json!([2, 500, "USD"])]);
}

/// A fixed top-up rule of mode grant may price the grants it makes; a
/// target rule (its grants' size varies) or a request rule (the customer's
/// credit carries its own price) may not.
#[actix_web::test]
async fn a_top_up_rule_prices_its_grants() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    let made = crate::topups::rule(
        &app,
        account,
        json!({"trigger": "threshold", "threshold_tokens": 5, "method": "fixed", "tokens": 10,
               "amount_paid": 2500, "currency": "EUR"}),
    )
    .await;
    assert_eq!(
        (made["amount_paid"].clone(), made["currency"].clone()),
        (json!(2500), json!("EUR"))
    );
    // Judged at its creation: the empty account is below its line.
    let grants = json_of(&app, &format!("/v1/accounts/{account}/grants")).await;
    let grant = &grants["grants"][0];
    assert_eq!(grant["topup_rule_id"], made["rule_id"], "{grants}");
    assert_eq!(
        (
            grant["amount"].clone(),
            grant["amount_paid"].clone(),
            grant["currency"].clone()
        ),
        (json!(10), json!(2500), json!("EUR"))
    );
    for body in [
        json!({"trigger": "threshold", "threshold_tokens": 5, "method": "target",
               "target_tokens": 20, "amount_paid": 2500, "currency": "EUR"}),
        json!({"trigger": "schedule", "period": "daily", "method": "fixed", "tokens": 10,
               "mode": "request", "amount_paid": 2500, "currency": "EUR"}),
    ] {
        let refused = app
            .post(
                &format!("/v1/accounts/{account}/topup-rules"),
                ADMIN_KEY,
                &body,
            )
            .await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{body}");
    }
}

/// Money is never a float: every money member of the OpenAPI document is an
/// integer.
#[actix_web::test]
async fn money_is_an_integer_in_the_api_document() {
    let app = TestApp::spawn().await;
    let doc = json_of(&app, "/openapi.json").await;
    let money = [
        "amount_paid",
        "deferred",
        "deferred_opening",
        "deferred_closing",
        "sales",
        "recognized",
        "breakage",
        "adjustments",
    ];
    let mut seen = 0;
    for (name, schema) in doc["components"]["schemas"].as_object().expect("schemas") {
        let Some(properties) = schema["properties"].as_object() else {
            continue;
        };
        for (member, property) in properties {
            if money.contains(&member.as_str()) {
                seen += 1;
                assert!(integer(&doc, property), "{name}.{member}: {property}");
            }
        }
    }
    assert!(seen >= 10, "only {seen} money members found");
}

/// Whether a schema is an integer (or null), following `$ref`s and the
/// members of a `oneOf` / `anyOf`.
fn integer(doc: &Value, schema: &Value) -> bool {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        return integer(doc, &doc["components"]["schemas"][name]);
    }
    for union in ["oneOf", "anyOf"] {
        if let Some(members) = schema[union].as_array() {
            return members
                .iter()
                .filter(|member| member["type"] != json!("null"))
                .all(|member| integer(doc, member));
        }
    }
    let types = match &schema["type"] {
        Value::Array(types) => types.clone(),
        single => vec![single.clone()],
    };
    types.contains(&json!("integer")) && !types.contains(&json!("number"))
}
