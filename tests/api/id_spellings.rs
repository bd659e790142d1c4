//! One spelling of an id (issue 56, finding 7): an id in a path is read in
//! its hyphenated form (any case, or without hyphens, is canonicalised to
//! it); braces and a `urn:uuid:` prefix, which a UUID parser would also
//! read, are refused with 400 on every route that takes an id, and change
//! nothing.

use reqwest::{Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{problem, TestApp, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn braced_and_urn_ids_are_refused_on_every_route_with_an_id() {
    let app = TestApp::spawn().await;
    let account = app.funded_account(10).await;
    let other = Uuid::new_v4();
    // Every route of the API that takes an id, with the method it answers.
    let routes: Vec<(Method, String)> = vec![
        (Method::GET, "/v1/accounts/{a}".into()),
        (Method::PATCH, "/v1/accounts/{a}".into()),
        (Method::POST, "/v1/accounts/{a}/adjustments".into()),
        (Method::GET, "/v1/accounts/{a}/api-keys".into()),
        (Method::POST, "/v1/accounts/{a}/api-keys".into()),
        (Method::POST, "/v1/accounts/{a}/credits".into()),
        (Method::GET, "/v1/accounts/{a}/grants".into()),
        (Method::GET, "/v1/accounts/{a}/jobs".into()),
        (Method::POST, "/v1/accounts/{a}/jobs".into()),
        (Method::GET, "/v1/accounts/{a}/jobs/{o}".into()),
        (Method::GET, "/v1/accounts/{a}/ledger".into()),
        (Method::GET, "/v1/accounts/{a}/reservations".into()),
        (Method::POST, "/v1/accounts/{a}/reservations".into()),
        (Method::GET, "/v1/accounts/{a}/reservations/{o}".into()),
        (
            Method::POST,
            "/v1/accounts/{a}/reservations/{o}/commit".into(),
        ),
        (
            Method::POST,
            "/v1/accounts/{a}/reservations/{o}/extend".into(),
        ),
        (
            Method::POST,
            "/v1/accounts/{a}/reservations/{o}/release".into(),
        ),
        (Method::GET, "/v1/accounts/{a}/topup-rules".into()),
        (Method::POST, "/v1/accounts/{a}/topup-rules".into()),
        (Method::GET, "/v1/accounts/{a}/topup-rules/{o}".into()),
        (Method::DELETE, "/v1/api-keys/{o}".into()),
        (Method::GET, "/v1/webhook-endpoints/{o}".into()),
        (Method::GET, "/v1/webhook-endpoints/{o}/deliveries".into()),
        (
            Method::POST,
            "/v1/webhook-endpoints/{o}/events/{o}/redeliver".into(),
        ),
        (
            Method::POST,
            "/v1/webhook-endpoints/{o}/rotate-secret".into(),
        ),
    ];
    let spellings: [fn(Uuid) -> String; 2] =
        [|id| format!("{{{id}}}"), |id| format!("urn:uuid:{id}")];
    let ledger_before = app
        .get(&format!("/v1/accounts/{account}/ledger"), ADMIN_KEY)
        .await
        .text()
        .await
        .expect("ledger");
    let mut accepted = Vec::new();
    for (method, route) in &routes {
        for spell in spellings {
            // The odd spelling in the account's place, then in the other
            // id's (where the route has that place).
            for (place, a, o) in [
                ("{a}", spell(account), other.to_string()),
                ("{o}", account.to_string(), spell(other)),
            ] {
                if !route.contains(place) {
                    continue;
                }
                let path = route.replace("{a}", &a).replace("{o}", &o);
                let response = app
                    .client
                    .request(method.clone(), app.url(&path))
                    .bearer_auth(ADMIN_KEY)
                    .json(&json!({"amount": 1, "request_id": Uuid::new_v4(),
                                  "external_ref": Uuid::new_v4().to_string()}))
                    .send()
                    .await
                    .expect("answered");
                let (status, body) = problem(response).await;
                if (status, body["code"].as_str())
                    != (StatusCode::BAD_REQUEST, Some("invalid_request"))
                {
                    accepted.push(format!("{method} {path}: {status} {body}"));
                }
            }
        }
    }
    assert!(
        accepted.is_empty(),
        "spellings not refused:\n{}",
        accepted.join("\n")
    );
    let ledger_after = app
        .get(&format!("/v1/accounts/{account}/ledger"), ADMIN_KEY)
        .await
        .text()
        .await
        .expect("ledger");
    assert_eq!(
        ledger_before, ledger_after,
        "a refused request changed the books"
    );
}
