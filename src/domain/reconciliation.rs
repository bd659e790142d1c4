//! Finance reconciliation for a period `[from, to)`: per account the
//! roll-forward `opening + credited + adjusted − committed − grant_expired
//! = closing`
//! (opening and closing = available + reserved, from the ledger's
//! balances-after), the movements of the period, succeeded jobs against
//! their commit entries, and the invariant checks of `checks`. One pass of
//! set-based SQL; the rows come ordered by account id, so the same
//! period over the same data gives the same report, byte for byte.
//!
//! Every amount is a whole number of tokens; every instant is UTC. A period
//! bound is an RFC 3339 timestamp or a bare `YYYY-MM-DD` date, meaning that
//! day's midnight UTC. docs/finance.md explains each figure to finance.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::checks::{find_violations, Discrepancy};
use crate::domain::history::{states_before, AccountState, Accounts};
use crate::error::ApiError;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, QueryableByName)]
pub struct AccountReconciliation {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub opening_available: i64,
    #[diesel(sql_type = BigInt)]
    pub opening_reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub opening_used: i64,
    #[diesel(sql_type = BigInt)]
    pub credited: i64,
    /// The part of `credited` that top-up rules added (docs/topups.md).
    #[diesel(sql_type = BigInt)]
    pub credited_by_rules: i64,
    /// The part of `credited` that rollovers carried (docs/topups.md).
    #[diesel(sql_type = BigInt)]
    pub rolled_over: i64,
    #[diesel(sql_type = BigInt)]
    pub adjusted: i64,
    #[diesel(sql_type = BigInt)]
    pub reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub committed: i64,
    #[diesel(sql_type = BigInt)]
    pub grant_expired: i64,
    #[diesel(sql_type = BigInt)]
    pub released: i64,
    #[diesel(sql_type = BigInt)]
    pub expired: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_available: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub closing_used: i64,
    #[diesel(sql_type = BigInt)]
    pub jobs_succeeded: i64,
    #[diesel(sql_type = BigInt)]
    pub job_commit_entries: i64,
}

impl AccountReconciliation {
    pub fn opening(&self) -> i64 {
        self.opening_available + self.opening_reserved
    }

    pub fn closing(&self) -> i64 {
        self.closing_available + self.closing_reserved
    }

    /// The period's own checks (the state checks come from `checks`).
    fn discrepancies(&self) -> Vec<Discrepancy> {
        let checks = [
            (
                "roll_forward",
                self.opening() + self.credited + self.adjusted
                    - self.committed
                    - self.grant_expired,
                self.closing(),
            ),
            (
                "used_roll_forward",
                self.opening_used + self.committed,
                self.closing_used,
            ),
            (
                "succeeded_jobs_match_commits",
                self.jobs_succeeded,
                self.job_commit_entries,
            ),
        ];
        Discrepancy::failed(self.account_id, checks)
    }
}

