-- One kiosk's reserve → commit cycle through the engine itself (no HTTP):
-- engine_apply with one reserve, then engine_apply with its commit_all,
-- each its own transaction — the two statements the service sends for a
-- lone kiosk's cycle. This measures the engine, so it moves with the engine
-- by design: it is no reference (the fixed references are
-- bench/reference_*). bench/engine_profile.sh runs it with
-- pg_stat_statements on a private cluster.
--   pgbench -n -M prepared -c 2 -j 2 -T 8 -D accounts=1000 -f bench/engine_cycle.pgbench.sql <db>
\set n random(1, :accounts)
SELECT object->>'id' AS id FROM engine_apply(ARRAY[ROW('reserve', bench_uuid(:n), 'bench', bench_uuid(:n), sha256('pgbench-secret'::bytea), false, gen_random_uuid(), 1, NULL, 300, gen_random_uuid(), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::engine_request]) \gset r_
SELECT outcome FROM engine_apply(ARRAY[ROW('commit_all', bench_uuid(:n), 'bench', bench_uuid(:n), sha256('pgbench-secret'::bytea), false, NULL, NULL, NULL, NULL, NULL, NULL, :r_id::uuid, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::engine_request]) \gset c_
