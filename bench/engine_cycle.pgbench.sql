-- One kiosk's reserve → commit cycle through the engine itself (no HTTP):
-- engine_apply with one reserve, then engine_apply with its commit_all,
-- each its own transaction — the two statements the service sends for a
-- lone kiosk's cycle. This measures the engine, so it moves with the engine
-- by design: it is no reference (the fixed references are
-- bench/reference_*). bench/engine_profile.sh runs it with
-- pg_stat_statements on a private cluster.
--   pgbench -n -M prepared -c 2 -j 2 -T 8 -D accounts=1000 -f bench/engine_cycle.pgbench.sql <db>
\set n random(1, :accounts)
SELECT object->>'id' AS id FROM engine_apply(ARRAY['reserve'], ARRAY[bench_uuid(:n)], ARRAY['bench'], ARRAY[bench_uuid(:n)], ARRAY[sha256('pgbench-secret'::bytea)], ARRAY[false], ARRAY[gen_random_uuid()], ARRAY[1::bigint], ARRAY[NULL::integer], ARRAY[300], ARRAY[gen_random_uuid()], ARRAY[NULL::uuid], ARRAY[NULL::uuid], ARRAY[NULL::bytea], ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[NULL::jsonb], ARRAY[NULL::integer], ARRAY[NULL::timestamptz]) \gset r_
SELECT outcome FROM engine_apply(ARRAY['commit_all'], ARRAY[bench_uuid(:n)], ARRAY['bench'], ARRAY[bench_uuid(:n)], ARRAY[sha256('pgbench-secret'::bytea)], ARRAY[false], ARRAY[NULL::uuid], ARRAY[NULL::bigint], ARRAY[NULL::integer], ARRAY[NULL::integer], ARRAY[NULL::uuid], ARRAY[NULL::uuid], ARRAY[:r_id::uuid], ARRAY[NULL::bytea], ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[NULL::jsonb], ARRAY[NULL::integer], ARRAY[NULL::timestamptz]) \gset c_
