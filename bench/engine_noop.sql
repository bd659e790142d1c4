-- For bench/http_floor.sh only: an engine_apply (the engine's one entry
-- point) that decides nothing. They answer every reserve as created and every
-- commit as committed (the objects as the engine shows them, made up from
-- the request), and write one row per batch so that the commit still
-- flushes WAL. Installed over the real ones in a private benchmark
-- cluster, they measure what HTTP, the load generator, the service's Rust,
-- the pool and the commit cost without any engine. Never installed
-- anywhere else.
CREATE TABLE IF NOT EXISTS public.bench_noop_batches (at timestamptz NOT NULL DEFAULT now());
-- The object a reserve or a commit answers, made up from the request.
CREATE OR REPLACE FUNCTION bench_noop_object(p_op text, p_account uuid, p_request uuid,
    p_amount bigint, p_ttl integer, p_new_id uuid, p_reservation uuid)
RETURNS jsonb
LANGUAGE sql AS $$
    SELECT jsonb_build_object('id', COALESCE(p_new_id, p_reservation), 'account_id', p_account,
               'request_id', COALESCE(p_request, gen_random_uuid()), 'amount', COALESCE(p_amount, 1),
               'requested_ttl_seconds', NULL,
               'state', CASE WHEN p_op = 'reserve' THEN 'held' ELSE 'committed' END,
               'committed_amount', CASE WHEN p_op = 'reserve' THEN 0 ELSE COALESCE(p_amount, 1) END,
               'expires_at', now() + make_interval(secs => COALESCE(p_ttl, 300)), 'job_id', NULL,
               'created_at', now(),
               'resolved_at', CASE WHEN p_op = 'reserve' THEN NULL ELSE now() END,
               'draws', '[]'::jsonb)
$$;
CREATE OR REPLACE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE sql AS $$
    INSERT INTO public.bench_noop_batches DEFAULT VALUES;
    SELECT u.ordinality::integer,
           CASE WHEN u.op = 'reserve' THEN 'created' ELSE 'committed' END, NULL::jsonb,
           bench_noop_object(u.op, u.account, u.request, u.amount, u.ttl, u.new_id, u.reservation)
    FROM unnest(p_ops) WITH ORDINALITY AS u
$$;
