//! The token invariants (docs/architecture.md), checked in one set-based
//! query: never a silent repair. Used by the reaper (which counts and logs violations)
//! and by reconciliation (which reports them).

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use serde::Serialize;
use uuid::Uuid;

use crate::error::ApiError;

/// One failed check of one account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Discrepancy {
    /// The account whose check failed.
    pub account_id: Uuid,
    /// Which check failed, e.g. `roll_forward`, `used_roll_forward`,
    /// `succeeded_jobs_match_commits`, `balance_invariant`,
    /// `reserved_equals_held_reservations`, `ledger_replay_available`
    /// (docs/finance.md lists them all).
    pub check: String,
    /// What the check computed the figure should be (tokens or a count).
    pub expected: i64,
    /// What the books hold instead.
    pub actual: i64,
}

impl Discrepancy {
    /// The failed ones of an account's checks, each `(check, expected,
    /// actual)`: a check fails when the two figures differ.
    pub fn failed<const N: usize>(
        account_id: Uuid,
        checks: [(&str, i64, i64); N],
    ) -> Vec<Discrepancy> {
        checks
            .into_iter()
            .filter(|(_, expected, actual)| expected != actual)
            .map(|(check, expected, actual)| Discrepancy {
                account_id,
                check: check.to_owned(),
                expected,
                actual,
            })
            .collect()
    }
}

#[derive(QueryableByName)]
struct CheckRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = BigInt)]
    available: i64,
    #[diesel(sql_type = BigInt)]
    reserved: i64,
    #[diesel(sql_type = BigInt)]
    used: i64,
    #[diesel(sql_type = BigInt)]
    credited: i64,
    #[diesel(sql_type = BigInt)]
    adjusted: i64,
    #[diesel(sql_type = BigInt)]
    grant_expired: i64,
    #[diesel(sql_type = BigInt)]
    active_reservations: i64,
    #[diesel(sql_type = BigInt)]
    held_amount: i64,
    #[diesel(sql_type = BigInt)]
    held_count: i64,
    #[diesel(sql_type = BigInt)]
    held_drawn: i64,
    #[diesel(sql_type = BigInt)]
    replay_available: i64,
    #[diesel(sql_type = BigInt)]
    replay_reserved: i64,
    #[diesel(sql_type = BigInt)]
    replay_used: i64,
    #[diesel(sql_type = BigInt)]
    replay_grant_expired: i64,
    #[diesel(sql_type = BigInt)]
    grants_remaining: i64,
    #[diesel(sql_type = BigInt)]
    grants_reserved: i64,
}

