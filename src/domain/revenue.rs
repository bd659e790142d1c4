//! Revenue in money for a period `[from, to)` (docs/finance.md, "Money"):
//! per account and currency, deferred revenue at `from`, the sales of the
//! period, the revenue recognised as tokens were used, the breakage of
//! tokens that lapsed, the adjustments, and deferred revenue at `to`.
//!
//! Only a priced grant (`amount_paid` in minor units of `currency`) has a
//! value. Its tokens leave it for good by a commit (recognised), a lapse
//! (breakage) or a removal (an adjustment); each such ledger entry is
//! valued at read time by `engine_grant_value_of` (a cumulative floor in
//! the grant's entry order, src/engine/sql/25_grants.sql), so a grant that
//! has been used or has lapsed entirely has recognised exactly its price,
//! and nothing on the write path prices anything. Deferred revenue at an
//! instant is each grant's price less `engine_grant_value` of the tokens
//! gone by then, computed directly: the report checks its roll-forward
//! `deferred_opening + sales + adjustments − recognized − breakage =
//! deferred_closing` against it, per account and currency.
//!
//! Tokens tie out with the reconciliation of the same period: the priced
//! tokens of every currency plus `unpriced_tokens` are the reconciliation's
//! opening, credited, committed, grant_expired, adjusted and closing. The
//! same horizon applies: only closed instants are answered, so the same
//! period asked twice answers the same. Money is an integer of minor units
//! everywhere (bigint in SQL, i64 here, integers in JSON and CSV).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Date, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::checks::Discrepancy;
use crate::domain::reconciliation::{csv_text, joined, period_file_name, reconcile, AccountLine};
use crate::error::ApiError;

/// Tokens of a period, as the money figures beside them count them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TokenFigures {
    /// Tokens not yet used or lapsed at `from` (held reservations included).
    pub deferred_opening: i64,
    /// Tokens credited during the period.
    pub sold: i64,
    /// Tokens committed during the period.
    pub used: i64,
    /// Tokens that lapsed with their grant during the period.
    pub lapsed: i64,
    /// Signed: tokens positive adjustments added less those removals took.
    pub adjusted: i64,
    /// Tokens not yet used or lapsed at `to`.
    pub deferred_closing: i64,
}

impl TokenFigures {
    fn add(&mut self, other: &TokenFigures) {
        self.deferred_opening += other.deferred_opening;
        self.sold += other.sold;
        self.used += other.used;
        self.lapsed += other.lapsed;
        self.adjusted += other.adjusted;
        self.deferred_closing += other.deferred_closing;
    }

    fn numbers(&self) -> [i64; 6] {
        [
            self.deferred_opening,
            self.sold,
            self.used,
            self.lapsed,
            self.adjusted,
            self.deferred_closing,
        ]
    }
}

/// One currency's money of the period, in minor units of `currency`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CurrencyLine {
    /// ISO 4217.
    pub currency: String,
    /// Deferred revenue at `from`: the prepaid value not yet used or lapsed.
    pub deferred_opening: i64,
    /// The prices of the credits (grants) made during the period.
    pub sales: i64,
    /// The value of the tokens used during the period (commits).
    pub recognized: i64,
    /// The value of the tokens that lapsed during the period.
    pub breakage: i64,
    /// Signed: the prices of positive adjustments' grants, less the value
    /// of the tokens removals took, during the period.
    pub adjustments: i64,
    /// Deferred revenue at `to`:
    /// `deferred_opening + sales + adjustments − recognized − breakage`.
    pub deferred_closing: i64,
    /// The same period in tokens of this currency's grants.
    pub tokens: TokenFigures,
}

impl CurrencyLine {
    fn new(currency: &str) -> CurrencyLine {
        CurrencyLine {
            currency: currency.to_owned(),
            deferred_opening: 0,
            sales: 0,
            recognized: 0,
            breakage: 0,
            adjustments: 0,
            deferred_closing: 0,
            tokens: TokenFigures::default(),
        }
    }

