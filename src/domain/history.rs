//! The books at any instant: balances `as_of` an instant, exact to the
//! entry, and the daily closing records that keep that cheap.
//!
//! An account's state at an instant `T` is that after its last ledger entry
//! written before `T` (entries of one transaction share a `created_at`, so
//! they count all or none). Within an account, entries are written in id
//! order under the account's row lock with `clock_timestamp()`, so
//! `created_at` never goes down as the id goes up: "the entries before `T`"
//! are a prefix of the account's entries.
//!
//! After a UTC day has closed, `close_days` writes one
//! `ledger_daily_closings` row per account that moved that day: its
//! balances after the day's last entry (`last_entry_id`) and running totals
//! of every movement kind. The state at `T` is then the last closing row
//! before `T`'s day plus the account's entries after its `last_entry_id`
//! and before `T`: O(accounts + entries since the last close), whatever the
//! length of the history. Every closing row used is checked against the
//! ledger as it is read (the entry it names, its balances, the entries
//! around it, the identities between its totals); a row that fails is
//! reported as an invariant violation and the answer is computed from the
//! ledger alone instead.

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Date, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::checks::Discrepancy;
use crate::error::ApiError;

/// Serialises `close_days` across replicas (a constant of this service's own).
const CLOSE_LOCK: i64 = crate::db::lock_keys::CLOSE_DAYS;
/// A day is closed once this long has passed since its end (and no
/// transaction that began before its end is still open).
pub const CLOSE_GRACE_SECONDS: i64 = 300;

/// An account's figures at an instant: balances, and running totals of each
/// movement kind since the account was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, QueryableByName)]
pub struct AccountState {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub available: i64,
    #[diesel(sql_type = BigInt)]
    pub reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub used: i64,
    #[diesel(sql_type = BigInt)]
    pub credited: i64,
    #[diesel(sql_type = BigInt)]
    pub adjusted: i64,
    #[diesel(sql_type = BigInt)]
    pub reserved_total: i64,
    #[diesel(sql_type = BigInt)]
    pub committed: i64,
    #[diesel(sql_type = BigInt)]
    pub released: i64,
    #[diesel(sql_type = BigInt)]
    pub expired: i64,
    /// Tokens that left by grants' lapse (`grant_expire` entries) …
    #[diesel(sql_type = BigInt)]
    pub grant_expired: i64,
    /// … of which these left `reserved` (the rest of a reservation going
    /// back to a lapsed grant) and the others `available`.
    #[diesel(sql_type = BigInt)]
    pub grant_expired_reserved: i64,
    #[diesel(sql_type = BigInt)]
    pub job_commit_entries: i64,
    /// The last entry counted (none: the account had not moved yet).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_entry_id: Option<i64>,
    /// What the closing row used (if any) was checked against.
    #[diesel(sql_type = Nullable<Date>)]
    closing_day: Option<NaiveDate>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_available: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_reserved: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_used: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_credited: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_adjusted: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_reserved_total: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_committed: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_released: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_expired: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_grant_expired: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    closing_grant_expired_reserved: Option<i64>,
    /// The ledger's side of the checks: the entry the closing names.
    #[diesel(sql_type = Nullable<BigInt>)]
    ledger_available: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ledger_reserved: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ledger_used: Option<i64>,
    /// The named entry is the account's and was written during the day.
    #[diesel(sql_type = Nullable<Bool>)]
    ledger_entry_in_day: Option<bool>,
    /// No entry after the named one was written before the day's end.
    #[diesel(sql_type = Bool)]
    tail_after_day: bool,
}

