use diesel::prelude::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::helpers::{problem, tampered, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_unknown_key_is_401() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    let response = app
        .client
        .get(app.url(&format!("/v1/accounts/{account}")))
        .send()
        .await
        .expect("sent");
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );

    let forged = format!("tbk_{}_{}", Uuid::new_v4().simple(), "0".repeat(64));
    for key in ["nonsense", forged.as_str(), "test-admin-key-012345678"] {
        let (status, body) = problem(app.get(&format!("/v1/accounts/{account}"), key).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "{key}"
        );
    }
    // A real key id with a wrong secret is refused too.
    let kiosk = app.kiosk_key(account).await;
    let tampered = tampered(&kiosk);
    let (status, _) = problem(app.get(&format!("/v1/accounts/{account}"), &tampered).await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_are_enforced() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    let kiosk = app.kiosk_key(account).await;
    let finance = app.finance_key().await;

    // Finance reads but never spends or credits.
    assert_eq!(
        app.get(&format!("/v1/accounts/{account}"), &finance)
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.get(&format!("/v1/accounts/{account}/ledger"), &finance)
            .await
            .status(),
        StatusCode::OK
    );
    let (status, body) = problem(app.reserve(account, &finance, Uuid::new_v4(), 1).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let credit = json!({"amount": 5, "external_ref": "finance-try"});
    let (status, _) = problem(
        app.post(
            &format!("/v1/accounts/{account}/credits"),
            &finance,
            &credit,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A kiosk spends on its own account but cannot credit it or create keys.
    assert_eq!(
        app.reserve(account, &kiosk, Uuid::new_v4(), 1)
            .await
            .status(),
        StatusCode::CREATED
    );
    let (status, _) = problem(
        app.post(&format!("/v1/accounts/{account}/credits"), &kiosk, &credit)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = problem(
        app.post("/v1/accounts", &kiosk, &json!({"name": "mine"}))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = problem(
        app.post(
            "/v1/api-keys",
            &kiosk,
            &json!({"scope": "admin", "label": "x"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_accounts_ids_are_404_for_a_kiosk() {
    let app = TestApp::spawn().await;
    let mine = app.funded_account(3).await;
    let theirs = app.funded_account(3).await;
    let kiosk = app.kiosk_key(mine).await;
    let their_reservation: Value = app
        .reserve(theirs, ADMIN_KEY, Uuid::new_v4(), 1)
        .await
        .json()
        .await
        .expect("json");
    let their_reservation = their_reservation["reservation_id"]
        .as_str()
        .expect("id")
        .to_owned();

    for path in [
        format!("/v1/accounts/{theirs}"),
        format!("/v1/accounts/{theirs}/ledger"),
        format!("/v1/accounts/{theirs}/reservations/{their_reservation}"),
    ] {
        let (status, body) = problem(app.get(&path, &kiosk).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{path}"
        );
    }
    let (status, _) = problem(app.reserve(theirs, &kiosk, Uuid::new_v4(), 1).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Their reservation through my account path is not found either.
    let path = format!("/v1/accounts/{mine}/reservations/{their_reservation}/commit");
    let (status, _) = problem(app.post(&path, &kiosk, &json!({})).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        app.account(theirs).await["reserved"],
        1,
        "their reservation untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_stored_only_as_sha256_and_revocation_is_immediate() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(3).await;
    let created: Value = app
        .post(
            &format!("/v1/accounts/{account}/api-keys"),
            ADMIN_KEY,
            &json!({"scope": "kiosk", "label": "booth"}),
        )
        .await
        .json()
        .await
        .expect("json");
    let key = created["key"].as_str().expect("key").to_owned();
    let key_id: Uuid = created["key_id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    assert_eq!(created["scope"], "kiosk");
    assert_eq!(created["account_id"], account.to_string());

    // Nothing in the table contains the key or its secret in clear.
    let secret = key.rsplit('_').next().expect("secret part");
    let mut conn = app.conn();
    let dump: String = diesel::sql_query("SELECT string_agg(t::text, '|') AS dump FROM api_keys t")
        .get_result::<Dump>(&mut conn)
        .expect("dump")
        .dump;
    assert!(!dump.contains(secret), "secret stored in clear");
    let stored: Vec<u8> = token_billing::db::schema::api_keys::table
        .find(key_id)
        .select(token_billing::db::schema::api_keys::secret_hash)
        .first(&mut conn)
        .expect("row");
    assert_eq!(stored, Sha256::digest(secret.as_bytes()).to_vec());

    assert_eq!(
        app.get(&format!("/v1/accounts/{account}"), &key)
            .await
            .status(),
        StatusCode::OK
    );
    let revoke = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{key_id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(revoke.status(), StatusCode::NO_CONTENT);
    let (status, _) = problem(app.get(&format!("/v1/accounts/{account}"), &key).await).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Revoking again is idempotent; an unknown key is 404.
    let again = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{key_id}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    let unknown = app
        .client
        .delete(app.url(&format!("/v1/api-keys/{}", Uuid::new_v4())))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

#[derive(QueryableByName)]
struct Dump {
    #[diesel(sql_type = diesel::sql_types::Text)]
    dump: String,
}
