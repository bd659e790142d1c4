-- The books of a reference run (bench/reference_*.pgbench.sql on a database
-- seeded by bench/reference_seed.sql), checked from the tables alone.
-- Prints one line: books=ok, or books=MISMATCH with the failed checks.
--   psql -qtA -f bench/reference_books.sql <db>
-- Per account:
--   conservation: available + reserved + used = credited + adjusted;
--   ledger replay: the sum of the ledger's movements gives the balances,
--     and the last entry's balances-after are the balances;
--   reservations: reserved = the held reservations' amounts,
--     active_reservations = their number, used = committed amounts;
-- per job: a succeeded job's reservation is committed for its cost, with a
--   job.succeeded event; a queued or running job's reservation is held.
WITH replay AS (
    SELECT account_id,
           sum(CASE kind WHEN 'credit' THEN amount WHEN 'adjustment' THEN amount
                         WHEN 'reserve' THEN -amount WHEN 'commit' THEN 0
                         ELSE amount END) AS available,
           sum(CASE kind WHEN 'reserve' THEN amount WHEN 'commit' THEN -amount
                         WHEN 'release' THEN -amount WHEN 'expire' THEN -amount
                         ELSE 0 END) AS reserved,
           sum(CASE kind WHEN 'commit' THEN amount ELSE 0 END) AS used,
           max(id) AS last_id
    FROM ledger_entries GROUP BY account_id
), held AS (
    SELECT account_id,
           sum(amount) FILTER (WHERE state = 'held') AS reserved,
           count(*) FILTER (WHERE state = 'held') AS active,
           sum(committed_amount) AS used
    FROM reservations GROUP BY account_id
), failures AS (
    SELECT 'conservation' AS check_name FROM accounts
    WHERE available + reserved + used <> credited + adjusted
    UNION ALL
    SELECT 'ledger replay' FROM accounts a LEFT JOIN replay r ON r.account_id = a.id
    WHERE (a.available, a.reserved, a.used)
          IS DISTINCT FROM (r.available, r.reserved, r.used)
    UNION ALL
    SELECT 'last entry' FROM accounts a JOIN replay r ON r.account_id = a.id
    JOIN ledger_entries e ON e.id = r.last_id
    WHERE (a.available, a.reserved, a.used)
          IS DISTINCT FROM (e.available_after, e.reserved_after, e.used_after)
    UNION ALL
    SELECT 'reservations' FROM accounts a LEFT JOIN held h ON h.account_id = a.id
    WHERE (a.reserved, a.active_reservations, a.used)
          IS DISTINCT FROM (COALESCE(h.reserved, 0), COALESCE(h.active, 0), COALESCE(h.used, 0))
    UNION ALL
    SELECT 'job ' || j.status FROM generation_jobs j JOIN reservations r ON r.id = j.reservation_id
    WHERE CASE j.status
              WHEN 'succeeded' THEN r.state <> 'committed' OR r.committed_amount <> j.cost
                   OR r.job_id IS DISTINCT FROM j.id
                   OR NOT EXISTS (SELECT 1 FROM events e WHERE e.type = 'job.succeeded'
                                  AND e.data -> 'job' ->> 'id' = j.id::text)
              WHEN 'failed' THEN r.state = 'held'
              ELSE r.state <> 'held' END
    UNION ALL
    SELECT 'job without reservation' FROM generation_jobs j
    WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = j.reservation_id)
)
SELECT CASE WHEN count(*) = 0 THEN 'books=ok'
            ELSE 'books=MISMATCH ' || string_agg(DISTINCT check_name, ', ') || ' (' || count(*) || ' rows)'
       END
       || ' accounts=' || (SELECT count(*) FROM accounts)
       || ' reservations=' || (SELECT count(*) FROM reservations)
       || ' committed=' || (SELECT count(*) FROM reservations WHERE state = 'committed')
       || ' jobs_succeeded=' || (SELECT count(*) FROM generation_jobs WHERE status = 'succeeded')
FROM failures;
