//! Accounts, their kiosk keys and their ledger.

use actix_web::http::header;
use actix_web::{get, patch, post, web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::{created, State};
use crate::config::{LEDGER_PAGE_DEFAULT, LEDGER_PAGE_MAX};
use crate::db::run_blocking;
use crate::domain::accounts::{self, parse_max_active_reservations, AccountView};
use crate::domain::api_keys::{create_api_key, Caller, Scope};
use crate::domain::ledger;
use crate::domain::types::{AccountId, Label, Name};
use crate::error::ApiError;

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_account)
        .service(get_account)
        .service(update_account)
        .service(create_kiosk_key)
        .service(list_ledger);
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateAccount {
    name: Name,
    max_active_reservations: Option<i64>,
}

#[post("/v1/accounts")]
async fn create_account(
    caller: Caller,
    state: State,
    body: web::Json<CreateAccount>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let CreateAccount {
        name,
        max_active_reservations,
    } = body.into_inner();
    let limit = parse_max_active_reservations(max_active_reservations)?;
    let row = run_blocking(&state.pool, move |conn| {
        accounts::create_account(conn, &name, limit)
    })
    .await?;
    let view = AccountView::from(row);
    Ok(created(format!("/v1/accounts/{}", view.account_id), &view))
}

/// Balances, with the version as `ETag` (`If-None-Match` answers 304).
#[get("/v1/accounts/{account_id}")]
async fn get_account(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let view = AccountView::from(
        run_blocking(&state.pool, move |conn| {
            accounts::get_account(conn, account)
        })
        .await?,
    );
    let etag = format!("\"{}\"", view.version);
    let unchanged = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(',')
                .any(|tag| tag.trim() == etag || tag.trim() == "*")
        });
    if unchanged {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .finish());
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag))
        .json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateAccount {
    status: Option<String>,
    max_active_reservations: Option<i64>,
}

/// Suspends or reactivates an account, or changes its reservation limit.
#[patch("/v1/accounts/{account_id}")]
async fn update_account(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: web::Json<UpdateAccount>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let UpdateAccount {
        status,
        max_active_reservations,
    } = body.into_inner();
    let limit = max_active_reservations
        .map(|limit| parse_max_active_reservations(Some(limit)))
        .transpose()?;
    let row = run_blocking(&state.pool, move |conn| {
        accounts::update_account(conn, account, status.as_deref(), limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(AccountView::from(row)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKioskKey {
    scope: Scope,
    label: Label,
}

/// A kiosk key bound to this account; the key is in this answer only.
#[post("/v1/accounts/{account_id}/api-keys")]
async fn create_kiosk_key(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: web::Json<CreateKioskKey>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateKioskKey { scope, label } = body.into_inner();
    if scope != Scope::Kiosk {
        return Err(ApiError::InvalidRequest(
            "keys created on an account have scope \"kiosk\"; use POST /v1/api-keys for admin and finance keys".into(),
        ));
    }
    let key = run_blocking(&state.pool, move |conn| {
        create_api_key(conn, scope, Some(account), &label)
    })
    .await?;
    Ok(HttpResponse::Created().json(key))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

/// The account's ledger, oldest first; `next_after` is the next cursor.
#[get("/v1/accounts/{account_id}/ledger")]
async fn list_ledger(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let limit = query.limit.unwrap_or(LEDGER_PAGE_DEFAULT);
    if !(1..=LEDGER_PAGE_MAX).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be between 1 and {LEDGER_PAGE_MAX}"
        )));
    }
    let after = query.after;
    if after.is_some_and(|after| after < 0) {
        return Err(ApiError::InvalidRequest(
            "after must be a non-negative entry id".into(),
        ));
    }
    let page = run_blocking(&state.pool, move |conn| {
        accounts::get_account(conn, account)?;
        ledger::list_entries(conn, account, after, limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
}
