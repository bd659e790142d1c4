-- For bench/engine_instructions.sh only, a measurement and not an engine:
-- what a lone reserve → commit cycle costs when each operation is decided
-- and written by one statement whose conditions are the rules (the design
-- docs/decisions/0001-one-engine.md points to), on this schema, grants
-- included. It answers only reserves and commits that succeed (anything
-- else raises), draws through engine_draws, asks engine_spend_refusal and
-- engine_reservation_expired, and checks the key as the reference does; no
-- lapse, budget, job, threshold, top-up or event. Counted with
--   bench/engine_instructions.sh --reference one_statement=bench/one_statement_engine.sql
-- Installed over engine_noop.sql's engine_apply (whose object builder
-- answers), in the benchmark's own schema. Never installed anywhere else.
SET search_path TO engine_bench, public;
\ir engine_noop.sql
CREATE FUNCTION pg_temp.bench_replace_body(p_name text, p_body text) RETURNS void
LANGUAGE plpgsql AS $replace$
BEGIN
    EXECUTE format('CREATE OR REPLACE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                   p_name, pg_get_function_arguments(p_name::regproc),
                   pg_get_function_result(p_name::regproc), p_body);
END;
$replace$;
CREATE FUNCTION bench_one_statement(p_op text, p_account uuid, p_key_id uuid,
    p_key_hash bytea, p_authorized boolean, p_request uuid, p_amount bigint, p_ttl integer,
    p_new_id uuid, p_reservation uuid) RETURNS jsonb
LANGUAGE plpgsql AS $one$
DECLARE
    r uuid;
    c bigint;
BEGIN
    IF p_op = 'reserve' THEN
        WITH moved AS (
            UPDATE accounts a SET available = a.available - p_amount, reserved = a.reserved + p_amount,
                active_reservations = a.active_reservations + 1, version = a.version + 1,
                updated_at = now()
            WHERE a.id = p_account
              AND engine_spend_refusal(a.status, a.available, p_amount, a.active_reservations,
                                       a.max_active_reservations) IS NULL
              AND EXISTS (SELECT 1 FROM api_keys WHERE id = p_key_id AND secret_hash = p_key_hash AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND (scope = 'admin' OR (scope = 'kiosk' AND account_id = p_account)))
              AND NOT EXISTS (SELECT 1 FROM reservations x WHERE x.account_id = p_account
                              AND x.request_id = p_request AND x.job_id IS NULL)
            RETURNING a.available, a.reserved, a.used),
        d AS MATERIALIZED (SELECT dr.grant_id, dr.amount FROM engine_draws(p_account, 0, p_amount) dr
                           WHERE EXISTS (SELECT 1 FROM moved)),
        g AS (UPDATE credit_grants g SET remaining = g.remaining - (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  reserved = g.reserved + (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  drawable = g.remaining - (SELECT d.amount FROM d WHERE d.grant_id = g.id) > 0
              WHERE g.id = ANY (ARRAY(SELECT d.grant_id FROM d))),
        held AS (INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at, draws)
                 SELECT p_new_id, p_account, p_request, p_amount, 'held',
                        now() + make_interval(secs => p_ttl),
                        (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)) FROM d)
                 FROM moved RETURNING id),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
                      used_after, reservation_id, actor, grant_id, api_key_id)
                  SELECT p_account, 'reserve', d.amount, moved.available, moved.reserved, moved.used,
                         held.id, p_account::text, d.grant_id, p_key_id FROM moved, held, d)
        SELECT id INTO r FROM held;
        IF r IS NULL THEN
            RAISE EXCEPTION 'one-statement reserve refused on %', p_account;
        END IF;
    ELSE
        WITH settled AS (
            UPDATE reservations x SET state = 'committed', committed_amount = x.amount, resolved_at = now()
            WHERE x.id = p_reservation AND x.account_id = p_account AND x.state = 'held'
              AND NOT engine_reservation_expired(x.expires_at, now()) AND x.job_id IS NULL
              AND EXISTS (SELECT 1 FROM api_keys WHERE id = p_key_id AND secret_hash = p_key_hash AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND (scope = 'admin' OR (scope = 'kiosk' AND account_id = p_account)))
            RETURNING x.amount, x.draws),
        moved AS (UPDATE accounts a SET reserved = a.reserved - (SELECT s.amount FROM settled s),
                      used = a.used + (SELECT s.amount FROM settled s),
                      active_reservations = a.active_reservations - 1, version = a.version + 1,
                      updated_at = now()
                  WHERE a.id = p_account AND EXISTS (SELECT 1 FROM settled)
                  RETURNING a.available, a.reserved, a.used),
        d AS MATERIALIZED (SELECT (x->>'grant_id')::uuid AS grant_id, (x->>'amount')::bigint AS amount
                           FROM settled s, jsonb_array_elements(s.draws) x),
        g AS (UPDATE credit_grants g SET reserved = g.reserved - (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  consumed = g.consumed + (SELECT d.amount FROM d WHERE d.grant_id = g.id)
              WHERE g.id = ANY (ARRAY(SELECT d.grant_id FROM d))),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
                      used_after, reservation_id, actor, grant_id, api_key_id)
                  SELECT p_account, 'commit', d.amount, moved.available, moved.reserved, moved.used,
                         p_reservation, p_account::text, d.grant_id, p_key_id FROM moved, d)
        SELECT count(*) INTO c FROM settled;
        IF c <> 1 THEN
            RAISE EXCEPTION 'one-statement commit refused on %', p_reservation;
        END IF;
    END IF;
    RETURN bench_noop_object(p_op, p_account, p_request, p_amount, p_ttl, p_new_id, p_reservation);
END;
$one$;
SELECT pg_temp.bench_replace_body('engine_apply', $apply$
DECLARE
    o engine_request;
BEGIN
    -- The batch's accounts locked in id order first, as the service's
    -- engine does: batches in flight side by side never deadlock.
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT DISTINCT u.account FROM unnest(p_ops) u))
    ORDER BY id FOR NO KEY UPDATE;
    op_position := 0;
    FOREACH o IN ARRAY p_ops LOOP
        op_position := op_position + 1;
        outcome := CASE WHEN o.op = 'reserve' THEN 'created' ELSE 'committed' END;
        object := bench_one_statement(o.op, o.account, o.key_id, o.key_hash, o.authorized,
                                         o.request, o.amount, o.ttl, o.new_id, o.reservation);
        RETURN NEXT;
    END LOOP;
END;
$apply$);