/// One account's line of the report. Every amount is in tokens; the
/// period is `[from, to)` of the report.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AccountLine {
    /// The account's id.
    pub account_id: Uuid,
    /// The account's name (as it is now), for people reading the report.
    pub name: String,
    /// `ok`, or `mismatch` when a check of this account failed (see
    /// `discrepancies`).
    pub status: &'static str,
    /// Tokens the account held at the start of the period that were not yet
    /// spent: `opening_available + opening_reserved`.
    pub opening: i64,
    /// Tokens bought (top-ups) during the period.
    pub credited: i64,
    /// The part of `credited` that automatic top-up rules added (their own
    /// grants, and the customer's credits answering their requests); the
    /// rest, but `rolled_over`, was credited by hand.
    pub credited_by_rules: i64,
    /// `credited_by_rules` rule by rule.
    pub credits_by_rule: Vec<RuleCredits>,
    /// The part of `credited` that rules' rollovers carried forward: the
    /// unused tokens of lapsing grants (counted in `grant_expired` too)
    /// that came back as new grants (docs/topups.md, "Rollover").
    pub rolled_over: i64,
    /// Signed sum of manual corrections during the period (negative: tokens
    /// taken away).
    pub adjusted: i64,
    /// Tokens spent during the period (generations paid for). The roll-forward
    /// is `opening + credited + adjusted − committed − grant_expired =
    /// closing`.
    pub committed: i64,
    /// Tokens that left the account during the period because the grant
    /// holding them lapsed (ledger kind `grant_expire`): unspent tokens of
    /// a grant past its `expires_at`.
    pub grant_expired: i64,
    /// Tokens held and not yet spent at the end of the period:
    /// `closing_available + closing_reserved`.
    pub closing: i64,
    /// Tokens put on hold during the period (a movement, not a balance: each
    /// hold ends as committed, released or expired). Compare
    /// `closing_reserved`, the tokens on hold at the end.
    pub reserved: i64,
    /// Held tokens given back during the period (the work failed or was
    /// cancelled; a partial commit gives back the rest).
    pub released: i64,
    /// Held tokens given back during the period because their hold ran out.
    pub expired: i64,
    /// Free tokens at the start of the period.
    pub opening_available: i64,
    /// Tokens on hold at the start of the period.
    pub opening_reserved: i64,
    /// Tokens spent since the account was opened, at the start of the period.
    pub opening_used: i64,
    /// Free tokens at the end of the period.
    pub closing_available: i64,
    /// Tokens on hold at the end of the period (a balance; compare `reserved`).
    pub closing_reserved: i64,
    /// Tokens spent since the account was opened, at the end of the period:
    /// `opening_used + committed`.
    pub closing_used: i64,
    /// Generation jobs that succeeded during the period.
    pub jobs_succeeded: i64,
    /// Commits of jobs in the ledger during the period (a commit that
    /// spans several grants writes one entry per grant and counts once):
    /// equals `jobs_succeeded` when every successful job was charged once.
    pub job_commit_entries: i64,
}

/// What one top-up rule credited to an account during the period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RuleCredits {
    pub rule_id: Uuid,
    pub credited: i64,
}

/// The sums of the account lines (in tokens; `accounts` counts lines).
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Totals {
    /// Accounts in the report (those opened before the end of the period).
    pub accounts: i64,
    /// Sum of the accounts' `opening`.
    pub opening: i64,
    /// Sum of the accounts' `credited`.
    pub credited: i64,
    /// Sum of the accounts' `credited_by_rules`.
    pub credited_by_rules: i64,
    /// Sum of the accounts' `rolled_over`.
    pub rolled_over: i64,
    /// Sum of the accounts' `adjusted`.
    pub adjusted: i64,
    /// Sum of the accounts' `committed`.
    pub committed: i64,
    /// Sum of the accounts' `grant_expired`.
    pub grant_expired: i64,
    /// Sum of the accounts' `closing`.
    pub closing: i64,
    /// Sum of the accounts' `reserved` (holds placed during the period).
    pub reserved: i64,
    /// Sum of the accounts' `released`.
    pub released: i64,
    /// Sum of the accounts' `expired`.
    pub expired: i64,
    /// Sum of the accounts' `jobs_succeeded`.
    pub jobs_succeeded: i64,
    /// Sum of the accounts' `job_commit_entries`.
    pub job_commit_entries: i64,
}

/// The finance report of the period `[from, to)`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// Start of the period, included (RFC 3339, UTC).
    pub from: String,
    /// End of the period, excluded (RFC 3339, UTC).
    pub to: String,
    /// The instant the books were read up to: the end of the period, or
    /// the database's `now()` while the period is still open.
    pub generated_at: String,
    /// `ok`, or `mismatch` when any check failed (see `discrepancies`).
    pub status: &'static str,
    /// The sums over all account lines.
    pub totals: Totals,
    /// One line per account opened before the end of the period, ordered by
    /// `account_id`.
    pub accounts: Vec<AccountLine>,
    /// Every failed check, empty when `status` is `ok`.
    pub discrepancies: Vec<Discrepancy>,
}

impl Report {
    /// A file name for the report's CSV naming its period, e.g.
    /// `reconciliation_2026-11-01_2026-12-01.csv` (with the time of day,
    /// `…_2026-11-01T10-30-00Z_…`, when a bound is not a UTC midnight).
    pub fn csv_file_name(&self) -> String {
        period_file_name("reconciliation", &self.from, &self.to)
    }
}

