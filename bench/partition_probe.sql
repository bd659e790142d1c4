-- Would a ledger partitioned by month serve the history reads better?
-- Run on a database built by `token-billing-bench history`:
--   psql "$PG/tb_bench_history" -f bench/partition_probe.sql
-- It copies ledger_entries into a table partitioned by month of created_at
-- (with the two indexes these reads use), times the account ledger page and the as_of tail read on
-- both, 2,000 random accounts each, and drops the copy. Printed as NOTICEs.
\set ON_ERROR_STOP on
SET statement_timeout = 0;
DROP TABLE IF EXISTS probe_ledger_by_month;
CREATE TABLE probe_ledger_by_month (LIKE ledger_entries INCLUDING DEFAULTS)
    PARTITION BY RANGE (created_at);
DO $$
DECLARE
    first_month date := date_trunc('month', (SELECT min(created_at) FROM ledger_entries))::date;
    last_month date := date_trunc('month', now() + interval '1 month')::date;
    m date;
BEGIN
    m := first_month;
    WHILE m <= last_month LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF probe_ledger_by_month
                        FOR VALUES FROM (%L) TO (%L)',
                       'probe_ledger_' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
        m := m + interval '1 month';
    END LOOP;
END $$;
\timing on
INSERT INTO probe_ledger_by_month SELECT * FROM ledger_entries;
CREATE INDEX ON probe_ledger_by_month (account_id, id);
CREATE INDEX ON probe_ledger_by_month (created_at);
\timing off
ANALYZE probe_ledger_by_month;
SELECT pg_size_pretty(pg_total_relation_size('ledger_entries')) AS one_table,
       pg_size_pretty((SELECT sum(pg_total_relation_size(inhrelid))
                       FROM pg_inherits WHERE inhparent = 'probe_ledger_by_month'::regclass)::bigint)
           AS by_month;
DO $$
DECLARE
    accounts uuid[] := ARRAY(SELECT id FROM accounts ORDER BY random() LIMIT 2000);
    target text;
    a uuid;
    began timestamptz;
    page_ms float8;
    tail_ms float8;
    upper bigint;
    dummy bigint;
BEGIN
    FOREACH target IN ARRAY ARRAY['ledger_entries', 'probe_ledger_by_month', 'ledger_entries',
                                  'probe_ledger_by_month'] LOOP
        began := clock_timestamp();
        FOREACH a IN ARRAY accounts LOOP
            EXECUTE format('SELECT count(*) FROM (SELECT id FROM %I WHERE account_id = $1 AND id > 0
                            ORDER BY id LIMIT 101) p', target) INTO dummy USING a;
        END LOOP;
        page_ms := extract(epoch FROM clock_timestamp() - began) * 1000 / 2000;
        began := clock_timestamp();
        FOREACH a IN ARRAY accounts LOOP
            -- The as_of tail: the account's entries of one day, bounded by ids.
            SELECT last_entry_id INTO upper FROM ledger_daily_closings
            WHERE account_id = a ORDER BY day DESC OFFSET 100 LIMIT 1;
            EXECUTE format('SELECT count(*) FROM (SELECT id FROM %I WHERE account_id = $1
                            AND id > $2 - 50 AND id <= $2 ORDER BY id DESC LIMIT 1) t', target)
                INTO dummy USING a, COALESCE(upper, 0);
        END LOOP;
        tail_ms := extract(epoch FROM clock_timestamp() - began) * 1000 / 2000;
        RAISE NOTICE '%: ledger page (101 rows) % ms, as_of tail read % ms (mean of 2,000)',
            target, round(page_ms::numeric, 3), round(tail_ms::numeric, 3);
    END LOOP;
END $$;
DROP TABLE probe_ledger_by_month;