    fn add(&mut self, other: &CurrencyLine) {
        self.deferred_opening += other.deferred_opening;
        self.sales += other.sales;
        self.recognized += other.recognized;
        self.breakage += other.breakage;
        self.adjustments += other.adjustments;
        self.deferred_closing += other.deferred_closing;
        self.tokens.add(&other.tokens);
    }

    fn money(&self) -> [i64; 6] {
        [
            self.deferred_opening,
            self.sales,
            self.recognized,
            self.breakage,
            self.adjustments,
            self.deferred_closing,
        ]
    }
}

/// One account's revenue of the period.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RevenueAccount {
    pub account_id: Uuid,
    /// The account's name (as it is now).
    pub name: String,
    /// `ok`, or `mismatch` when a check of this account failed.
    pub status: &'static str,
    /// One line per currency its priced grants are in, by currency.
    pub currencies: Vec<CurrencyLine>,
    /// The period of its unpriced grants, in tokens (never valued); null
    /// when the report is for one currency.
    pub unpriced_tokens: Option<TokenFigures>,
}

/// A day's recognised revenue and breakage in one currency (the console's
/// chart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DayLine {
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub currency: String,
    pub recognized: i64,
    pub breakage: i64,
}

/// The revenue report of `[from, to)`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RevenueReport {
    /// Start of the period, included (RFC 3339, UTC).
    pub from: String,
    /// End of the period, excluded (RFC 3339, UTC).
    pub to: String,
    /// The instant the books were read up to (as the reconciliation's).
    pub generated_at: String,
    /// `ok`, or `mismatch` when any check failed (see `discrepancies`).
    pub status: &'static str,
    /// The totals of every account, one line per currency.
    pub currencies: Vec<CurrencyLine>,
    /// The totals of the unpriced grants, in tokens; null when the report
    /// is for one currency.
    pub unpriced_tokens: Option<TokenFigures>,
    /// One line per account opened before `to`, by account id.
    pub accounts: Vec<RevenueAccount>,
    /// Recognised revenue and breakage per UTC day and currency.
    pub days: Vec<DayLine>,
    /// Every failed check: `revenue_roll_forward:<currency>` (money),
    /// `revenue_tokens_roll_forward:<currency>`, `unpriced_tokens:<figure>`
    /// (the reconciliation's tokens hold fewer than the priced grants').
    pub discrepancies: Vec<Discrepancy>,
}

impl RevenueReport {
    /// `revenue_<from>_<to>.csv`, as the reconciliation names its file.
    pub fn csv_file_name(&self) -> String {
        period_file_name("revenue", &self.from, &self.to)
    }
}

/// The entries that move a priced grant's tokens, before `$2`, for the
/// account `$3` (NULL: all) in the currency `$4` (NULL: all), each with
/// its grant's price, whether it made the grant (`made`), the tokens it
/// took for good (`gone`) and its value (`value`).
const PRICED_ENTRIES: &str = "\
WITH priced AS (
    SELECT g.id, g.account_id, g.amount AS tokens, g.amount_paid AS paid, g.currency
    FROM credit_grants g
    WHERE g.amount_paid IS NOT NULL AND ($3::uuid IS NULL OR g.account_id = $3)
      AND ($4::text IS NULL OR g.currency = $4)
), moves AS (
    SELECT e.id, e.created_at, e.kind, e.amount, g.id AS grant_id, g.account_id, g.currency,
           g.tokens, g.paid,
           (e.kind = 'credit' OR (e.kind = 'adjustment' AND e.amount > 0)) AS made,
           d.consumed + d.debited + d.expired AS gone
    FROM priced g JOIN ledger_entries e ON e.grant_id = g.id
    CROSS JOIN LATERAL engine_grant_deltas(e.kind, e.amount,
                                          engine_deltas(e.kind, e.amount, e.reservation_id)) d
    WHERE e.created_at < $2
), entries AS (
    SELECT m.*, engine_grant_value_of(m.paid, (sum(m.gone) OVER w)::bigint - m.gone, m.gone, m.tokens)
               AS value
    FROM moves m
    WINDOW w AS (PARTITION BY m.grant_id ORDER BY m.id)
)";

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = SqlUuid)]
    account_id: Uuid,
    #[diesel(sql_type = Text)]
    currency: String,
    #[diesel(sql_type = BigInt)]
    deferred_opening: i64,
    #[diesel(sql_type = BigInt)]
    sales: i64,
    #[diesel(sql_type = BigInt)]
    recognized: i64,
    #[diesel(sql_type = BigInt)]
    breakage: i64,
    #[diesel(sql_type = BigInt)]
    adjustments: i64,
    #[diesel(sql_type = BigInt)]
    deferred_closing: i64,
    #[diesel(sql_type = BigInt)]
    tokens_deferred_opening: i64,
    #[diesel(sql_type = BigInt)]
    tokens_sold: i64,
    #[diesel(sql_type = BigInt)]
    tokens_used: i64,
    #[diesel(sql_type = BigInt)]
    tokens_lapsed: i64,
    #[diesel(sql_type = BigInt)]
    tokens_adjusted: i64,
    #[diesel(sql_type = BigInt)]
    tokens_deferred_closing: i64,
}

