//! Credit grants: priorities and draws through the API, the grants
//! endpoint, and the upgrade that turned earlier balances into grants.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Uuid as SqlUuid;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use token_billing::domain::checks::{find_violations, grants_disagreeing_with_ledger};

use crate::helpers::{json_rows, problem, TestApp, ADMIN_KEY};

/// One ledger entry: kind, amount, the grant it names.
type Named = (String, i64, Option<Uuid>);

fn entries_naming_grants(conn: &mut PgConnection, account: Uuid) -> Vec<Named> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        kind: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        amount: i64,
        #[diesel(sql_type = diesel::sql_types::Nullable<SqlUuid>)]
        grant_id: Option<Uuid>,
    }
    diesel::sql_query(
        "SELECT kind, amount, grant_id FROM ledger_entries WHERE account_id = $1 ORDER BY id",
    )
    .bind::<SqlUuid, _>(account)
    .load::<Row>(conn)
    .expect("entries")
    .into_iter()
    .map(|row| (row.kind, row.amount, row.grant_id))
    .collect()
}

async fn credit(app: &TestApp, account: Uuid, body: &Value) -> (StatusCode, Value) {
    let response = app
        .post(&format!("/v1/accounts/{account}/credits"), ADMIN_KEY, body)
        .await;
    let status = response.status();
    (status, response.json().await.expect("json"))
}

fn uuid(value: &Value) -> Uuid {
    value.as_str().expect("a uuid").parse().expect("uuid")
}

async fn grants(app: &TestApp, account: Uuid, key: &str, query: &str) -> (StatusCode, Value) {
    let response = app
        .get(&format!("/v1/accounts/{account}/grants{query}"), key)
        .await;
    let status = response.status();
    (status, response.json().await.expect("json"))
}

