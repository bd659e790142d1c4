-- For bench/engine_instructions.sh only, a measurement and not an engine:
-- what a lone reserve → commit cycle costs when each operation is decided
-- and written by one statement whose conditions are the rules (the design
-- docs/decisions/0001-one-engine.md points to), on this schema, grants
-- included. It answers only reserves and commits that succeed (anything
-- else raises), draws through engine_draws, asks engine_spend_refusal and
-- engine_reservation_expired, and checks the key as the reference does; no
-- lapse, budget, job, threshold, top-up or event (and a reserve drawing
-- from several grants would stamp each entry with the balances after all
-- of them: the seed's accounts have one grant each). Counted with
--   bench/engine_instructions.sh --reference one_statement=bench/one_statement_engine.sql
-- Installed over engine_noop.sql's engine_apply (whose object builder
-- answers), in the benchmark's own schema. Never installed anywhere else.
SET search_path TO engine_bench, public;
\ir engine_noop.sql
CREATE FUNCTION bench_one_statement(o engine_request) RETURNS jsonb
LANGUAGE plpgsql AS $one$
DECLARE
    r uuid;
    c bigint;
BEGIN
    IF o.op = 'reserve' THEN
        WITH moved AS (
            UPDATE accounts a SET available = a.available - o.amount, reserved = a.reserved + o.amount,
                active_reservations = a.active_reservations + 1, version = a.version + 1,
                updated_at = now()
            WHERE a.id = o.account
              AND engine_spend_refusal(a.status, a.available, o.amount, a.active_reservations,
                                       a.max_active_reservations) IS NULL
              AND EXISTS (SELECT 1 FROM api_keys k
                          WHERE k.id = o.key_id AND k.secret_hash = o.key_hash AND k.revoked_at IS NULL
                            AND (k.expires_at IS NULL OR k.expires_at > now())
                            AND (k.scope = 'admin' OR (k.scope = 'kiosk' AND k.account_id = o.account)))
              AND NOT EXISTS (SELECT 1 FROM reservations x WHERE x.account_id = o.account
                              AND x.request_id = o.request AND x.job_id IS NULL)
            RETURNING a.available, a.reserved, a.used),
        d AS MATERIALIZED (SELECT dr.grant_id, dr.amount FROM engine_draws(o.account, 0, o.amount) dr
                           WHERE EXISTS (SELECT 1 FROM moved)),
        g AS (UPDATE credit_grants g SET remaining = g.remaining - (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  reserved = g.reserved + (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  drawable = g.remaining - (SELECT d.amount FROM d WHERE d.grant_id = g.id) > 0
              WHERE g.id = ANY (ARRAY(SELECT d.grant_id FROM d))),
        held AS (INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at, draws)
                 SELECT o.new_id, o.account, o.request, o.amount, 'held',
                        now() + make_interval(secs => o.ttl),
                        (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)) FROM d)
                 FROM moved RETURNING id),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
                      used_after, reservation_id, actor, grant_id, api_key_id)
                  SELECT o.account, 'reserve', d.amount, moved.available, moved.reserved, moved.used,
                         held.id, o.account::text, d.grant_id, o.key_id FROM moved, held, d)
        SELECT id INTO r FROM held;
        IF r IS NULL THEN
            RAISE EXCEPTION 'one-statement reserve refused on %', o.account;
        END IF;
    ELSE
        WITH settled AS (
            UPDATE reservations x SET state = 'committed', committed_amount = x.amount, resolved_at = now()
            WHERE x.id = o.reservation AND x.account_id = o.account AND x.state = 'held'
              AND NOT engine_reservation_expired(x.expires_at, now()) AND x.job_id IS NULL
              AND EXISTS (SELECT 1 FROM api_keys k
                          WHERE k.id = o.key_id AND k.secret_hash = o.key_hash AND k.revoked_at IS NULL
                            AND (k.expires_at IS NULL OR k.expires_at > now())
                            AND (k.scope = 'admin' OR (k.scope = 'kiosk' AND k.account_id = o.account)))
            RETURNING x.amount, x.draws),
        moved AS (UPDATE accounts a SET reserved = a.reserved - (SELECT s.amount FROM settled s),
                      used = a.used + (SELECT s.amount FROM settled s),
                      active_reservations = a.active_reservations - 1, version = a.version + 1,
                      updated_at = now()
                  WHERE a.id = o.account AND EXISTS (SELECT 1 FROM settled)
                  RETURNING a.available, a.reserved, a.used),
        d AS MATERIALIZED (SELECT (x->>'grant_id')::uuid AS grant_id, (x->>'amount')::bigint AS amount
                           FROM settled s, jsonb_array_elements(s.draws) x),
        g AS (UPDATE credit_grants g SET reserved = g.reserved - (SELECT d.amount FROM d WHERE d.grant_id = g.id),
                  consumed = g.consumed + (SELECT d.amount FROM d WHERE d.grant_id = g.id)
              WHERE g.id = ANY (ARRAY(SELECT d.grant_id FROM d))),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
                      used_after, reservation_id, actor, grant_id, api_key_id)
                  SELECT o.account, 'commit', d.amount, moved.available, moved.reserved, moved.used,
                         o.reservation, o.account::text, d.grant_id, o.key_id FROM moved, d)
        SELECT count(*) INTO c FROM settled;
        IF c <> 1 THEN
            RAISE EXCEPTION 'one-statement commit refused on %', o.reservation;
        END IF;
    END IF;
    RETURN bench_noop_object(o.op, o.account, o.request, o.amount, o.ttl, o.new_id, o.reservation);
END;
$one$;
-- The batch's accounts locked in id order, then each operation by itself.
CREATE OR REPLACE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql AS $apply$
BEGIN
    PERFORM 1 FROM accounts WHERE id = ANY (ARRAY(SELECT u.account FROM unnest(p_ops) u))
    ORDER BY id FOR NO KEY UPDATE;
    FOR i IN 1 .. cardinality(p_ops) LOOP
        op_position := i;
        outcome := CASE WHEN p_ops[i].op = 'reserve' THEN 'created' ELSE 'committed' END;
        object := bench_one_statement(p_ops[i]);
        RETURN NEXT;
    END LOOP;
END;
$apply$;