#[derive(QueryableByName)]
struct DayRow {
    #[diesel(sql_type = Date)]
    day: chrono::NaiveDate,
    #[diesel(sql_type = Text)]
    currency: String,
    #[diesel(sql_type = BigInt)]
    recognized: i64,
    #[diesel(sql_type = BigInt)]
    breakage: i64,
}

/// Per account and currency: the flows of `[$1, $2)` valued entry by
/// entry, and the deferred balances at `$1` and `$2` computed directly
/// from each grant's tokens gone by then.
fn currency_rows(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    account: Option<Uuid>,
    currency: Option<&str>,
) -> Result<Vec<Row>, ApiError> {
    let sql = format!(
        "{PRICED_ENTRIES}, grants AS (
    SELECT grant_id, account_id, currency, paid, tokens,
           bool_or(made AND created_at < $1) AS made_before,
           bool_or(made) AS made_by_end,
           COALESCE(sum(gone) FILTER (WHERE created_at < $1), 0)::bigint AS gone_before,
           sum(gone)::bigint AS gone_by_end,
           bool_or(made AND created_at >= $1 AND kind = 'credit') AS sold,
           bool_or(made AND created_at >= $1 AND kind = 'adjustment') AS added,
           COALESCE(sum(value) FILTER (WHERE created_at >= $1 AND kind = 'commit'), 0) AS recognized,
           COALESCE(sum(value) FILTER (WHERE created_at >= $1 AND kind = 'grant_expire'), 0)
               AS breakage,
           COALESCE(sum(value) FILTER (WHERE created_at >= $1 AND kind = 'adjustment'), 0)
               AS removed,
           COALESCE(sum(gone) FILTER (WHERE created_at >= $1 AND kind = 'commit'), 0) AS used,
           COALESCE(sum(gone) FILTER (WHERE created_at >= $1 AND kind = 'grant_expire'), 0)
               AS lapsed,
           COALESCE(sum(gone) FILTER (WHERE created_at >= $1 AND kind = 'adjustment'), 0)
               AS taken
    FROM entries GROUP BY grant_id, account_id, currency, paid, tokens
)
SELECT account_id, currency,
       sum(CASE WHEN made_before THEN paid - engine_grant_value(paid, gone_before, tokens)
                ELSE 0 END)::bigint AS deferred_opening,
       sum(CASE WHEN sold THEN paid ELSE 0 END)::bigint AS sales,
       sum(recognized)::bigint AS recognized,
       sum(breakage)::bigint AS breakage,
       sum(CASE WHEN added THEN paid ELSE 0 END - removed)::bigint AS adjustments,
       sum(CASE WHEN made_by_end THEN paid - engine_grant_value(paid, gone_by_end, tokens)
                ELSE 0 END)::bigint AS deferred_closing,
       sum(CASE WHEN made_before THEN tokens - gone_before ELSE 0 END)::bigint
           AS tokens_deferred_opening,
       sum(CASE WHEN sold THEN tokens ELSE 0 END)::bigint AS tokens_sold,
       sum(used)::bigint AS tokens_used,
       sum(lapsed)::bigint AS tokens_lapsed,
       sum(CASE WHEN added THEN tokens ELSE 0 END - taken)::bigint AS tokens_adjusted,
       sum(CASE WHEN made_by_end THEN tokens - gone_by_end ELSE 0 END)::bigint
           AS tokens_deferred_closing
FROM grants GROUP BY account_id, currency ORDER BY account_id, currency"
    );
    Ok(diesel::sql_query(sql)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<Nullable<SqlUuid>, _>(account)
        .bind::<Nullable<Text>, _>(currency)
        .load(conn)?)
}

