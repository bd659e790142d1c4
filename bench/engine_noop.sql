-- For bench/http_floor.sh only: an engine_apply that decides nothing. It
-- answers every reserve as created and every commit as committed (the
-- objects as the engine shows them, made up from the request), and writes
-- one row per batch so that the commit still flushes WAL. Installed over
-- the real one in a private benchmark cluster, it measures what HTTP, the
-- load generator, the service's Rust, the pool and the commit cost without
-- any engine. Never installed anywhere else.
CREATE TABLE IF NOT EXISTS public.bench_noop_batches (at timestamptz NOT NULL DEFAULT now());
CREATE OR REPLACE FUNCTION engine_apply(
    p_op text[], p_account uuid[], p_actor text[], p_key_id uuid[], p_key_hash bytea[],
    p_authorized boolean[], p_request uuid[], p_amount bigint[], p_requested_ttl integer[],
    p_ttl integer[], p_new_id uuid[], p_job uuid[], p_reservation uuid[], p_hash bytea[],
    p_kind text[], p_params jsonb[], p_external_ref text[], p_note text[], p_reason text[],
    p_http_request_id text[], p_lease_token bigint[], p_status text[], p_result jsonb[],
    p_error jsonb[], p_priority integer[], p_expires_at timestamptz[]
)
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE sql AS $$
    INSERT INTO public.bench_noop_batches DEFAULT VALUES;
    SELECT u.n::integer,
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
    FROM unnest(p_op, p_account, p_request, p_amount, p_ttl, p_new_id, p_reservation)
         WITH ORDINALITY AS u (op, account, request, amount, ttl, new_id, reservation, n)
$$;