impl AccountState {
    /// The failed checks of the closing row this state was built on.
    pub fn closing_discrepancies(&self) -> Vec<Discrepancy> {
        let Some(_day) = self.closing_day else {
            return Vec::new();
        };
        let field = |value: Option<i64>| value.unwrap_or(-1);
        let (available, reserved, used) = (
            field(self.closing_available),
            field(self.closing_reserved),
            field(self.closing_used),
        );
        let (credited, adjusted) = (field(self.closing_credited), field(self.closing_adjusted));
        let (reserved_total, committed) = (
            field(self.closing_reserved_total),
            field(self.closing_committed),
        );
        let (released, expired) = (field(self.closing_released), field(self.closing_expired));
        let (grant_expired, grant_expired_reserved) = (
            field(self.closing_grant_expired),
            field(self.closing_grant_expired_reserved),
        );
        let checks = [
            (
                "daily_closing_available",
                field(self.ledger_available),
                available,
            ),
            (
                "daily_closing_reserved",
                field(self.ledger_reserved),
                reserved,
            ),
            ("daily_closing_used", field(self.ledger_used), used),
            (
                "daily_closing_entry",
                1,
                i64::from(self.ledger_entry_in_day == Some(true) && self.tail_after_day),
            ),
            ("daily_closing_used_is_committed", committed, used),
            (
                "daily_closing_conservation",
                credited + adjusted,
                available + reserved + used + grant_expired,
            ),
            (
                "daily_closing_reserved_roll_forward",
                reserved_total - committed - released - expired - grant_expired_reserved,
                reserved,
            ),
        ];
        Discrepancy::failed(self.account_id, checks)
    }
}