fn day_rows(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    account: Option<Uuid>,
    currency: Option<&str>,
) -> Result<Vec<DayRow>, ApiError> {
    let sql = format!(
        "{PRICED_ENTRIES}
SELECT (created_at AT TIME ZONE 'UTC')::date AS day, currency,
       COALESCE(sum(value) FILTER (WHERE kind = 'commit'), 0)::bigint AS recognized,
       COALESCE(sum(value) FILTER (WHERE kind = 'grant_expire'), 0)::bigint AS breakage
FROM entries WHERE created_at >= $1 AND kind IN ('commit', 'grant_expire')
GROUP BY 1, 2 ORDER BY 1, 2"
    );
    Ok(diesel::sql_query(sql)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<Nullable<SqlUuid>, _>(account)
        .bind::<Nullable<Text>, _>(currency)
        .load(conn)?)
}

impl From<Row> for CurrencyLine {
    fn from(row: Row) -> CurrencyLine {
        CurrencyLine {
            currency: row.currency,
            deferred_opening: row.deferred_opening,
            sales: row.sales,
            recognized: row.recognized,
            breakage: row.breakage,
            adjustments: row.adjustments,
            deferred_closing: row.deferred_closing,
            tokens: TokenFigures {
                deferred_opening: row.tokens_deferred_opening,
                sold: row.tokens_sold,
                used: row.tokens_used,
                lapsed: row.tokens_lapsed,
                adjusted: row.tokens_adjusted,
                deferred_closing: row.tokens_deferred_closing,
            },
        }
    }
}

/// An account's checks: each currency's roll-forward in money and in
/// tokens, and its unpriced tokens (the reconciliation's less the priced
/// ones) never negative.
fn account_checks(
    account: Uuid,
    lines: &[CurrencyLine],
    unpriced: Option<&TokenFigures>,
) -> Vec<Discrepancy> {
    let mut failed = Vec::new();
    for line in lines {
        failed.extend(Discrepancy::failed(
            account,
            [
                (
                    format!("revenue_roll_forward:{}", line.currency).as_str(),
                    line.deferred_opening + line.sales + line.adjustments
                        - line.recognized
                        - line.breakage,
                    line.deferred_closing,
                ),
                (
                    format!("revenue_tokens_roll_forward:{}", line.currency).as_str(),
                    line.tokens.deferred_opening + line.tokens.sold + line.tokens.adjusted
                        - line.tokens.used
                        - line.tokens.lapsed,
                    line.tokens.deferred_closing,
                ),
            ],
        ));
    }
    if let Some(unpriced) = unpriced {
        let names = ["deferred_opening", "sold", "used", "lapsed"];
        for (name, value) in names.iter().zip(unpriced.numbers()) {
            if value < 0 {
                failed.push(Discrepancy {
                    account_id: account,
                    check: format!("unpriced_tokens:{name}"),
                    expected: 0,
                    actual: value,
                });
            }
        }
        if unpriced.deferred_closing < 0 {
            failed.push(Discrepancy {
                account_id: account,
                check: "unpriced_tokens:deferred_closing".to_owned(),
                expected: 0,
                actual: unpriced.deferred_closing,
            });
        }
    }
    failed
}