/// `<prefix>_<from>_<to>.csv` for a report of a period: each bound a date
/// when it is a UTC midnight, else with its time of day
/// (`…_2026-11-01T10-30-00Z_…`).
pub fn period_file_name(prefix: &str, from: &str, to: &str) -> String {
    let bound = |text: &str| {
        let instant = DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc));
        match instant {
            Ok(instant) if instant.time() == chrono::NaiveTime::MIN => {
                instant.format("%Y-%m-%d").to_string()
            }
            Ok(instant) => instant.format("%Y-%m-%dT%H-%M-%SZ").to_string(),
            Err(_) => "period".to_owned(),
        }
    };
    format!("{prefix}_{}_{}.csv", bound(from), bound(to))
}

use crate::time::rfc3339;

/// Builds the report for `[from, to)`, optionally for one account. The
/// books at `from` and at `to` come from `history::states_before` (the
/// daily closings plus the entries since, each closing checked against the
/// ledger), so a long period costs about what a short one does.
pub fn reconcile(
    conn: &mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    account: Option<Uuid>,
) -> Result<Report, ApiError> {
    // Only a closed period is answered (the horizon): asked again later,
    // the report is the same. (A period still running is read up to now:
    // the writers running now must end first.)
    crate::domain::history::wait_until_closed(conn, to.min(Utc::now()))?;
    // One snapshot for the period query and the state checks.
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            let accounts = Accounts {
                only: account,
                opened_before: to,
                after: None,
                limit: i64::MAX,
            };
            let (opening, mut discrepancies) = states_before(conn, from, accounts)?;
            let (closing, closing_discrepancies) = states_before(conn, to, accounts)?;
            discrepancies.extend(closing_discrepancies);
            let jobs: Vec<JobsSucceeded> = diesel::sql_query(
                "SELECT account_id, count(*) AS succeeded FROM generation_jobs \
             WHERE status = 'succeeded' AND finished_at >= $1 AND finished_at < $2 \
               AND ($3::uuid IS NULL OR account_id = $3) GROUP BY account_id",
            )
            .bind::<Timestamptz, _>(from)
            .bind::<Timestamptz, _>(to)
            .bind::<Nullable<SqlUuid>, _>(account)
            .load(conn)?;
            let jobs: std::collections::HashMap<Uuid, i64> = jobs
                .into_iter()
                .map(|row| (row.account_id, row.succeeded))
                .collect();
            let by_rule: Vec<CreditedByRule> = diesel::sql_query(
                "SELECT e.account_id, g.topup_rule_id AS rule_id, \
                        COALESCE(sum(e.amount) FILTER (WHERE g.rolled_over_from IS NULL), 0)::bigint \
                            AS credited, \
                        COALESCE(sum(e.amount) FILTER (WHERE g.rolled_over_from IS NOT NULL), 0) \
                            ::bigint AS rolled_over \
                 FROM ledger_entries e JOIN credit_grants g ON g.id = e.grant_id \
                 WHERE e.kind = 'credit' AND g.topup_rule_id IS NOT NULL \
                   AND e.created_at >= $1 AND e.created_at < $2 \
                   AND ($3::uuid IS NULL OR e.account_id = $3) \
                 GROUP BY e.account_id, g.topup_rule_id ORDER BY e.account_id, g.topup_rule_id",
            )
            .bind::<Timestamptz, _>(from)
            .bind::<Timestamptz, _>(to)
            .bind::<Nullable<SqlUuid>, _>(account)
            .load(conn)?;
            let mut rules: std::collections::HashMap<Uuid, (Vec<RuleCredits>, i64)> =
                std::collections::HashMap::new();
            for row in by_rule {
                let (credits, rolled_over) = rules.entry(row.account_id).or_default();
                *rolled_over += row.rolled_over;
                if row.credited > 0 {
                    credits.push(RuleCredits {
                        rule_id: row.rule_id,
                        credited: row.credited,
                    });
                }
            }
            let rows: Vec<(AccountReconciliation, Vec<RuleCredits>)> = opening
                .iter()
                .zip(&closing)
                .map(|(open, close)| {
                    let (credits, rolled_over) =
                        rules.remove(&open.account_id).unwrap_or_default();
                    let mut row = period_row(
                        open,
                        close,
                        jobs.get(&open.account_id).copied().unwrap_or(0),
                    );
                    row.credited_by_rules = credits.iter().map(|rule| rule.credited).sum();
                    row.rolled_over = rolled_over;
                    (row, credits)
                })
                .collect();
            discrepancies.extend(rows.iter().flat_map(|(row, _)| row.discrepancies()));
            discrepancies.extend(
                find_violations(conn)?
                    .into_iter()
                    .filter(|d| account.is_none_or(|only| d.account_id == only)),
            );
            discrepancies.sort_by(|a, b| (a.account_id, &a.check).cmp(&(b.account_id, &b.check)));
            discrepancies.dedup();
            let now: DateTime<Utc> =
                diesel::select(diesel::dsl::now.into_sql::<Timestamptz>()).get_result(conn)?;
            Ok(build_report(from, to, now, rows, discrepancies))
        })
}

