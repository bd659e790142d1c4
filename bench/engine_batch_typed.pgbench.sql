-- The ceiling of the money engine batched inside PostgreSQL, second
-- edition: one statement (one transaction, one WAL flush) reserving 1 token
-- on each of :k random accounts of bench/seed.sql through the typed
-- engine_apply — the same functions, checks (key, status, balance, limit,
-- replay) and ledger entries as the service's batches. Reservations/s =
-- tx/s × k.
--
-- This measures the engine itself, so it moves with the engine by design:
-- it is no reference (the fixed references are bench/reference_*). It
-- stands beside the first edition's bench/engine_batch.pgbench.sql, removed
-- in 65a9e6f because the jsonb engine_apply it called no longer exists.
--
-- Run on a database migrated by the service (its engine schema installed)
-- and seeded with bench/seed.sql, with the engine's schema on the path:
--   PGOPTIONS="-c search_path=public,$(psql -qtAc 'SELECT name FROM engine_schemas ORDER BY last_started_at DESC LIMIT 1' <db>)" \
--     pgbench -n -M prepared -c 8 -j 2 -T 8 -D k=8 -D accounts=1000 -f bench/engine_batch_typed.pgbench.sql <db>
WITH picked AS (
    SELECT bench_uuid(1 + floor(random() * :accounts)::bigint) AS account
    FROM generate_series(1, :k)
)
SELECT count(*) FROM engine_apply(ARRAY(
    SELECT ROW('reserve', p.account, 'bench', p.account, sha256('pgbench-secret'::bytea), false,
               gen_random_uuid(), 1, NULL, 300, gen_random_uuid(), NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::engine_request
    FROM picked p));