/// The reconciliation's tokens of an account less its priced grants'.
fn unpriced_of(line: &AccountLine, priced: &[CurrencyLine]) -> TokenFigures {
    let mut sum = TokenFigures::default();
    for currency in priced {
        sum.add(&currency.tokens);
    }
    TokenFigures {
        deferred_opening: line.opening - sum.deferred_opening,
        sold: line.credited - sum.sold,
        used: line.committed - sum.used,
        lapsed: line.grant_expired - sum.lapsed,
        adjusted: line.adjusted - sum.adjusted,
        deferred_closing: line.closing - sum.deferred_closing,
    }
}

/// Builds the revenue report of `[from, to)`, optionally for one account
/// and one currency. `from == to` is the deferred balance at that instant
/// (no flows). Waits for `to` to close, as the reconciliation does (409
/// `instant_not_closed` when it does not within a second).
pub fn revenue(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    account: Option<Uuid>,
    currency: Option<&str>,
) -> Result<RevenueReport, ApiError> {
    // The reconciliation of the same period: its horizon, its accounts and
    // its tokens (which the priced and unpriced tokens tie out to).
    let tokens = reconcile(conn, from, to, account)?;
    let (rows, days) = conn
        .build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            Ok::<_, ApiError>((
                currency_rows(conn, from, to, account, currency)?,
                day_rows(conn, from, to, account, currency)?,
            ))
        })?;
    let mut by_account: BTreeMap<Uuid, Vec<CurrencyLine>> = BTreeMap::new();
    for row in rows {
        by_account
            .entry(row.account_id)
            .or_default()
            .push(row.into());
    }
    let mut totals: BTreeMap<String, CurrencyLine> = BTreeMap::new();
    let mut unpriced_total = currency.is_none().then(TokenFigures::default);
    let mut discrepancies = Vec::new();
    let accounts = tokens
        .accounts
        .iter()
        .map(|line| {
            let currencies = by_account.remove(&line.account_id).unwrap_or_default();
            let unpriced = currency.is_none().then(|| unpriced_of(line, &currencies));
            for currency in &currencies {
                totals
                    .entry(currency.currency.clone())
                    .or_insert_with(|| CurrencyLine::new(&currency.currency))
                    .add(currency);
            }
            if let (Some(total), Some(unpriced)) = (unpriced_total.as_mut(), unpriced.as_ref()) {
                total.add(unpriced);
            }
            let failed = account_checks(line.account_id, &currencies, unpriced.as_ref());
            let status = if failed.is_empty() { "ok" } else { "mismatch" };
            discrepancies.extend(failed);
            RevenueAccount {
                account_id: line.account_id,
                name: line.name.clone(),
                status,
                currencies,
                unpriced_tokens: unpriced,
            }
        })
        .collect();
    Ok(RevenueReport {
        from: tokens.from,
        to: tokens.to,
        generated_at: tokens.generated_at,
        status: if discrepancies.is_empty() {
            "ok"
        } else {
            "mismatch"
        },
        currencies: totals.into_values().collect(),
        unpriced_tokens: unpriced_total,
        accounts,
        days: days
            .into_iter()
            .map(|day| DayLine {
                day: day.day.format("%Y-%m-%d").to_string(),
                currency: day.currency,
                recognized: day.recognized,
                breakage: day.breakage,
            })
            .collect(),
        discrepancies,
    })
}

/// One account's deferred revenue in one currency at an instant.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeferredLine {
    pub account_id: Uuid,
    pub name: String,
    pub currency: String,
    /// Deferred revenue, in minor units of `currency`.
    pub deferred: i64,
    /// The tokens it is the value of.
    pub deferred_tokens: i64,
}

/// Every currency's deferred revenue at an instant.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeferredTotal {
    pub currency: String,
    pub deferred: i64,
    pub deferred_tokens: i64,
}