/// Accounts breaking an invariant, with every check they fail. The ledger
/// replay is incremental: the running totals of the account's last daily
/// closing (themselves sums of its entries, `history::close_days`) plus
/// its entries after that closing's last entry, so the reaper's pass costs
/// O(accounts + entries since the last close), not O(history). A closing
/// whose totals were altered shows as a `ledger_replay_*` violation.
pub fn find_violations(conn: &mut PgConnection) -> Result<Vec<Discrepancy>, ApiError> {
    let rows: Vec<CheckRow> = diesel::sql_query(
        "WITH held AS ( \
             SELECT r.account_id, sum(r.amount)::bigint AS amount, count(*) AS n, \
                 COALESCE(sum((SELECT sum((d->>'amount')::bigint) FROM jsonb_array_elements(r.draws) d \
                               WHERE d->>'grant_id' IS NOT NULL)), 0)::bigint AS drawn \
             FROM reservations r WHERE r.state = 'held' GROUP BY r.account_id), \
         granted AS ( \
             SELECT account_id, sum(remaining)::bigint AS remaining, sum(reserved)::bigint AS reserved \
             FROM credit_grants WHERE remaining + reserved > 0 GROUP BY account_id), \
         replay AS ( \
             SELECT a.id AS account_id, \
                 (COALESCE(c.credited + c.adjusted - c.reserved_total + c.released + c.expired \
                           - (c.grant_expired - c.grant_expired_reserved), 0) \
                     + t.available)::bigint AS available, \
                 (COALESCE(c.reserved_total - c.committed - c.released - c.expired \
                           - c.grant_expired_reserved, 0) \
                     + t.reserved)::bigint AS reserved, \
                 (COALESCE(c.committed, 0) + t.used)::bigint AS used, \
                 (COALESCE(c.grant_expired, 0) + t.grant_expired)::bigint AS grant_expired \
             FROM accounts a \
             LEFT JOIN LATERAL (SELECT * FROM ledger_daily_closings c WHERE c.account_id = a.id \
                                ORDER BY c.day DESC LIMIT 1) c ON true \
             CROSS JOIN LATERAL ( \
                 SELECT \
                     COALESCE(sum(CASE WHEN kind IN ('credit', 'adjustment', 'release', 'expire') THEN amount \
                              WHEN kind = 'reserve' THEN -amount \
                              WHEN kind = 'grant_expire' AND reservation_id IS NULL THEN -amount \
                              ELSE 0 END), 0) AS available, \
                     COALESCE(sum(CASE WHEN kind = 'reserve' THEN amount \
                              WHEN kind IN ('commit', 'release', 'expire') THEN -amount \
                              WHEN kind = 'grant_expire' AND reservation_id IS NOT NULL THEN -amount \
                              ELSE 0 END), 0) AS reserved, \
                     COALESCE(sum(CASE WHEN kind = 'commit' THEN amount ELSE 0 END), 0) AS used, \
                     COALESCE(sum(CASE WHEN kind = 'grant_expire' THEN amount ELSE 0 END), 0) \
                         AS grant_expired \
                 FROM ledger_entries e \
                 WHERE e.account_id = a.id AND e.id > COALESCE(c.last_entry_id, 0)) t) \
         SELECT a.id, a.available, a.reserved, a.used, a.credited, a.adjusted, a.grant_expired, \
                a.active_reservations::bigint AS active_reservations, \
                COALESCE(h.amount, 0) AS held_amount, COALESCE(h.n, 0) AS held_count, \
                COALESCE(h.drawn, 0) AS held_drawn, \
                COALESCE(r.available, 0) AS replay_available, COALESCE(r.reserved, 0) AS replay_reserved, \
                COALESCE(r.used, 0) AS replay_used, \
                COALESCE(r.grant_expired, 0) AS replay_grant_expired, \
                COALESCE(g.remaining, 0) AS grants_remaining, COALESCE(g.reserved, 0) AS grants_reserved \
         FROM accounts a \
         LEFT JOIN held h ON h.account_id = a.id \
         LEFT JOIN replay r ON r.account_id = a.id \
         LEFT JOIN granted g ON g.account_id = a.id \
         WHERE a.credited + a.adjusted <> a.available + a.reserved + a.used + a.grant_expired \
            OR a.reserved <> COALESCE(h.amount, 0) \
            OR a.active_reservations <> COALESCE(h.n, 0) \
            OR a.available <> COALESCE(r.available, 0) \
            OR a.reserved <> COALESCE(r.reserved, 0) \
            OR a.used <> COALESCE(r.used, 0) \
            OR a.grant_expired <> COALESCE(r.grant_expired, 0) \
            OR a.available <> COALESCE(g.remaining, 0) \
            OR a.reserved <> COALESCE(g.reserved, 0) \
            OR COALESCE(h.drawn, 0) <> COALESCE(h.amount, 0) \
         ORDER BY a.id",
    )
    .load(conn)?;
    Ok(rows.into_iter().flat_map(discrepancies).collect())
}

fn discrepancies(row: CheckRow) -> Vec<Discrepancy> {
    let checks = [
        (
            "balance_invariant",
            row.credited + row.adjusted,
            row.available + row.reserved + row.used + row.grant_expired,
        ),
        (
            "reserved_equals_held_reservations",
            row.held_amount,
            row.reserved,
        ),
        (
            "active_reservations_equals_held_count",
            row.held_count,
            row.active_reservations,
        ),
        (
            "ledger_replay_available",
            row.replay_available,
            row.available,
        ),
        ("ledger_replay_reserved", row.replay_reserved, row.reserved),
        ("ledger_replay_used", row.replay_used, row.used),
        (
            "ledger_replay_grant_expired",
            row.replay_grant_expired,
            row.grant_expired,
        ),
        (
            "grants_remaining_equals_available",
            row.grants_remaining,
            row.available,
        ),
        (
            "grants_reserved_equals_reserved",
            row.grants_reserved,
            row.reserved,
        ),
        // A held reservation's draws name grants and sum to its amount
        // (one without draws settles as a draw of no grant: its tokens
        // still move, and this names it).
        (
            "held_reservations_drawn_from_grants",
            row.held_amount,
            row.held_drawn,
        ),
    ];
    Discrepancy::failed(row.id, checks)
}