#[derive(QueryableByName)]
struct CreditedByRule {
    #[diesel(sql_type = SqlUuid)]
    account_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    rule_id: Uuid,
    #[diesel(sql_type = BigInt)]
    credited: i64,
    #[diesel(sql_type = BigInt)]
    rolled_over: i64,
}

#[derive(QueryableByName)]
struct JobsSucceeded {
    #[diesel(sql_type = SqlUuid)]
    account_id: Uuid,
    #[diesel(sql_type = BigInt)]
    succeeded: i64,
}

/// An account's line from its books at the start and at the end of the
/// period: movements are differences of running totals.
fn period_row(
    open: &AccountState,
    close: &AccountState,
    jobs_succeeded: i64,
) -> AccountReconciliation {
    debug_assert_eq!(open.account_id, close.account_id);
    AccountReconciliation {
        account_id: close.account_id,
        name: close.name.clone(),
        opening_available: open.available,
        opening_reserved: open.reserved,
        opening_used: open.used,
        credited: close.credited - open.credited,
        credited_by_rules: 0,
        rolled_over: 0,
        adjusted: close.adjusted - open.adjusted,
        reserved: close.reserved_total - open.reserved_total,
        committed: close.committed - open.committed,
        grant_expired: close.grant_expired - open.grant_expired,
        released: close.released - open.released,
        expired: close.expired - open.expired,
        closing_available: close.available,
        closing_reserved: close.reserved,
        closing_used: close.used,
        jobs_succeeded,
        job_commit_entries: close.job_commit_entries - open.job_commit_entries,
    }
}

fn build_report(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    rows: Vec<(AccountReconciliation, Vec<RuleCredits>)>,
    discrepancies: Vec<Discrepancy>,
) -> Report {
    let mut totals = Totals::default();
    let accounts: Vec<AccountLine> = rows
        .into_iter()
        .map(|(row, credits_by_rule)| {
            totals.accounts += 1;
            totals.opening += row.opening();
            totals.credited += row.credited;
            totals.credited_by_rules += row.credited_by_rules;
            totals.rolled_over += row.rolled_over;
            totals.adjusted += row.adjusted;
            totals.committed += row.committed;
            totals.grant_expired += row.grant_expired;
            totals.closing += row.closing();
            totals.reserved += row.reserved;
            totals.released += row.released;
            totals.expired += row.expired;
            totals.jobs_succeeded += row.jobs_succeeded;
            totals.job_commit_entries += row.job_commit_entries;
            let mismatch = discrepancies.iter().any(|d| d.account_id == row.account_id);
            AccountLine {
                account_id: row.account_id,
                name: row.name.clone(),
                status: if mismatch { "mismatch" } else { "ok" },
                opening: row.opening(),
                credited: row.credited,
                credited_by_rules: row.credited_by_rules,
                credits_by_rule,
                rolled_over: row.rolled_over,
                adjusted: row.adjusted,
                committed: row.committed,
                grant_expired: row.grant_expired,
                closing: row.closing(),
                reserved: row.reserved,
                released: row.released,
                expired: row.expired,
                opening_available: row.opening_available,
                opening_reserved: row.opening_reserved,
                opening_used: row.opening_used,
                closing_available: row.closing_available,
                closing_reserved: row.closing_reserved,
                closing_used: row.closing_used,
                jobs_succeeded: row.jobs_succeeded,
                job_commit_entries: row.job_commit_entries,
            }
        })
        .collect();
    Report {
        from: rfc3339(from),
        to: rfc3339(to),
        generated_at: rfc3339(to.min(now)),
        status: if discrepancies.is_empty() {
            "ok"
        } else {
            "mismatch"
        },
        totals,
        accounts,
        discrepancies,
    }
}