/// Which accounts to read the state of.
#[derive(Clone, Copy, Debug)]
pub struct Accounts {
    /// Only this account.
    pub only: Option<Uuid>,
    /// Accounts opened before this instant.
    pub opened_before: DateTime<Utc>,
    /// Accounts after this id, in id order, at most `limit`.
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// The first day whose closing rows may not be used for the state before
/// `before`: the closing of day D holds the books as they stood at the end
/// of D, so the rows of days before `before`'s own day can be used.
fn first_unusable_day(before: DateTime<Utc>) -> NaiveDate {
    before.date_naive()
}

/// The state of the chosen accounts just before `before` (entries with
/// `created_at < before`), in account id order. Closing rows are used and
/// checked; an account whose closing row fails a check is answered from
/// the ledger alone, and the failed checks are returned with the states.
pub fn states_before(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    accounts: Accounts,
) -> Result<(Vec<AccountState>, Vec<Discrepancy>), ApiError> {
    let states = query_states(conn, before, Some(first_unusable_day(before)), accounts)?;
    let discrepancies: Vec<Discrepancy> = states
        .iter()
        .flat_map(AccountState::closing_discrepancies)
        .collect();
    if discrepancies.is_empty() {
        return Ok((states, discrepancies));
    }
    for discrepancy in &discrepancies {
        tracing::error!(
            account_id = %discrepancy.account_id,
            check = %discrepancy.check,
            expected = discrepancy.expected,
            actual = discrepancy.actual,
            "daily closing does not match the ledger; answering from the ledger alone"
        );
    }
    // No closing row is used for the whole answer.
    let states = query_states(conn, before, None, accounts)?;
    Ok((states, discrepancies))
}

fn query_states(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    usable_before_day: Option<NaiveDate>,
    accounts: Accounts,
) -> Result<Vec<AccountState>, ApiError> {
    Ok(diesel::sql_query(STATE_SQL)
        .bind::<Timestamptz, _>(before)
        .bind::<Date, _>(usable_before_day.unwrap_or_default())
        .bind::<Nullable<SqlUuid>, _>(accounts.only)
        .bind::<Nullable<SqlUuid>, _>(accounts.after)
        .bind::<BigInt, _>(accounts.limit)
        .bind::<Timestamptz, _>(accounts.opened_before)
        .bind::<Bool, _>(usable_before_day.is_some())
        .load(conn)?)
}

/// `$1` the instant (exclusive), `$2` the first day whose closing rows are
/// not used, `$3` one account, `$4` the cursor, `$5` the page size, `$6`
/// accounts opened before, `$7` whether closing rows are used at all. The tail of an account is bounded above by its
/// first closing row from `$2` on (it covers the books through that day's
/// end, which is at or after `$1`), so it is at most one day of entries
/// plus the days not closed yet.
const STATE_SQL: &str = "\
WITH base AS ( \
    SELECT a.id AS account_id, a.name, c.day AS closing_day, c.available AS c_available, \
        c.reserved AS c_reserved, c.used AS c_used, c.credited AS c_credited, \
        c.adjusted AS c_adjusted, c.reserved_total AS c_reserved_total, \
        c.committed AS c_committed, c.released AS c_released, c.expired AS c_expired, \
        c.grant_expired AS c_grant_expired, c.grant_expired_reserved AS c_grant_expired_reserved, \
        c.job_commit_entries AS c_job_commit_entries, c.last_entry_id AS c_last, \
        u.last_entry_id AS u_last \
    FROM accounts a \
    LEFT JOIN LATERAL (SELECT * FROM ledger_daily_closings c \
        WHERE $7 AND c.account_id = a.id AND c.day < $2 ORDER BY c.day DESC LIMIT 1) c ON true \
    LEFT JOIN LATERAL (SELECT u.last_entry_id FROM ledger_daily_closings u \
        WHERE $7 AND u.account_id = a.id AND u.day >= $2 ORDER BY u.day LIMIT 1) u ON true \
    WHERE a.created_at < $6 AND ($3::uuid IS NULL OR a.id = $3) \
      AND ($4::uuid IS NULL OR a.id > $4) \
    ORDER BY a.id LIMIT $5 \
), tail AS ( \
    SELECT b.account_id, t.* FROM base b CROSS JOIN LATERAL ( \
        SELECT max(e.id) AS last_id, min(e.created_at) AS first_at, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'credit'), 0)::bigint AS credited, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'adjustment'), 0)::bigint AS adjusted, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'reserve'), 0)::bigint AS reserved_total, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'commit'), 0)::bigint AS committed, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'release'), 0)::bigint AS released, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'expire'), 0)::bigint AS expired, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'grant_expire'), 0)::bigint AS grant_expired, \
            COALESCE(sum(e.amount) FILTER (WHERE e.kind = 'grant_expire' AND e.reservation_id IS NOT NULL), \
                0)::bigint AS grant_expired_reserved, \
            count(DISTINCT e.reservation_id) FILTER (WHERE e.kind = 'commit' AND e.job_id IS NOT NULL) \
                AS job_commit_entries \
        FROM ledger_entries e \
        WHERE e.account_id = b.account_id AND e.id > COALESCE(b.c_last, 0) \
          AND e.id <= COALESCE(b.u_last, 9223372036854775807) AND e.created_at < $1) t \
) \
SELECT b.account_id, b.name, \
    COALESCE(le.available_after, b.c_available, 0) AS available, \
    COALESCE(le.reserved_after, b.c_reserved, 0) AS reserved, \
    COALESCE(le.used_after, b.c_used, 0) AS used, \
    COALESCE(b.c_credited, 0) + t.credited AS credited, \
    COALESCE(b.c_adjusted, 0) + t.adjusted AS adjusted, \
    COALESCE(b.c_reserved_total, 0) + t.reserved_total AS reserved_total, \
    COALESCE(b.c_committed, 0) + t.committed AS committed, \
    COALESCE(b.c_released, 0) + t.released AS released, \
    COALESCE(b.c_expired, 0) + t.expired AS expired, \
    COALESCE(b.c_grant_expired, 0) + t.grant_expired AS grant_expired, \
    COALESCE(b.c_grant_expired_reserved, 0) + t.grant_expired_reserved AS grant_expired_reserved, \
    COALESCE(b.c_job_commit_entries, 0) + t.job_commit_entries AS job_commit_entries, \
    COALESCE(t.last_id, b.c_last) AS last_entry_id, \
    b.closing_day, b.c_available AS closing_available, b.c_reserved AS closing_reserved, \
    b.c_used AS closing_used, b.c_credited AS closing_credited, b.c_adjusted AS closing_adjusted, \
    b.c_reserved_total AS closing_reserved_total, b.c_committed AS closing_committed, \
    b.c_released AS closing_released, b.c_expired AS closing_expired, \
    b.c_grant_expired AS closing_grant_expired, \
    b.c_grant_expired_reserved AS closing_grant_expired_reserved, \
    ce.available_after AS ledger_available, ce.reserved_after AS ledger_reserved, \
    ce.used_after AS ledger_used, \
    (ce.account_id = b.account_id AND ce.created_at >= b.closing_day::timestamp AT TIME ZONE 'UTC' \
        AND ce.created_at < (b.closing_day + 1)::timestamp AT TIME ZONE 'UTC') AS ledger_entry_in_day, \
    (b.closing_day IS NULL OR t.first_at IS NULL \
        OR t.first_at >= (b.closing_day + 1)::timestamp AT TIME ZONE 'UTC') AS tail_after_day \
FROM base b JOIN tail t ON t.account_id = b.account_id \
LEFT JOIN ledger_entries le ON le.id = t.last_id \
LEFT JOIN ledger_entries ce ON ce.id = b.c_last \
ORDER BY b.account_id";

/// Balances as the books stood at an instant (entries written at or
/// before it count).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BalancesAsOf {
    pub account_id: Uuid,
    pub name: String,
    /// The instant asked for (RFC 3339, UTC, microseconds).
    pub as_of: String,
    /// Free tokens at that instant.
    pub available: i64,
    /// Tokens on hold at that instant.
    pub reserved: i64,
    /// Tokens spent since the account was opened, at that instant.
    pub used: i64,
    /// Tokens bought since the account was opened, at that instant.
    pub credited: i64,
    /// Signed sum of corrections since the account was opened, at that instant.
    pub adjusted: i64,
    /// Tokens that had left by grants' lapse, at that instant.
    pub grant_expired: i64,
    /// The last ledger entry counted; null when the account had not moved.
    pub last_entry_id: Option<i64>,
}

