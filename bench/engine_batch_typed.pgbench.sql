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
), batch AS (
    SELECT array_agg('reserve'::text) AS op, array_agg(account) AS account,
           array_agg('bench'::text) AS actor, array_agg(account) AS key_id,
           array_agg(sha256('pgbench-secret'::bytea)) AS key_hash, array_agg(false) AS authorized,
           array_agg(gen_random_uuid()) AS request, array_agg(1::bigint) AS amount,
           array_agg(NULL::integer) AS requested_ttl, array_agg(300) AS ttl,
           array_agg(gen_random_uuid()) AS new_id, array_agg(NULL::uuid) AS nothing_uuid,
           array_agg(NULL::bytea) AS nothing_bytea, array_agg(NULL::text) AS nothing_text,
           array_agg(NULL::jsonb) AS nothing_jsonb, array_agg(NULL::bigint) AS nothing_bigint,
           array_agg(NULL::integer) AS nothing_integer,
           array_agg(NULL::timestamptz) AS nothing_timestamptz
    FROM picked
)
SELECT count(*) FROM batch b, engine_apply(
    b.op, b.account, b.actor, b.key_id, b.key_hash, b.authorized, b.request, b.amount,
    b.requested_ttl, b.ttl, b.new_id, b.nothing_uuid, b.nothing_uuid, b.nothing_bytea,
    b.nothing_text, b.nothing_jsonb, b.nothing_text, b.nothing_text, b.nothing_text,
    b.nothing_text, b.nothing_bigint, b.nothing_text, b.nothing_jsonb, b.nothing_jsonb,
    b.nothing_integer, b.nothing_timestamptz);