/// The per-account lines as CSV (RFC 4180: a header line, then one line per
/// account); text fields go through [`csv_text`] (quoted when needed,
/// defused against formulas wherever a spreadsheet may start a cell).
pub fn to_csv(report: &Report) -> String {
    let mut csv = String::from(
        "account_id,name,status,opening,credited,credited_by_rules,rolled_over,adjusted,committed,grant_expired,closing,reserved,\
         released,expired,\
         opening_available,opening_reserved,opening_used,closing_available,closing_reserved,closing_used,\
         jobs_succeeded,job_commit_entries,failed_checks\n",
    );
    let mut sums = [0_i64; 19];
    for line in &report.accounts {
        let failed: Vec<&str> = report
            .discrepancies
            .iter()
            .filter(|d| d.account_id == line.account_id)
            .map(|d| d.check.as_str())
            .collect();
        let numbers = csv_numbers(line);
        for (sum, number) in sums.iter_mut().zip(numbers) {
            *sum += number;
        }
        csv.push_str(&format!(
            "{},{},{},{},{}\n",
            line.account_id,
            csv_text(&line.name),
            line.status,
            joined(&numbers),
            csv_text(&failed.join(";"))
        ));
    }
    // The last row: every column summed over the accounts (the JSON's
    // `totals`, and the balance columns it does not carry), so the file
    // balances on its own. `failed_checks` counts the failed checks.
    csv.push_str(&format!(
        "totals,{} accounts,{},{},{}\n",
        report.accounts.len(),
        report.status,
        joined(&sums),
        report.discrepancies.len()
    ));
    csv
}

/// An account line's numbers in the CSV's column order.
fn csv_numbers(line: &AccountLine) -> [i64; 19] {
    [
        line.opening,
        line.credited,
        line.credited_by_rules,
        line.rolled_over,
        line.adjusted,
        line.committed,
        line.grant_expired,
        line.closing,
        line.reserved,
        line.released,
        line.expired,
        line.opening_available,
        line.opening_reserved,
        line.opening_used,
        line.closing_available,
        line.closing_reserved,
        line.closing_used,
        line.jobs_succeeded,
        line.job_commit_entries,
    ]
}