impl BalancesAsOf {
    /// The CSV's columns: every member of the JSON line, in its order.
    pub const CSV_HEADER: &'static str = "account_id,name,as_of,available,reserved,used,credited,\
         adjusted,grant_expired,last_entry_id";

    /// The line in CSV (`token-billing balances --csv`). A finance reader
    /// checks each line on its own: credited + adjusted − grant_expired =
    /// available + reserved + used (docs/finance.md).
    pub fn csv_line(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{}",
            self.account_id,
            crate::domain::reconciliation::csv_text(&self.name),
            self.as_of,
            self.available,
            self.reserved,
            self.used,
            self.credited,
            self.adjusted,
            self.grant_expired,
            self.last_entry_id
                .map(|id| id.to_string())
                .unwrap_or_default()
        )
    }
}

/// One page of balances as of an instant; `next_after` as in the account list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BalancesAsOfPage {
    pub as_of: String,
    /// One line per account (named `balances`, not `accounts`, so the two
    /// answers of the list never look alike).
    pub balances: Vec<BalancesAsOf>,
    pub next_after: Option<Uuid>,
}

/// Parses an `as_of`: an RFC 3339 timestamp (or a `YYYY-MM-DD` date, its
/// midnight UTC), not after `now`, truncated to microseconds (PostgreSQL's
/// resolution).
pub fn parse_as_of(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, ApiError> {
    let instant = crate::time::instant_of("as_of", text).map_err(ApiError::InvalidRequest)?;
    if instant > now {
        return Err(ApiError::InvalidRequest(
            "as_of must not be in the future".into(),
        ));
    }
    let micros = instant.timestamp_micros();
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| ApiError::InvalidRequest("as_of is out of range".into()))
}

use crate::time::rfc3339;

/// How long a read of the books at an instant waits for the instant to
/// close before it answers 409 `instant_not_closed`, and how often it looks.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
const CLOSE_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// The horizon for instants: whether the books before `before` (the
/// entries with `created_at < before`) can no longer change. Every ledger
/// entry carries the time of its transaction (`engine_now`, taken after the
/// transaction's first statement began), so a transaction that began at or
/// after `before` can only write entries at or after it; the books before
/// `before` are closed once `before` has passed and no writing transaction
/// of this database that began before it is still running — any of them
/// could still commit an entry stamped before `before`. A writer is a
/// transaction with a transaction id: every engine path takes its
/// accounts' row locks (which assign one) before it takes its time, so a
/// writer that has none yet stamps its entries after this look. Readers
/// (reports, other `as_of` reads) never hold an instant open. One rule for
/// every reader of an instant (`as_of`, the reconciliation, the daily
/// closings). (Sessions of other roles are visible here only to a role
/// with `pg_read_all_stats`; the service's writers all use its own role.)
pub fn instant_closed(conn: &mut PgConnection, before: DateTime<Utc>) -> Result<bool, ApiError> {
    #[derive(QueryableByName)]
    struct Closed {
        #[diesel(sql_type = Bool)]
        closed: bool,
    }
    let row: Closed = diesel::sql_query(
        "SELECT $1 <= pg_catalog.clock_timestamp() AND NOT EXISTS ( \
             SELECT 1 FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend' AND backend_xid IS NOT NULL \
               AND xact_start < $1) AS closed",
    )
    .bind::<Timestamptz, _>(before)
    .get_result(conn)?;
    Ok(row.closed)
}

