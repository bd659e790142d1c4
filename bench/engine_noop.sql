-- For bench/http_floor.sh only: an engine_apply that decides nothing. It
-- answers every reserve as created and every commit as committed (the
-- objects as the engine shows them, made up from the request), and writes
-- one row per batch so that the commit still flushes WAL. Installed over
-- the real one in a private benchmark cluster, it measures what HTTP, the
-- load generator, the service's Rust, the pool and the commit cost without
-- any engine. Never installed anywhere else.
CREATE TABLE IF NOT EXISTS public.bench_noop_batches (at timestamptz NOT NULL DEFAULT now());
CREATE OR REPLACE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE sql AS $$
    INSERT INTO public.bench_noop_batches DEFAULT VALUES;
    SELECT u.ordinality::integer,
           CASE WHEN u.op = 'reserve' THEN 'created' ELSE 'committed' END, NULL::jsonb,
           jsonb_build_object('id', COALESCE(u.new_id, u.reservation), 'account_id', u.account,
               'request_id', COALESCE(u.request, gen_random_uuid()), 'amount', COALESCE(u.amount, 1),
               'requested_ttl_seconds', NULL,
               'state', CASE WHEN u.op = 'reserve' THEN 'held' ELSE 'committed' END,
               'committed_amount', CASE WHEN u.op = 'reserve' THEN 0 ELSE COALESCE(u.amount, 1) END,
               'expires_at', now() + make_interval(secs => COALESCE(u.ttl, 300)), 'job_id', NULL,
               'created_at', now(),
               'resolved_at', CASE WHEN u.op = 'reserve' THEN NULL ELSE now() END,
               'draws', '[]'::jsonb)
    FROM unnest(p_ops) WITH ORDINALITY AS u
$$;