/// How many distinct accounts the discrepancies name.
pub fn accounts_violating(discrepancies: &[Discrepancy]) -> usize {
    let mut accounts: Vec<Uuid> = discrepancies.iter().map(|d| d.account_id).collect();
    accounts.sort();
    accounts.dedup();
    accounts.len()
}

/// Every grant's books from the ledger alone: its opening (an upgraded
/// balance's grant holds `amount - opening_reserved` remaining and
/// `opening_reserved` reserved; any other grant starts empty) plus the
/// entries naming it — credit and adjustment (signed) move `remaining`,
/// reserve moves remaining to reserved, release and expire back, commit
/// takes from reserved, grant_expire takes from remaining (or from
/// reserved, when it names a reservation). Returns the grants whose `remaining` or `reserved`
/// disagree (checks `grant_ledger_remaining`, `grant_ledger_reserved`, with
/// the grant's account), and those drawn by a reserve entry written at or
/// after their expiry (`grant_drawn_after_lapse`: a lapsed grant is never
/// drawn). A full scan of the entries that name a grant: for
/// the chaos run and the tests, not for the reaper, whose pass stays
/// O(accounts + entries since the last closing) and checks the grants'
/// sums against the account's balances (`find_violations`).
pub fn grants_disagreeing_with_ledger(
    conn: &mut PgConnection,
) -> Result<Vec<Discrepancy>, ApiError> {
    #[derive(QueryableByName)]
    struct GrantRow {
        #[diesel(sql_type = SqlUuid)]
        account_id: Uuid,
        #[diesel(sql_type = BigInt)]
        remaining: i64,
        #[diesel(sql_type = BigInt)]
        reserved: i64,
        #[diesel(sql_type = BigInt)]
        ledger_remaining: i64,
        #[diesel(sql_type = BigInt)]
        ledger_reserved: i64,
        #[diesel(sql_type = BigInt)]
        drawn_after_lapse: i64,
    }
    let rows: Vec<GrantRow> = diesel::sql_query(
        "WITH moved AS ( \
             SELECT grant_id, \
                 sum(CASE WHEN kind IN ('credit', 'adjustment', 'release', 'expire') THEN amount \
                          WHEN kind = 'reserve' THEN -amount \
                          WHEN kind = 'grant_expire' AND reservation_id IS NULL THEN -amount \
                          ELSE 0 END)::bigint AS remaining, \
                 sum(CASE WHEN kind = 'reserve' THEN amount \
                          WHEN kind IN ('commit', 'release', 'expire') THEN -amount \
                          WHEN kind = 'grant_expire' AND reservation_id IS NOT NULL THEN -amount \
                          ELSE 0 END)::bigint \
                     AS reserved \
             FROM ledger_entries WHERE grant_id IS NOT NULL GROUP BY grant_id), \
         late AS ( \
             SELECT e.grant_id, sum(e.amount)::bigint AS drawn \
             FROM ledger_entries e JOIN credit_grants g ON g.id = e.grant_id \
             WHERE e.kind = 'reserve' AND e.created_at >= g.expires_at GROUP BY e.grant_id) \
         SELECT g.account_id, g.remaining, g.reserved, COALESCE(l.drawn, 0) AS drawn_after_lapse, \
                (CASE WHEN g.source = 'upgrade' THEN g.amount - g.opening_reserved ELSE 0 END \
                    + COALESCE(m.remaining, 0))::bigint AS ledger_remaining, \
                (CASE WHEN g.source = 'upgrade' THEN g.opening_reserved ELSE 0 END \
                    + COALESCE(m.reserved, 0))::bigint AS ledger_reserved \
         FROM credit_grants g LEFT JOIN moved m ON m.grant_id = g.id \
         LEFT JOIN late l ON l.grant_id = g.id \
         ORDER BY g.account_id, g.seq",
    )
    .load(conn)?;
    Ok(rows
        .into_iter()
        .flat_map(|row| {
            Discrepancy::failed(
                row.account_id,
                [
                    (
                        "grant_ledger_remaining",
                        row.ledger_remaining,
                        row.remaining,
                    ),
                    ("grant_ledger_reserved", row.ledger_reserved, row.reserved),
                    // No reserve entry draws a grant at or after its expiry.
                    ("grant_drawn_after_lapse", 0, row.drawn_after_lapse),
                ],
            )
        })
        .collect())
}