/// Waits up to [`CLOSE_WAIT`] for the books before `before` to close
/// ([`instant_closed`]); 409 `instant_not_closed` (retry in a second) when
/// they do not. Call it outside a transaction, before the read's snapshot
/// is taken: what the read then sees before `before` never changes.
pub fn wait_until_closed(conn: &mut PgConnection, before: DateTime<Utc>) -> Result<(), ApiError> {
    let deadline = std::time::Instant::now() + CLOSE_WAIT;
    loop {
        if instant_closed(conn, before)? {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(ApiError::InstantNotClosed {
                at: rfc3339(before),
                retry_after_seconds: 1,
            });
        }
        std::thread::sleep(CLOSE_POLL);
    }
}

/// The primary's write position once the books before `before` have
/// closed there ([`wait_until_closed`]): a read replica that has replayed
/// this far holds everything written before `before` ([`replayed_to`]).
pub fn closed_at_lsn(conn: &mut PgConnection, before: DateTime<Utc>) -> Result<String, ApiError> {
    #[derive(QueryableByName)]
    struct Lsn {
        #[diesel(sql_type = Text)]
        lsn: String,
    }
    wait_until_closed(conn, before)?;
    let row: Lsn =
        diesel::sql_query("SELECT pg_current_wal_lsn()::text AS lsn").get_result(conn)?;
    Ok(row.lsn)
}

/// Whether this server has replayed the primary's WAL up to `lsn` (the
/// primary itself always has). Asked of `pg_is_in_recovery()` first: a
/// primary that went through crash recovery keeps answering
/// `pg_last_wal_replay_lsn()` with where that recovery ended, which is
/// behind everything it wrote since. (A standby that has replayed nothing
/// yet has not replayed `lsn`.)
pub fn replayed_to(conn: &mut PgConnection, lsn: &str) -> Result<bool, ApiError> {
    #[derive(QueryableByName)]
    struct Replayed {
        #[diesel(sql_type = Bool)]
        replayed: bool,
    }
    let row: Replayed = diesel::sql_query(
        "SELECT NOT pg_is_in_recovery() \
                OR COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, false) AS replayed",
    )
    .bind::<Text, _>(lsn)
    .get_result(conn)?;
    Ok(row.replayed)
}

/// The balances of the chosen accounts as of `as_of` (inclusive).
pub fn balances_as_of(
    conn: &mut PgConnection,
    as_of: DateTime<Utc>,
    accounts: Accounts,
) -> Result<Vec<BalancesAsOf>, ApiError> {
    // Entries at `as_of` itself count: "before" is one microsecond later.
    let before = as_of + Duration::microseconds(1);
    // Only a closed instant is answered: the answer never changes.
    wait_until_closed(conn, before)?;
    let (states, _) = conn
        .build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| states_before(conn, before, accounts))?;
    let as_of_text = rfc3339(as_of);
    Ok(states
        .into_iter()
        .map(|state| BalancesAsOf {
            account_id: state.account_id,
            name: state.name,
            as_of: as_of_text.clone(),
            available: state.available,
            reserved: state.reserved,
            used: state.used,
            credited: state.credited,
            adjusted: state.adjusted,
            grant_expired: state.grant_expired,
            last_entry_id: state.last_entry_id,
        })
        .collect())
}