/// Deferred revenue at `as_of`, per account and currency: the month-end
/// close's balance.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeferredReport {
    /// The instant (RFC 3339, UTC): the books before it.
    pub as_of: String,
    /// `ok`, or `mismatch` when a check failed (see `discrepancies`).
    pub status: &'static str,
    /// One line per account and currency with priced grants then, by
    /// account id and currency.
    pub accounts: Vec<DeferredLine>,
    /// The sums per currency.
    pub totals: Vec<DeferredTotal>,
    /// Tokens of unpriced grants not yet used or lapsed; null when the
    /// report is for one currency.
    pub unpriced_tokens: Option<i64>,
    pub discrepancies: Vec<Discrepancy>,
}

/// Deferred revenue at `as_of` (the revenue report of the empty period
/// ending there).
pub fn deferred_at(
    conn: &mut PgConnection,
    as_of: DateTime<Utc>,
    account: Option<Uuid>,
    currency: Option<&str>,
) -> Result<DeferredReport, ApiError> {
    let report = revenue(conn, as_of, as_of, account, currency)?;
    let accounts = report
        .accounts
        .iter()
        .flat_map(|line| {
            line.currencies.iter().map(|money| DeferredLine {
                account_id: line.account_id,
                name: line.name.clone(),
                currency: money.currency.clone(),
                deferred: money.deferred_closing,
                deferred_tokens: money.tokens.deferred_closing,
            })
        })
        .collect();
    Ok(DeferredReport {
        as_of: report.to,
        status: report.status,
        accounts,
        totals: report
            .currencies
            .iter()
            .map(|money| DeferredTotal {
                currency: money.currency.clone(),
                deferred: money.deferred_closing,
                deferred_tokens: money.tokens.deferred_closing,
            })
            .collect(),
        unpriced_tokens: report.unpriced_tokens.map(|tokens| tokens.deferred_closing),
        discrepancies: report.discrepancies,
    })
}

/// The report as CSV: one row per account and currency (money in integer
/// minor units), one row per account for its unpriced tokens (currency
/// `unpriced`, the money columns empty), then a totals row per currency
/// and one for the unpriced tokens. Names are defused against formulas
/// (`csv_text`).
pub fn to_csv(report: &RevenueReport) -> String {
    let mut csv = String::from(
        "account_id,name,currency,deferred_opening,sales,recognized,breakage,adjustments,\
         deferred_closing,tokens_deferred_opening,tokens_sold,tokens_used,tokens_lapsed,\
         tokens_adjusted,tokens_deferred_closing,status\n",
    );
    let row = |csv: &mut String,
               id: &str,
               name: &str,
               currency: &str,
               money: Option<[i64; 6]>,
               tokens: &TokenFigures,
               status: &str| {
        let money = money.map_or_else(|| ",,,,,".to_owned(), |money| joined(&money));
        csv.push_str(&format!(
            "{id},{},{},{money},{},{status}\n",
            csv_text(name),
            csv_text(currency),
            joined(&tokens.numbers()),
        ));
    };
    for account in &report.accounts {
        let id = account.account_id.to_string();
        for line in &account.currencies {
            row(
                &mut csv,
                &id,
                &account.name,
                &line.currency,
                Some(line.money()),
                &line.tokens,
                account.status,
            );
        }
        if let Some(unpriced) = &account.unpriced_tokens {
            row(
                &mut csv,
                &id,
                &account.name,
                "unpriced",
                None,
                unpriced,
                account.status,
            );
        }
    }
    let accounts = format!("{} accounts", report.accounts.len());
    for line in &report.currencies {
        row(
            &mut csv,
            "totals",
            &accounts,
            &line.currency,
            Some(line.money()),
            &line.tokens,
            report.status,
        );
    }
    if let Some(unpriced) = &report.unpriced_tokens {
        row(
            &mut csv,
            "totals",
            &accounts,
            "unpriced",
            None,
            unpriced,
            report.status,
        );
    }
    csv
}