/// Events and books against each other, from the ledger and the jobs
/// alone (window functions, not the engine's code): every credit and
/// adjustment has exactly one `credit.created` or `adjustment.created`
/// event naming its last entry, every expired reservation one
/// `reservation.expired` naming its last return (`expire`, or
/// `grant_expire` to a lapsed grant), every grant_expire entry one
/// `grant.expired` (a movement spanning several grants writes one entry per grant,
/// all with the same reservation or external_ref); every
/// entry that brought `available` from above 0 to 0 one
/// `account.balance_depleted`; every finished job one `job.<status>`; and
/// no such event without its entry or job. A full scan: for the chaos run
/// and the tests, not for the reaper. One line per disagreement.
pub fn events_disagreeing_with_books(conn: &mut PgConnection) -> Result<Vec<String>, ApiError> {
    #[derive(QueryableByName)]
    struct Disagreement {
        #[diesel(sql_type = diesel::sql_types::Text)]
        line: String,
    }
    let rows: Vec<Disagreement> = diesel::sql_query(
        "WITH entries AS ( \
           SELECT id, kind, grant_id, reservation_id, available_after, \
                  COALESCE(lag(available_after) OVER (PARTITION BY account_id ORDER BY id), 0) \
                    AS available_before, \
                  id = max(id) OVER (PARTITION BY account_id, kind, reservation_id, external_ref) \
                    AS closes, \
                  id = max(id) FILTER (WHERE kind IN ('expire', 'grant_expire')) \
                         OVER (PARTITION BY account_id, reservation_id) AS last_return \
           FROM ledger_entries), \
         expected AS ( \
           SELECT CASE kind WHEN 'credit' THEN 'credit.created' \
                            ELSE 'adjustment.created' END AS type, id::text AS subject \
           FROM entries WHERE kind IN ('credit', 'adjustment') AND closes \
           UNION ALL \
           SELECT 'reservation.expired', e.id::text FROM entries e \
           JOIN reservations r ON r.id = e.reservation_id \
           WHERE e.kind IN ('expire', 'grant_expire') AND e.last_return AND r.state = 'expired' \
           UNION ALL \
           SELECT 'grant.expired', id::text FROM entries WHERE kind = 'grant_expire' \
           UNION ALL \
           SELECT 'account.balance_depleted', id::text FROM entries \
           WHERE available_after = 0 AND available_before > 0 \
           UNION ALL \
           SELECT 'job.' || status, id::text FROM generation_jobs \
           WHERE status IN ('succeeded', 'failed')), \
         found AS ( \
           SELECT type, CASE WHEN type LIKE 'job.%' \
                             THEN COALESCE(data->'job'->>'job_id', data->'job'->>'id') \
                             ELSE COALESCE(data->'entry'->>'entry_id', data->'entry'->>'id') END \
                    AS subject, count(*) AS times \
           FROM events \
           WHERE type IN ('credit.created', 'adjustment.created', 'reservation.expired', 'grant.expired', \
                          'account.balance_depleted', 'job.succeeded', 'job.failed') \
           GROUP BY 1, 2) \
         SELECT COALESCE(e.type, f.type) || ' ' || COALESCE(e.subject, f.subject) || ': ' || \
                CASE WHEN f.times IS NULL THEN 'no event' \
                     WHEN e.subject IS NULL THEN 'an event without its movement' \
                     ELSE f.times || ' events' END AS line \
         FROM expected e FULL JOIN found f ON f.type = e.type AND f.subject = e.subject \
         WHERE f.times IS DISTINCT FROM 1 OR e.subject IS NULL \
         ORDER BY 1 LIMIT 100",
    )
    .load(conn)?;
    Ok(rows.into_iter().map(|row| row.line).collect())
}