pub(crate) fn joined(numbers: &[i64]) -> String {
    numbers
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Characters that make a spreadsheet run a cell as a formula when the
/// cell starts with one (OWASP, CSV injection).
const FORMULA_STARTS: [char; 7] = ['=', '+', '-', '@', '\t', '\r', '\n'];

/// Characters a spreadsheet may split cells at: `,`, or `;` where the
/// locale's list separator is `;` (German, French, Dutch defaults).
const CELL_SEPARATORS: [char; 2] = [',', ';'];

/// Whether a cell starting with `rest` would be read as a formula: it
/// starts with a formula character, or does after blanks (spreadsheets
/// skip leading spaces, the no-break space included).
fn starts_a_formula(rest: &str) -> bool {
    rest.starts_with(FORMULA_STARTS)
        || rest
            .trim_start_matches(|c: char| c.is_whitespace() || c == '\u{FEFF}' || c == '\u{200B}')
            .starts_with(FORMULA_STARTS)
}

/// One text field of the CSV, following OWASP's CSV-injection guidance
/// wherever a spreadsheet may start a cell: at the field's start and after
/// every `,` or `;` inside it (a `;`-splitting spreadsheet reads
/// `Booth 7;=1+1` as two cells), a would-be formula gets a leading `'`;
/// then a field holding a separator, a quote or a line break is quoted
/// (RFC 4180).
pub fn csv_text(text: &str) -> String {
    let mut defused = String::with_capacity(text.len() + 2);
    let mut cell_starts = true;
    for (at, character) in text.char_indices() {
        if cell_starts && starts_a_formula(&text[at..]) {
            defused.push('\'');
        }
        cell_starts = CELL_SEPARATORS.contains(&character);
        defused.push(character);
    }
    if defused.contains([',', ';', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

/// Parses and checks a period: each bound an RFC 3339 timestamp or a
/// `YYYY-MM-DD` date (that day's midnight UTC), `from < to`, at most `max`
/// long; `to` defaults to now, `from` to `to − default`.
pub fn parse_period(
    from: Option<&str>,
    to: Option<&str>,
    now: DateTime<Utc>,
    default: std::time::Duration,
    max: std::time::Duration,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let parse = |name: &str, text: &str| {
        crate::time::instant_of(name, text).map_err(ApiError::InvalidRequest)
    };
    let to = to.map(|text| parse("to", text)).transpose()?.unwrap_or(now);
    let default =
        chrono::Duration::from_std(default).map_err(|e| ApiError::Internal(e.to_string()))?;
    let max = chrono::Duration::from_std(max).map_err(|e| ApiError::Internal(e.to_string()))?;
    let from = from
        .map(|text| parse("from", text))
        .transpose()?
        .unwrap_or(to - default);
    if from >= to {
        return Err(ApiError::InvalidRequest("from must be before to".into()));
    }
    if to - from > max {
        return Err(ApiError::InvalidRequest(format!(
            "the period may be at most {} days",
            max.num_days()
        )));
    }
    Ok((from, to))
}

/// A report's period as the reconciliation, the revenue and the usage
/// reports take it (the API and `token-billing reconcile`): `to` defaults
/// to now, `from` to 30 days before, at most 366 days (`parse_period`).
pub fn report_period(
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    parse_period(
        from,
        to,
        Utc::now(),
        crate::config::RECONCILIATION_RANGE_DEFAULT,
        crate::config::RECONCILIATION_RANGE_MAX,
    )
}

/// The OpenAPI schema of an instant in a query string (`from`, `to`,
/// `as_of`): the shape `crate::time::parse_instant` reads, a date or a date and time with a
/// UTC offset. A value of this shape that is no real instant (a 13th month)
/// is still refused with 400 and the reason. An offset's `+` typed
/// unencoded in a URL arrives as a space; it is read back as the `+` it
/// was (a tolerance for hand-typed URLs, outside this pattern).
#[derive(utoipa::ToSchema)]
#[schema(
    example = "2026-11-01",
    pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2}))?$"
)]
pub struct InstantParam(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_names_are_quoted_and_defused() {
        assert_eq!(csv_text("Wedding Müller"), "Wedding Müller");
        assert_eq!(csv_text("Smith, Jones"), "\"Smith, Jones\"");
        assert_eq!(csv_text("the \"best\" booth"), "\"the \"\"best\"\" booth\"");
        assert_eq!(csv_text("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(csv_text("-1,2"), "\"'-1,2\"");
        assert_eq!(csv_text("Booth 7;=1+1;"), "\"Booth 7;'=1+1;\"");
        assert_eq!(csv_text(" =1+1"), "' =1+1");
        assert_eq!(csv_text("\u{A0}@SUM(A1)"), "'\u{A0}@SUM(A1)");
        assert_eq!(csv_text("a, +1"), "\"a,' +1\"");
        assert_eq!(csv_text("a;b"), "\"a;b\"");
    }

    #[test]
    fn csv_file_names_name_the_period() {
        let report = Report {
            from: "2026-11-01T00:00:00.000000Z".into(),
            to: "2026-12-01T00:00:00.000000Z".into(),
            generated_at: String::new(),
            status: "ok",
            totals: Totals::default(),
            accounts: Vec::new(),
            discrepancies: Vec::new(),
        };
        assert_eq!(
            report.csv_file_name(),
            "reconciliation_2026-11-01_2026-12-01.csv"
        );
        let report = Report {
            to: "2026-12-01T10:30:00.000000Z".into(),
            ..report
        };
        assert_eq!(
            report.csv_file_name(),
            "reconciliation_2026-11-01_2026-12-01T10-30-00Z.csv"
        );
    }

    #[test]
    fn periods_are_checked() {
        let now: DateTime<Utc> = "2026-11-29T12:00:00Z".parse().expect("time");
        let day = std::time::Duration::from_secs(86_400);
        let year = std::time::Duration::from_secs(366 * 86_400);
        let (from, to) = parse_period(None, None, now, day, year).expect("defaults");
        assert_eq!((to - from).num_hours(), 24);
        assert!(parse_period(
            Some("2026-11-29T12:00:00Z"),
            Some("2026-11-29T12:00:00Z"),
            now,
            day,
            year
        )
        .is_err());
        assert!(parse_period(Some("yesterday"), None, now, day, year).is_err());
        assert!(parse_period(Some("2020-01-01T00:00:00Z"), None, now, day, year).is_err());
        let (from, _) =
            parse_period(Some("2026-11-29T10:00:00+01:00"), None, now, day, year).expect("offset");
        assert_eq!(
            from,
            "2026-11-29T09:00:00Z"
                .parse::<DateTime<Utc>>()
                .expect("time")
        );
    }
}