fn assert_books_clean(conn: &mut PgConnection) {
    let violations = find_violations(conn).expect("checks");
    assert!(violations.is_empty(), "{violations:#?}");
    let grants = grants_disagreeing_with_ledger(conn).expect("grant check");
    assert!(grants.is_empty(), "{grants:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_zero_is_drawn_first_and_a_commit_consumes_in_draw_order() {
    let app = TestApp::spawn().await;
    let account = app.create_account(0).await;
    // The paid credit first, the promotional one (priority 0) after it.
    let paid_ref = Uuid::new_v4().to_string();
    let (status, paid) = credit(
        &app,
        account,
        &json!({"amount": 5, "external_ref": paid_ref}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["priority"], 50, "the default priority");
    assert_eq!(paid["expires_at"], Value::Null);
    assert_eq!(
        paid["grant_id"], paid["credit_id"],
        "a credit's grant has its id"
    );
    let (status, promo) = credit(
        &app,
        account,
        &json!({"amount": 5, "external_ref": "promo-1", "priority": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{promo}");
    assert_eq!(promo["priority"], 0);
    let (paid_grant, promo_grant) = (uuid(&paid["grant_id"]), uuid(&promo["grant_id"]));

    // A replay with another priority is another body.
    let (status, body) = credit(
        &app,
        account,
        &json!({"amount": 5, "external_ref": "promo-1", "priority": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["code"], "idempotency_key_reused");
    let (status, replayed) = credit(
        &app,
        account,
        &json!({"amount": 5, "external_ref": "promo-1", "priority": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replayed["grant_id"], promo["grant_id"]);

    // 8 tokens span both grants: the promotional one first.
    let reservation: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 8)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        reservation["draws"],
        json!([{"grant_id": promo_grant, "amount": 5}, {"grant_id": paid_grant, "amount": 3}])
    );
    // Commit 6: 5 from the promotional grant, 1 from the paid one; the
    // other 2 go back to the paid grant.
    let id = reservation["reservation_id"].as_str().expect("id");
    let response = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/commit"),
            ADMIN_KEY,
            &json!({"amount": 6}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);

    let mut conn = app.conn();
    assert_eq!(
        entries_naming_grants(&mut conn, account),
        vec![
            ("credit".to_owned(), 5, Some(paid_grant)),
            ("credit".to_owned(), 5, Some(promo_grant)),
            ("reserve".to_owned(), 5, Some(promo_grant)),
            ("reserve".to_owned(), 3, Some(paid_grant)),
            ("commit".to_owned(), 5, Some(promo_grant)),
            ("commit".to_owned(), 1, Some(paid_grant)),
            ("release".to_owned(), 2, Some(paid_grant)),
        ]
    );
    let (status, page) = grants(&app, account, ADMIN_KEY, "").await;
    assert_eq!(status, StatusCode::OK);
    let seen: Vec<Value> = page["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .map(|g| json!([g["grant_id"], g["remaining"], g["reserved"], g["status"]]))
        .collect();
    // The paid grant got 2 back and still holds 4; the promotional one is spent.
    assert_eq!(
        seen,
        vec![
            json!([paid_grant, 4, 0, "active"]),
            json!([promo_grant, 0, 0, "depleted"]),
        ]
    );
    let account_view = app.account(account).await;
    assert_eq!(
        (&account_view["available"], &account_view["used"]),
        (&json!(4), &json!(6))
    );

    // A removal draws in draw order too: the paid grant is all that is left.
    let response = app
        .post(
            &format!("/v1/accounts/{account}/adjustments"),
            ADMIN_KEY,
            &json!({"amount": -3, "reason": "correction", "external_ref": "fix-1"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let adjusted: Value = response.json().await.expect("json");
    assert_eq!(adjusted["grant_id"], Value::Null);
    assert_eq!(
        entries_naming_grants(&mut conn, account).last(),
        Some(&("adjustment".to_owned(), -3, Some(paid_grant)))
    );
    assert_books_clean(&mut conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_priorities_and_unknown_fields_change_nothing() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let before = app.snapshot(account);
    for body in [
        json!({"amount": 1, "external_ref": "p1", "priority": 101}),
        json!({"amount": 1, "external_ref": "p2", "priority": -1}),
        json!({"amount": 1, "external_ref": "p3", "priority": "high"}),
        json!({"amount": 1, "external_ref": "p4", "priority": 1.5}),
        json!({"amount": 1, "external_ref": "p5", "expiry": "2030-01-01T00:00:00Z"}),
    ] {
        let response = app
            .post(&format!("/v1/accounts/{account}/credits"), ADMIN_KEY, &body)
            .await;
        let (status, problem) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem["code"], "invalid_request", "{body}");
    }
    // A removal makes no grant: it takes no priority.
    let response = app
        .post(
            &format!("/v1/accounts/{account}/adjustments"),
            ADMIN_KEY,
            &json!({"amount": -1, "reason": "correction", "external_ref": "a1", "priority": 0}),
        )
        .await;
    let (status, problem) = problem(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["code"], "invalid_request");
    assert_eq!(app.snapshot(account), before);
    // A positive adjustment makes a grant of its priority.
    let response = app
        .post(
            &format!("/v1/accounts/{account}/adjustments"),
            ADMIN_KEY,
            &json!({"amount": 2, "reason": "goodwill", "external_ref": "a2", "priority": 7}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let adjusted: Value = response.json().await.expect("json");
    assert_eq!(adjusted["priority"], 7);
    assert_eq!(adjusted["grant_id"], adjusted["adjustment_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grants_list_pages_filters_and_answers_only_who_may_read() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    app.credit(account, 4).await;
    let other = app.funded_account(1).await;
    let own_kiosk = app.kiosk_key(account).await;
    let other_kiosk = app.kiosk_key(other).await;
    let finance = app.finance_key().await;

    for key in [ADMIN_KEY, own_kiosk.as_str(), finance.as_str()] {
        let (status, page) = grants(&app, account, key, "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(page["grants"].as_array().expect("grants").len(), 2);
        assert_eq!(page["next_after"], Value::Null);
    }
    let response = app
        .get(&format!("/v1/accounts/{account}/grants"), &other_kiosk)
        .await;
    let (status, body) = problem(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    let (status, first) = grants(&app, account, ADMIN_KEY, "?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["grants"][0]["amount"], 3);
    let after = first["next_after"].as_str().expect("a cursor").to_owned();
    let (_, second) = grants(&app, account, ADMIN_KEY, &format!("?limit=1&after={after}")).await;
    assert_eq!(second["grants"][0]["amount"], 4);
    assert_eq!(second["next_after"], Value::Null);

    let (_, active) = grants(&app, account, ADMIN_KEY, "?status=active").await;
    assert_eq!(active["grants"].as_array().expect("grants").len(), 2);
    let (_, depleted) = grants(&app, account, ADMIN_KEY, "?status=depleted").await;
    assert_eq!(depleted["grants"], json!([]));
    let (status, expired) = grants(&app, account, ADMIN_KEY, "?status=expired").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(expired["grants"], json!([]));

    for query in [
        "?status=gone",
        "?limit=0",
        "?limit=1001",
        "?after=not-a-uuid",
        &format!("?after={}", Uuid::new_v4()),
        "?colour=blue",
    ] {
        let response = app
            .get(&format!("/v1/accounts/{account}/grants{query}"), ADMIN_KEY)
            .await;
        let (status, body) = problem(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["code"], "invalid_request", "{query}");
    }
}

/// The last migration's down and up again, on a database whose accounts
/// have history and held reservations: the state of a database upgraded
/// from the release before grants (the engine's entries then named no
/// grant, and the down migration drops those columns with the grants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_turns_balances_into_grants_and_the_books_still_reconcile() {
    let app = TestApp::spawn().await;
    let busy = app.funded_account(20).await;
    let kiosk = app.kiosk_key(busy).await;
    let idle = app.funded_account(5).await;
    let empty = app.create_account(0).await;
    // History on `busy`: a committed and a released reservation, then two
    // held ones.
    for verb in ["commit", "release"] {
        let reservation: Value = app
            .reserve(busy, &kiosk, Uuid::new_v4(), 3)
            .await
            .json()
            .await
            .expect("json");
        let id = reservation["reservation_id"].as_str().expect("id");
        let response = app
            .post(
                &format!("/v1/accounts/{busy}/reservations/{id}/{verb}"),
                &kiosk,
                &json!({}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let mut held = Vec::new();
    for amount in [2, 4] {
        let reservation: Value = app
            .reserve(busy, &kiosk, Uuid::new_v4(), amount)
            .await
            .json()
            .await
            .expect("json");
        held.push(uuid(&reservation["reservation_id"]));
    }

    let mut conn = app.conn();
    // Back to before grants (their expiry first), and up again.
    let down = [
        include_str!("../../migrations/2026-12-06-000030_rollover/down.sql"),
        include_str!("../../migrations/2026-12-06-000001_grant_prices/down.sql"),
        include_str!("../../migrations/2026-12-04-000010_row_rules_whole_row/down.sql"),
        include_str!("../../migrations/2026-12-04-000001_row_rules/down.sql"),
        include_str!("../../migrations/2026-12-03-000020_counts_nonnegative/down.sql"),
        include_str!("../../migrations/2026-12-03-000010_topup_rules/down.sql"),
        include_str!("../../migrations/2026-12-02-000040_grant_updates_hot/down.sql"),
        include_str!("../../migrations/2026-12-02-000030_grant_expiry/down.sql"),
        include_str!("../../migrations/2026-12-02-000020_credit_grants/down.sql"),
    ];
    let up = [
        include_str!("../../migrations/2026-12-02-000020_credit_grants/up.sql"),
        include_str!("../../migrations/2026-12-02-000030_grant_expiry/up.sql"),
        include_str!("../../migrations/2026-12-02-000040_grant_updates_hot/up.sql"),
        include_str!("../../migrations/2026-12-03-000010_topup_rules/up.sql"),
        include_str!("../../migrations/2026-12-03-000020_counts_nonnegative/up.sql"),
        include_str!("../../migrations/2026-12-04-000001_row_rules/up.sql"),
        include_str!("../../migrations/2026-12-04-000010_row_rules_whole_row/up.sql"),
        include_str!("../../migrations/2026-12-06-000001_grant_prices/up.sql"),
        include_str!("../../migrations/2026-12-06-000030_rollover/up.sql"),
    ];
    for down in down {
        conn.batch_execute(&format!("BEGIN; {down} COMMIT;"))
            .expect("down");
    }
    for up in up {
        conn.batch_execute(&format!("BEGIN; {up} COMMIT;"))
            .expect("up");
    }

    #[derive(QueryableByName, Debug, PartialEq)]
    struct GrantRow {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
        #[diesel(sql_type = SqlUuid)]
        account_id: Uuid,
        #[diesel(sql_type = diesel::sql_types::Text)]
        source: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        amount: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        remaining: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        reserved: i64,
        #[diesel(sql_type = diesel::sql_types::SmallInt)]
        priority: i16,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    }
    let made: Vec<GrantRow> = diesel::sql_query(
        "SELECT id, account_id, source, amount, remaining, reserved, priority, expires_at \
         FROM credit_grants ORDER BY seq",
    )
    .load(&mut conn)
    .expect("grants");
    // busy: 20 credited, 3 used, 6 held → 11 available; idle: 5; empty: none.
    let by_account = |account: Uuid| made.iter().filter(move |g| g.account_id == account);
    let busy_grant = by_account(busy).next().expect("busy's grant");
    assert_eq!(by_account(busy).count(), 1);
    assert_eq!(
        (
            busy_grant.source.as_str(),
            busy_grant.amount,
            busy_grant.remaining,
            busy_grant.reserved
        ),
        ("upgrade", 17, 11, 6)
    );
    assert_eq!((busy_grant.priority, busy_grant.expires_at), (50, None));
    let idle_grant = by_account(idle).next().expect("idle's grant");
    assert_eq!(
        (idle_grant.amount, idle_grant.remaining, idle_grant.reserved),
        (5, 5, 0)
    );
    assert_eq!(by_account(empty).count(), 0);
    for (id, amount) in held.iter().zip([2, 4]) {
        let draws: Value = token_billing::db::schema::reservations::table
            .find(id)
            .select(token_billing::db::schema::reservations::draws)
            .first(&mut conn)
            .expect("draws");
        assert_eq!(
            draws,
            json!([{"grant_id": busy_grant.id, "amount": amount}])
        );
    }
    assert_books_clean(&mut conn);
    let report = token_billing::domain::reconciliation::reconcile(
        &mut conn,
        chrono::Utc::now() - chrono::Duration::days(1),
        chrono::Utc::now() + chrono::Duration::seconds(1),
        None,
    )
    .expect("reconciliation");
    assert_eq!(report.status, "ok", "{:#?}", report.discrepancies);

    // A service started on the upgraded database (as after a real
    // upgrade: the replicas that ran before it are gone, and with them
    // their connections' cached row types) goes on from the upgraded
    // books: a partial commit of a held reservation returns the rest to
    // the upgrade's grant, and a new credit is drawn after it (same
    // priority, newer).
    let before = app;
    let app = before.spawn_replica(|_| {}).await;
    drop(before);
    let response = app
        .post(
            &format!("/v1/accounts/{busy}/reservations/{}/commit", held[1]),
            &kiosk,
            &json!({"amount": 1}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let (_, fresh) = credit(
        &app,
        busy,
        &json!({"amount": 2, "external_ref": "after-upgrade"}),
    )
    .await;
    let reservation: Value = app
        .reserve(busy, &kiosk, Uuid::new_v4(), 15)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        reservation["draws"],
        json!([{"grant_id": busy_grant.id, "amount": 14}, {"grant_id": fresh["grant_id"], "amount": 1}])
    );
    assert_books_clean(&mut conn);
}

/// A held reservation without draws (none should exist: reservations are
/// made with their draws and the upgrade gave each held one its draw) is
/// named by the checks, and settling it still moves its tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_without_draws_is_reported_and_loses_no_token() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let reservation: Value = app
        .reserve(account, ADMIN_KEY, Uuid::new_v4(), 4)
        .await
        .json()
        .await
        .expect("json");
    let id = uuid(&reservation["reservation_id"]);
    let mut conn = app.conn();
    diesel::sql_query("UPDATE reservations SET draws = '[]' WHERE id = $1")
        .bind::<SqlUuid, _>(id)
        .execute(&mut conn)
        .expect("corrupt");
    let checks: Vec<String> = find_violations(&mut conn)
        .expect("checks")
        .into_iter()
        .map(|d| d.check)
        .collect();
    assert_eq!(checks, vec!["held_reservations_drawn_from_grants"]);
    let response = app
        .post(
            &format!("/v1/accounts/{account}/reservations/{id}/release"),
            ADMIN_KEY,
            &json!({}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let view = app.account(account).await;
    assert_eq!(
        (&view["available"], &view["reserved"]),
        (&json!(10), &json!(0))
    );
    assert_eq!(
        entries_naming_grants(&mut conn, account).last(),
        Some(&("release".to_owned(), 4, None))
    );
    // The grant still holds the 4 as reserved: its books disagree with the
    // account's, and the checks say so.
    let checks: Vec<String> = find_violations(&mut conn)
        .expect("checks")
        .into_iter()
        .map(|d| d.check)
        .collect();
    assert_eq!(
        checks,
        vec![
            "grants_remaining_equals_available",
            "grants_reserved_equals_reserved"
        ]
    );
}

/// The database refuses a negative count in accounts and in credit_grants,
/// each one (one rule names them all since the migration counts_nonnegative,
/// and the table's rule function refuses it under that name since
/// row_rules): every count set to -1 alone — the grant's books
/// kept balanced by another count, so that only this rule can refuse it —
/// is refused by that constraint, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_a_negative_count() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(5).await;
    let mut conn = app.conn();
    let snapshot = |conn: &mut PgConnection| {
        json_rows(
            conn,
            "SELECT to_jsonb(a) AS row FROM accounts a WHERE a.id = $1 \
             UNION ALL SELECT to_jsonb(g) FROM credit_grants g WHERE g.account_id = $1",
            account,
        )
    };
    let before = snapshot(&mut conn);
    let accounts = [
        "available",
        "reserved",
        "used",
        "credited",
        "active_reservations",
        "max_active_reservations",
        "low_balance_threshold",
        "grant_expired",
        "topup_threshold",
    ]
    .map(|column| {
        (
            format!("UPDATE accounts SET {column} = -1 WHERE id = $1"),
            "accounts_counts_nonnegative",
        )
    });
    // A grant's counts sum to its amount (credit_grants_books): the count
    // made -1 gives what it held and one more to another.
    let grants = [
        ("remaining", "consumed"),
        ("reserved", "consumed"),
        ("consumed", "debited"),
        ("debited", "consumed"),
        ("expired", "consumed"),
    ]
    .map(|(column, other)| {
        // drawable follows remaining (credit_grants_drawable).
        let drawable = if column == "remaining" {
            "false"
        } else {
            "drawable"
        };
        (
            format!(
                "UPDATE credit_grants SET {other} = {other} + {column} + 1, {column} = -1, \
                 drawable = {drawable} WHERE account_id = $1"
            ),
            "credit_grants_counts_nonnegative",
        )
    });
    let opening = [(
        "UPDATE credit_grants SET opening_reserved = -1 WHERE account_id = $1".to_string(),
        "credit_grants_counts_nonnegative",
    )];
    for (statement, constraint) in accounts.into_iter().chain(grants).chain(opening) {
        let error = diesel::sql_query(&statement)
            .bind::<SqlUuid, _>(account)
            .execute(&mut conn)
            .expect_err(&statement);
        let diesel::result::Error::DatabaseError(kind, info) = &error else {
            panic!("{statement}: {error}");
        };
        assert!(
            matches!(kind, diesel::result::DatabaseErrorKind::CheckViolation)
                && info.constraint_name() == Some(constraint),
            "{statement}: {error} ({:?})",
            info.constraint_name()
        );
    }
    assert_eq!(snapshot(&mut conn), before);
}