/// One account's balances as of `as_of`; 404 when there is no such account.
pub fn account_as_of(
    conn: &mut PgConnection,
    account: Uuid,
    as_of: DateTime<Utc>,
) -> Result<BalancesAsOf, ApiError> {
    // An account opened after `as_of` had no entries then: zero balances.
    let accounts = Accounts {
        only: Some(account),
        opened_before: DateTime::<Utc>::MAX_UTC,
        after: None,
        limit: 1,
    };
    balances_as_of(conn, as_of, accounts)?
        .pop()
        .ok_or(ApiError::NotFound("account"))
}

/// A page of the account list's balances as of `as_of` (accounts opened at
/// or before it).
pub fn list_as_of(
    conn: &mut PgConnection,
    as_of: DateTime<Utc>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<BalancesAsOfPage, ApiError> {
    let accounts = Accounts {
        only: None,
        opened_before: as_of + Duration::microseconds(1),
        after,
        limit: limit + 1,
    };
    let rows = balances_as_of(conn, as_of, accounts)?;
    let (balances, next_after) =
        crate::domain::paging::page_of(rows, limit, |row: &BalancesAsOf| row.account_id);
    Ok(BalancesAsOfPage {
        as_of: rfc3339(as_of),
        balances,
        next_after,
    })
}

/// What a `close_days` call did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Closed {
    /// Days closed by this call, oldest first.
    pub days: Vec<NaiveDate>,
    /// Closing rows written.
    pub rows: i64,
}

#[derive(QueryableByName)]
struct NextDay {
    #[diesel(sql_type = Nullable<Date>)]
    day: Option<NaiveDate>,
}

fn midnight(day: NaiveDate) -> DateTime<Utc> {
    day.and_time(NaiveTime::MIN).and_utc()
}

/// Closes the UTC days that have ended (at most `max_days` of them, oldest
/// first, one transaction each): a day ends for closing `CLOSE_GRACE_SECONDS`
/// after its midnight, once no transaction that began before that midnight
/// is still open (it could still write an entry of the day). Replicas take
/// turns (advisory lock); a day is closed once.
pub fn close_days(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    max_days: usize,
) -> Result<Closed, ApiError> {
    let mut closed = Closed::default();
    for _ in 0..max_days {
        let step = conn.transaction(|conn| close_next_day(conn, now))?;
        match step {
            Some((day, rows)) => {
                closed.days.push(day);
                closed.rows += rows;
            }
            None => break,
        }
    }
    Ok(closed)
}

fn close_next_day(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> Result<Option<(NaiveDate, i64)>, ApiError> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = Bool)]
        locked: bool,
    }
    let locked: Locked = diesel::sql_query("SELECT pg_try_advisory_xact_lock($1) AS locked")
        .bind::<BigInt, _>(CLOSE_LOCK)
        .get_result(conn)?;
    if !locked.locked {
        return Ok(None);
    }
    let next: NextDay = diesel::sql_query(
        "SELECT COALESCE((SELECT max(day) + 1 FROM ledger_closed_days), \
                         (SELECT (min(created_at) AT TIME ZONE 'UTC')::date FROM ledger_entries)) AS day",
    )
    .get_result(conn)?;
    let Some(day) = next.day else {
        return Ok(None);
    };
    let end = midnight(day + Duration::days(1));
    if end + Duration::seconds(CLOSE_GRACE_SECONDS) > now {
        return Ok(None);
    }
    // Written only after the day's last writer finished (the horizon).
    if !instant_closed(conn, end)? {
        return Ok(None);
    }
    let rows = diesel::sql_query(CLOSE_SQL)
        .bind::<Date, _>(day)
        .bind::<Timestamptz, _>(midnight(day))
        .bind::<Timestamptz, _>(end)
        .execute(conn)?;
    let rows = i64::try_from(rows).unwrap_or(i64::MAX);
    Ok(Some((day, rows)))
}

