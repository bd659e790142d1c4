//! Accounts, their kiosk keys and their ledger.

use actix_web::http::header;
use actix_web::{get, patch, post, web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::api_keys::{create_key_once, key_canonical};
use super::{created, idempotency_key, idempotency_scope, replayed, JsonObject, State};
use crate::config::{LEDGER_PAGE_DEFAULT, LEDGER_PAGE_MAX};
use crate::db::read_replica::run_read_blocking;
use crate::db::run_blocking;
use crate::db::states::parse_param;
use crate::domain::accounts::{
    self, parse_low_balance_threshold, parse_max_active_reservations, AccountFilter, AccountPage,
    AccountView, ACCOUNT_PAGE_DEFAULT, ACCOUNT_PAGE_MAX,
};
use crate::domain::api_keys::{create_api_key_by, parse_expires_at, Caller, CreatedApiKey, Scope};
use crate::domain::audit::Audit;
use crate::domain::grants::{self, GrantPage, GrantStatus, GRANT_PAGE_DEFAULT, GRANT_PAGE_MAX};
use crate::domain::history::{self, BalancesAsOf, BalancesAsOfPage};
use crate::domain::idempotency::{self, Claim, Created, ReplayedApiKey};
use crate::domain::key_budgets::BudgetSpec;
use crate::domain::ledger::{self, LedgerPage};
use crate::domain::paging::page_limit;
use crate::domain::reconciliation::InstantParam;
use crate::engine::types::{AccountId, Label, Name};
use crate::error::{ApiError, Problem};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(create_account)
        .service(list_accounts)
        .service(get_account)
        .service(update_account)
        .service(create_kiosk_key)
        .service(list_ledger)
        .service(list_grants);
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateAccount {
    name: Name,
    /// Held reservations allowed at once; 0 means unlimited. Default 10.
    #[schema(minimum = 0, maximum = 100000)]
    max_active_reservations: Option<i64>,
    /// Below this many available tokens the account's event feed and
    /// webhooks get `account.balance_low` (once per crossing); 0 (the
    /// default) is off.
    #[schema(minimum = 0, maximum = 1000000000000_i64)]
    low_balance_threshold: Option<i64>,
}

/// Creates an account with no tokens (admin).
///
/// With an `Idempotency-Key` header, a retry with the same key and body
/// answers 200 with the account the first request created.
#[utoipa::path(
    tag = "accounts",
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
         pattern = "^[\\x20-\\x7E]+$",
         description = "1–200 printable ASCII characters chosen by the client; a retry \
                        with the same key and body creates nothing and answers 200"),
    ),
    request_body = CreateAccount,
    responses(
        (status = 201, description = "The new account; `warnings` lists `name_taken` when \
                                      another active account has the same name",
         body = AccountView,
         headers(("Location" = String, description = "The account's URL"))),
        (status = 200, description = "A replay: the account created earlier with this \
                                      `Idempotency-Key`", body = AccountView,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 400, description = "Invalid JSON, field, limit or Idempotency-Key",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "This Idempotency-Key was used with another body",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts")]
async fn create_account(
    caller: Caller,
    state: State,
    request: HttpRequest,
    body: JsonObject<CreateAccount>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_admin()?;
    let CreateAccount {
        name,
        max_active_reservations,
        low_balance_threshold,
    } = body.into_inner();
    let limit = parse_max_active_reservations(max_active_reservations)?;
    let threshold = parse_low_balance_threshold(low_balance_threshold)?;
    let claim = idempotency_key(&request)?
        .map(|key| {
            let canonical = serde_json::json!({
                "name": name.as_str(),
                "max_active_reservations": limit,
                "low_balance_threshold": threshold,
            });
            Claim::new(
                caller.actor(),
                idempotency_scope(&request),
                &key,
                &canonical,
            )
        })
        .transpose()?;
    let by = Audit::of(&caller);
    let (view, replay) = run_blocking(&state.pool, move |conn| {
        let create = |conn: &mut diesel::PgConnection| {
            accounts::create_account_by(conn, &by, &name, limit, threshold).map(|row| (row.id, row))
        };
        let (row, replay) = match claim {
            None => (create(conn)?.1, false),
            Some(claim) => match idempotency::create_once(conn, &claim, create)? {
                Created::New(row) => (row, false),
                Created::Existing(id) => (accounts::get_account(conn, AccountId(id))?, true),
            },
        };
        let warnings = accounts::name_warnings(conn, &row)?;
        let view = AccountView {
            warnings: Some(warnings),
            ..AccountView::from(row)
        };
        Ok::<_, ApiError>((view, replay))
    })
    .await?;
    if replay {
        return Ok(replayed(&view));
    }
    Ok(created(format!("/v1/accounts/{}", view.account_id), &view))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AccountListQuery {
    /// Accounts after this account id: the previous page's `next_after`.
    after: Option<Uuid>,
    /// Accounts per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only accounts whose name contains this text, case-insensitively
    /// (`%` and `_` match themselves).
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    q: Option<String>,
    /// Only accounts in this status.
    #[param(pattern = "^(active|suspended)$")]
    status: Option<String>,
    /// Balances as the books stood at this instant (RFC 3339, or a
    /// `YYYY-MM-DD` date meaning its midnight UTC; entries written at that
    /// instant count): the page lists `BalancesAsOf` of the accounts opened
    /// by then. Not with `q` or `status`. Not in the future.
    #[param(value_type = Option<InstantParam>)]
    as_of: Option<String>,
}

/// Lists accounts, oldest first, and finds them by name (admin, finance).
#[utoipa::path(
    tag = "accounts",
    params(AccountListQuery),
    responses(
        (status = 200, description = "One page of accounts (with `as_of`: their balances \
                                      then); `next_after` is the next page's `after`, null on \
                                      the last page", body = AccountListAnswer),
        (status = 400, description = "Invalid cursor, limit, q, status or as_of",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A kiosk key",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed` (with `as_of`): the instant is \
                                      not closed yet (a transaction that began before it is \
                                      still running); the service waited a second for it; \
                                      retry after `Retry-After`",
         body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts")]
async fn list_accounts(
    caller: Caller,
    state: State,
    query: web::Query<AccountListQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.authorize_finance()?;
    let AccountListQuery {
        after,
        limit,
        q,
        status,
        as_of,
    } = query.into_inner();
    if let Some(as_of) = as_of {
        if q.is_some() || status.is_some() {
            return Err(ApiError::InvalidRequest(
                "as_of cannot be combined with q or status".into(),
            ));
        }
        let as_of = history::parse_as_of(&as_of, chrono::Utc::now())?;
        let limit = page_limit(limit, ACCOUNT_PAGE_DEFAULT, ACCOUNT_PAGE_MAX)?;
        let page = run_blocking(&state.pool, move |conn| {
            history::list_as_of(conn, as_of, after, limit)
        })
        .await?;
        return Ok(HttpResponse::Ok().json(AccountListAnswer::AsOf(page)));
    }
    let filter = AccountFilter::parse(after, limit, q.as_deref(), status.as_deref())?;
    let page = run_blocking(&state.pool, move |conn| {
        accounts::list_accounts(conn, &filter)
    })
    .await?;
    Ok(HttpResponse::Ok().json(AccountListAnswer::Now(page)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AccountQuery {
    /// Balances as the books stood at this instant (RFC 3339, or a
    /// `YYYY-MM-DD` date meaning its midnight UTC), exact to the entry:
    /// entries written at that instant count. Not in the future.
    #[param(value_type = Option<InstantParam>)]
    as_of: Option<String>,
}

/// The answer of `GET /v1/accounts/{account_id}`: the account now, or its
/// balances at `as_of`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum AccountAnswer {
    Now(AccountView),
    AsOf(BalancesAsOf),
}

/// The answer of `GET /v1/accounts`: a page of accounts, or of their
/// balances at `as_of`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum AccountListAnswer {
    Now(AccountPage),
    AsOf(BalancesAsOfPage),
}

/// An account's balances, now or at an instant.
///
/// The version is sent as `ETag`; `If-None-Match` with it answers 304
/// (without `as_of`).
#[utoipa::path(
    tag = "accounts",
    params(
        ("account_id" = Uuid, Path, description = "The account"),
        AccountQuery,
        ("If-None-Match" = Option<String>, Header,
         description = "A previous `ETag`: unchanged balances answer 304"),
    ),
    responses(
        (status = 200, description = "The account and its balances (with `as_of`: its \
                                      balances then, `BalancesAsOf`)", body = AccountAnswer,
         headers(("ETag" = String, description = "The account's version, quoted (not with \
                                                  `as_of`)"))),
        (status = 304, description = "Unchanged since the `If-None-Match` version",
         headers(("ETag" = String, description = "The account's version, quoted"))),
        (status = 400, description = "The account id is not a UUID, or `as_of` is not an \
                                      instant or is in the future",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`instant_not_closed` (with `as_of`): the instant is \
                                      not closed yet (a transaction that began before it is \
                                      still running); the service waited a second for it; \
                                      retry after `Retry-After`",
         body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = String, description = "Seconds to wait"))),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}")]
async fn get_account(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<AccountQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    if let Some(as_of) = query.into_inner().as_of {
        let as_of = history::parse_as_of(&as_of, chrono::Utc::now())?;
        let view = run_blocking(&state.pool, move |conn| {
            history::account_as_of(conn, account.0, as_of)
        })
        .await?;
        return Ok(HttpResponse::Ok().json(AccountAnswer::AsOf(view)));
    }
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
        .json(AccountAnswer::Now(view)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateAccount {
    /// `active` or `suspended`.
    #[schema(pattern = "^(active|suspended)$")]
    status: Option<String>,
    /// Held reservations allowed at once; 0 means unlimited.
    #[schema(minimum = 0, maximum = 100000)]
    max_active_reservations: Option<i64>,
    /// The low-balance threshold; 0 turns it off.
    #[schema(minimum = 0, maximum = 1000000000000_i64)]
    low_balance_threshold: Option<i64>,
}

/// Suspends or reactivates an account, or changes its reservation limit or
/// low-balance threshold.
#[utoipa::path(
    tag = "accounts",
    params(("account_id" = Uuid, Path, description = "The account")),
    request_body = UpdateAccount,
    responses(
        (status = 200, description = "The updated account", body = AccountView),
        (status = 400, description = "Invalid JSON, path, status or limit",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[patch("/v1/accounts/{account_id}")]
async fn update_account(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    body: JsonObject<UpdateAccount>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let UpdateAccount {
        status,
        max_active_reservations,
        low_balance_threshold,
    } = body.into_inner();
    let limit = max_active_reservations
        .map(|limit| parse_max_active_reservations(Some(limit)))
        .transpose()?;
    let threshold = low_balance_threshold
        .map(|threshold| parse_low_balance_threshold(Some(threshold)))
        .transpose()?;
    let by = Audit::of(&caller);
    let row = run_blocking(&state.pool, move |conn| {
        accounts::update_account(conn, &by, account, status.as_deref(), limit, threshold)
    })
    .await?;
    Ok(HttpResponse::Ok().json(AccountView::from(row)))
}

/// The only scope of a key created on an account.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum KioskScope {
    Kiosk,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKioskKey {
    /// Always `kiosk` here: admin and finance keys are not bound to an account.
    scope: KioskScope,
    label: Label,
    /// When the key stops working (RFC 3339, in the future); absent: never.
    #[schema(format = DateTime, value_type = Option<String>)]
    expires_at: Option<String>,
    /// Its spending limit (docs/fleet.md, "Key budgets"); absent: none.
    budget: Option<BudgetSpec>,
}

/// A kiosk key bound to this account; the key is in this answer only.
///
/// With an `Idempotency-Key` header, a retry with the same key and body
/// answers 200 with the key created earlier — without its secret, which
/// is never shown again: a client that lost it revokes that key and
/// creates a new one.
#[utoipa::path(
    tag = "api-keys",
    params(
        ("account_id" = Uuid, Path, description = "The account the key spends from"),
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
         pattern = "^[\\x20-\\x7E]+$",
         description = "1–200 printable ASCII characters chosen by the client; a retry \
                        with the same key and body creates nothing and answers 200"),
    ),
    request_body = CreateKioskKey,
    responses(
        (status = 201, description = "The new key, with its secret (shown only now)",
         body = CreatedApiKey),
        (status = 200, description = "A replay: the key created earlier with this \
                                      `Idempotency-Key`, without its secret (`key` is null)",
         body = ReplayedApiKey,
         headers(("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 422, description = "This Idempotency-Key was used with another body",
         body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid JSON, path, label or expires_at, or a scope \
                                      other than kiosk",
         body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body larger than 64 KiB",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[post("/v1/accounts/{account_id}/api-keys")]
async fn create_kiosk_key(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    request: HttpRequest,
    body: JsonObject<CreateKioskKey>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_admin_on(account)?;
    let CreateKioskKey {
        scope: KioskScope::Kiosk,
        label,
        expires_at,
        budget,
    } = body.into_inner();
    let scope = Scope::Kiosk;
    let expires_at = parse_expires_at(expires_at.as_deref())?;
    let claim = idempotency_key(&request)?
        .map(|key| {
            let canonical = key_canonical(scope, &label, expires_at, budget.as_ref());
            Claim::new(
                caller.actor(),
                idempotency_scope(&request),
                &key,
                &canonical,
            )
        })
        .transpose()?;
    let by = Audit::of(&caller);
    create_key_once(&state, claim, move |conn| {
        create_api_key_by(
            conn,
            &by,
            scope,
            Some(account),
            &label,
            expires_at,
            budget.as_ref(),
        )
    })
    .await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    /// Entries after this entry id: the previous page's `next_after`.
    #[param(minimum = 0)]
    after: Option<i64>,
    /// Entries per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Only entries written at or after this instant (RFC 3339), e.g. the
    /// start of a chart's period.
    #[param(format = DateTime)]
    since: Option<String>,
}

/// The account's ledger, oldest first.
///
/// `next_after` is the cursor of the next page.
#[utoipa::path(
    tag = "accounts",
    params(("account_id" = Uuid, Path, description = "The account"), LedgerQuery),
    responses(
        (status = 200, description = "One page of entries", body = LedgerPage),
        (status = 400, description = "Invalid path, `after`, `limit` or `since`",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/ledger")]
async fn list_ledger(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let limit = page_limit(query.limit, LEDGER_PAGE_DEFAULT, LEDGER_PAGE_MAX)?;
    let after = query.after;
    if after.is_some_and(|after| after < 0) {
        return Err(ApiError::InvalidRequest(
            "after must be a non-negative entry id".into(),
        ));
    }
    let since = query
        .since
        .as_deref()
        .map(|text| crate::time::instant_of("since", text).map_err(ApiError::InvalidRequest))
        .transpose()?;
    let for_kiosk = caller.scope == Scope::Kiosk;
    let read = move |conn: &mut diesel::PgConnection| {
        accounts::get_account(conn, account)?;
        let page = ledger::list_entries(conn, account, after, since, limit)?;
        if for_kiosk {
            ledger::as_kiosk_sees_it(conn, page)
        } else {
            Ok(page)
        }
    };
    // Admin and finance exports (the console's chart too) may read a
    // replica; a kiosk's own ledger must show what it has just done.
    let page = if caller.reads_its_own_writes() {
        run_blocking(&state.pool, read).await?
    } else {
        run_read_blocking(&state.pool, state.read_replica.as_deref(), read).await?
    };
    Ok(HttpResponse::Ok().json(page))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct GrantsQuery {
    /// Only grants in this status: `active` (not lapsed, holds tokens),
    /// `depleted` (not lapsed, holds none), or `expired` (its expiry has
    /// passed).
    #[param(pattern = "^(active|expired|depleted)$")]
    status: Option<String>,
    /// Grants after this `grant_id`: the previous page's `next_after`.
    after: Option<Uuid>,
    /// Grants per page, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// The account's credit grants, in creation order.
///
/// Reservations draw from them by `priority` (0 first), then the soonest
/// expiry (grants that never expire last), then creation order;
/// `remaining` is what can still be drawn, `reserved` what held reservations
/// have drawn. `next_after` is the cursor of the next page.
#[utoipa::path(
    tag = "accounts",
    params(("account_id" = Uuid, Path, description = "The account"), GrantsQuery),
    responses(
        (status = 200, description = "One page of grants", body = GrantPage),
        (status = 400, description = "Invalid path, `status`, `after` or `limit`",
         body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such account, or not this kiosk's",
         body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])),
)]
#[get("/v1/accounts/{account_id}/grants")]
async fn list_grants(
    caller: Caller,
    state: State,
    path: web::Path<Uuid>,
    query: web::Query<GrantsQuery>,
) -> Result<HttpResponse, ApiError> {
    let account = AccountId(path.into_inner());
    caller.authorize_read(account)?;
    let GrantsQuery {
        status,
        after,
        limit,
    } = query.into_inner();
    let status = status
        .map(|text| parse_param("status", &text, GrantStatus::ALL, GrantStatus::parse))
        .transpose()?;
    let limit = page_limit(limit, GRANT_PAGE_DEFAULT, GRANT_PAGE_MAX)?;
    let page: GrantPage = run_blocking(&state.pool, move |conn| {
        accounts::get_account(conn, account)?;
        grants::list_grants(conn, account, status, after, limit)
    })
    .await?;
    Ok(HttpResponse::Ok().json(page))
}