/// `$1` the day, `$2` its start, `$3` its end. Writes the day's row in
/// ledger_closed_days and a closing row per account that moved that day:
/// the balances after its last entry of the day, and the running totals of
/// its previous closing row plus the day's movements.
const CLOSE_SQL: &str = "\
WITH day_entries AS ( \
    SELECT account_id, \
        max(id) AS last_id, count(*) AS n, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'credit'), 0)::bigint AS credited, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'adjustment'), 0)::bigint AS adjusted, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'reserve'), 0)::bigint AS reserved_total, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'commit'), 0)::bigint AS committed, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'release'), 0)::bigint AS released, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'expire'), 0)::bigint AS expired, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'grant_expire'), 0)::bigint AS grant_expired, \
        COALESCE(sum(amount) FILTER (WHERE kind = 'grant_expire' AND reservation_id IS NOT NULL), \
            0)::bigint AS grant_expired_reserved, \
        count(DISTINCT reservation_id) FILTER (WHERE kind = 'commit' AND job_id IS NOT NULL) \
            AS job_commit_entries \
    FROM ledger_entries WHERE created_at >= $2 AND created_at < $3 GROUP BY account_id \
), day_row AS ( \
    INSERT INTO ledger_closed_days (day, accounts, entries) \
    SELECT $1, count(*), COALESCE(sum(n), 0) FROM day_entries \
    RETURNING day \
) \
INSERT INTO ledger_daily_closings (account_id, day, available, reserved, used, credited, \
    adjusted, reserved_total, committed, released, expired, grant_expired, grant_expired_reserved, \
    job_commit_entries, entries, last_entry_id) \
SELECT d.account_id, (SELECT day FROM day_row), e.available_after, e.reserved_after, e.used_after, \
    COALESCE(p.credited, 0) + d.credited, COALESCE(p.adjusted, 0) + d.adjusted, \
    COALESCE(p.reserved_total, 0) + d.reserved_total, COALESCE(p.committed, 0) + d.committed, \
    COALESCE(p.released, 0) + d.released, COALESCE(p.expired, 0) + d.expired, \
    COALESCE(p.grant_expired, 0) + d.grant_expired, \
    COALESCE(p.grant_expired_reserved, 0) + d.grant_expired_reserved, \
    COALESCE(p.job_commit_entries, 0) + d.job_commit_entries, COALESCE(p.entries, 0) + d.n, d.last_id \
FROM day_entries d \
JOIN ledger_entries e ON e.id = d.last_id \
LEFT JOIN LATERAL (SELECT * FROM ledger_daily_closings c \
    WHERE c.account_id = d.account_id AND c.day < $1 ORDER BY c.day DESC LIMIT 1) p ON true";

/// The last closed day, if any (for metrics and operators).
pub fn last_closed_day(conn: &mut PgConnection) -> Result<Option<NaiveDate>, ApiError> {
    let row: NextDay =
        diesel::sql_query("SELECT max(day) AS day FROM ledger_closed_days").get_result(conn)?;
    Ok(row.day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csv_has_every_column_of_the_json_line() {
        let line = BalancesAsOf {
            account_id: Uuid::nil(),
            name: "a, b".into(),
            as_of: "2026-12-01T00:00:00.000000Z".into(),
            available: 71,
            reserved: 3,
            used: 9,
            credited: 90,
            adjusted: 0,
            grant_expired: 7,
            last_entry_id: Some(12),
        };
        let json = serde_json::to_value(&line).expect("json");
        let mut members: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut columns: Vec<&str> = BalancesAsOf::CSV_HEADER.split(',').collect();
        members.sort_unstable();
        columns.sort_unstable();
        assert_eq!(columns, members);
        assert_eq!(
            line.csv_line(),
            format!(
                "{},\"a, b\",2026-12-01T00:00:00.000000Z,71,3,9,90,0,7,12",
                Uuid::nil()
            )
        );
    }

    #[test]
    fn as_of_is_checked_and_truncated() {
        let now: DateTime<Utc> = "2026-11-29T12:00:00Z".parse().expect("time");
        assert!(parse_as_of("2026-11-29T12:00:01Z", now).is_err(), "future");
        assert!(parse_as_of("yesterday", now).is_err());
        assert!(parse_as_of("2026-11-29T25:00:00Z", now).is_err());
        let parsed = parse_as_of("2026-11-29T10:00:00.1234567+01:00", now).expect("past");
        assert_eq!(rfc3339(parsed), "2026-11-29T09:00:00.123456Z");
        assert_eq!(
            rfc3339(parse_as_of("2026-11-01", now).expect("date")),
            "2026-11-01T00:00:00.000000Z"
        );
    }
}
