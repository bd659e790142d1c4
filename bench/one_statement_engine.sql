-- For bench/engine_instructions.sh and bench/http_floor.sh only, a
-- measurement and not an engine: what a reserve → commit cycle costs when
-- each operation is decided and written by one statement whose conditions
-- are the engine's named rules (the design
-- docs/decisions/0001-one-engine.md points to), on this schema, with what
-- the engine's success path does: the key's refusal (engine_valid_key,
-- engine_key_refusal), the spend's refusals with the key's budget
-- (engine_spend_refusal, engine_key_budget_left), the replay and lapse
-- probes, the draws (engine_draws) and the grants' arithmetic
-- (engine_deltas, engine_grant_deltas), every entry's balances after it,
-- the budget's count, the settlement's verdict (engine_settle_verdict), its
-- split (bench_split_draws: commit, then the rest back, a lapsed grant's
-- share expiring) and the top-up rule's consumption
-- (engine_topup_unconsumed); the object as the engine answers it. A
-- statement that writes nothing raises (the engine would name the refusal
-- with a second look). What runs only when an account or key has a
-- threshold, a top-up rule or a budget, or reaches 0 (events, notices,
-- top-ups), and jobs, are left out: one test of the returned row says
-- whether they would run (never, on the benchmarks' accounts). Its rows
-- and answers were compared with the engine's, row by row (decision 0001).
-- Counted with
--   bench/engine_instructions.sh --reference one_statement=bench/one_statement_engine.sql
-- Installed over the engine's engine_apply, in the engine's schema (the
-- caller's search_path), by that script and by
--   bench/http_floor.sh --engine one_statement=bench/one_statement_engine.sql
-- Never installed anywhere else.
-- A settlement's split as one set (the engine's engine_split_draws, before engine_settle
-- split in a loop).
-- How a settlement spending `p_committed` of its `p_held` tokens moves the grants the
-- reservation drew from (`p_draws`, in draw order): the commit consumes the draws in draw order,
-- the rest of each goes back to its grant. One row per entry, unordered; `n` is the entry order.
-- A reservation without draws (none should exist; the invariant checks report grants that
-- disagree with balances) settles as one draw of no grant, so its tokens still move.
CREATE FUNCTION bench_split_draws(p_draws jsonb, p_held bigint, p_committed bigint)
RETURNS TABLE (n bigint, part text, grant_id uuid, amount bigint)
LANGUAGE sql IMMUTABLE AS $$
    -- Draw k of c consumes clamp(committed - the draws before it, 0, its amount); its commit part
    -- is entry k, its return part c + k (all commits first). (One window and a two-row VALUES per
    -- draw: inlined into the callers' statements, whose plans are started at every call.)
    SELECT CASE p.part WHEN 'commit' THEN d.k ELSE d.c + d.k END, p.part, d.grant_id, p.amount
    FROM (SELECT x.k, GREATEST(jsonb_array_length(p_draws), 1) AS c,
                 (x.draw->>'grant_id')::uuid AS grant_id, (x.draw->>'amount')::bigint AS amount,
                 GREATEST(LEAST(p_committed - (sum((x.draw->>'amount')::bigint) OVER (ORDER BY x.k)
                                               - (x.draw->>'amount')::bigint),
                                (x.draw->>'amount')::bigint), 0)::bigint AS consumed
          FROM jsonb_array_elements(
                   CASE WHEN jsonb_array_length(p_draws) > 0 THEN p_draws
                        ELSE jsonb_build_array(jsonb_build_object('grant_id', NULL, 'amount', p_held))
                   END) WITH ORDINALITY AS x (draw, k)) d
    CROSS JOIN LATERAL (VALUES ('commit', d.consumed), ('return', d.amount - d.consumed))
        AS p (part, amount)
    WHERE p.amount > 0
$$;

-- The key's refusal of `o` as the engine decides it (engine_valid_key,
-- engine_key_refusal), with the valid key's fields.
CREATE FUNCTION bench_key_refusal(o engine_request)
RETURNS TABLE (refusal text, valid_key uuid, last_used_at timestamptz, budget_tokens bigint,
               budget_period text, budget_time_zone text, budget_spent bigint,
               budget_period_start timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT engine_key_refusal(o.authorized, s.v, o.account), (s.v).key_id, (s.v).last_used_at,
           (s.v).budget_tokens, (s.v).budget_period, (s.v).budget_time_zone, (s.v).budget_spent,
           (s.v).budget_period_start
    FROM (SELECT (SELECT x::engine_key FROM engine_valid_key(o.key_id, o.key_hash) x
                  WHERE NOT o.authorized LIMIT 1) AS v OFFSET 0) s
$$;

CREATE FUNCTION bench_one_statement(o engine_request, p_at timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $one$
DECLARE
    w record;
BEGIN
    IF o.op = 'reserve' THEN
        WITH k AS (SELECT * FROM bench_key_refusal(o)),
        d AS MATERIALIZED (SELECT dr.grant_id, dr.lo, dr.amount,
                                  engine_deltas('reserve', dr.amount, NULL) AS delta
                           FROM (SELECT ARRAY(SELECT g::engine_pool
                                              FROM engine_grant_pools(o.account) g) AS pools) p
                           CROSS JOIN LATERAL engine_draws(p.pools, o.account, 0, o.amount) dr),
        moved AS (
            UPDATE accounts a
            SET available = a.available - o.amount, reserved = a.reserved + o.amount,
                active_reservations = a.active_reservations + 1,
                version = a.version + (SELECT count(*) FROM d),
                updated_at = now()
            FROM k
            WHERE a.id = o.account AND k.refusal IS NULL
              AND engine_spend_refusal(a.status, a.available, o.amount, a.active_reservations,
                      a.max_active_reservations,
                      engine_key_budget_left(k.budget_tokens, k.budget_period, k.budget_time_zone,
                                             k.budget_spent, k.budget_period_start, p_at)) IS NULL
              AND NOT EXISTS (SELECT 1 FROM reservations x WHERE x.account_id = o.account
                              AND x.request_id = o.request AND x.job_id IS NULL)
              AND NOT EXISTS (SELECT 1 FROM engine_lapsing_grants(o.account, p_at))
            RETURNING a.available, a.reserved, a.used, a.low_balance_threshold, a.topup_threshold,
                      k.valid_key, k.last_used_at, k.budget_tokens,
                      engine_key_period_start(k.budget_period, k.budget_time_zone, p_at) AS period),
        g AS (UPDATE credit_grants g
              SET (remaining, reserved, consumed, debited, expired, drawable) =
                  (SELECT g.remaining + (x.t).remaining, g.reserved + (x.t).reserved,
                          g.consumed + (x.t).consumed, g.debited + (x.t).debited,
                          g.expired + (x.t).expired, g.remaining + (x.t).remaining > 0
                   FROM (SELECT engine_grant_deltas('reserve', d.amount, d.delta) AS t
                         FROM d WHERE d.grant_id = g.id) x)
              WHERE g.id = ANY (ARRAY(SELECT d.grant_id FROM d
                                      WHERE EXISTS (SELECT 1 FROM moved)))),
        held AS (INSERT INTO reservations (id, account_id, request_id, amount,
                     requested_ttl_seconds, state, expires_at, draws, budget_key_id,
                     budget_period_start)
                 SELECT o.new_id, o.account, o.request, o.amount, o.requested_ttl, 'held',
                        now() + make_interval(secs => o.ttl),
                        (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id,
                                                             'amount', d.amount)) FROM d),
                        CASE WHEN m.budget_tokens IS NOT NULL THEN m.valid_key END,
                        CASE WHEN m.budget_tokens IS NOT NULL THEN m.period END
                 FROM moved m
                 RETURNING id, account_id, request_id, amount, requested_ttl_seconds, state,
                           committed_amount, expires_at, job_id, created_at, resolved_at, draws,
                           budget_key_id, budget_period_start),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after,
                      reserved_after, used_after, reservation_id, actor, created_at, grant_id,
                      api_key_id)
                  SELECT o.account, 'reserve', d.amount,
                         m.available + o.amount - d.lo - d.amount,
                         m.reserved - o.amount + d.lo + d.amount, m.used, o.new_id, o.actor, p_at,
                         d.grant_id, m.valid_key
                  FROM moved m, d),
        spent AS (UPDATE api_keys x
                  SET budget_spent = CASE WHEN x.budget_period_start = m.period THEN x.budget_spent
                                          ELSE 0 END + o.amount,
                      budget_period_start = m.period
                  FROM moved m WHERE x.id = m.valid_key AND m.budget_tokens IS NOT NULL)
        SELECT m.*, (SELECT to_jsonb(h) FROM held h) AS object INTO w FROM moved m;
        IF w.object IS NULL THEN
            RAISE EXCEPTION 'one-statement reserve refused on %', o.account;
        END IF;
    ELSE
        WITH k AS (SELECT * FROM bench_key_refusal(o)),
        settled AS (
            UPDATE reservations x SET state = 'committed',
                committed_amount = COALESCE(o.amount, x.amount), resolved_at = now()
            FROM k
            WHERE x.id = o.reservation AND k.refusal IS NULL
              AND engine_settle_verdict(o.op, o.account, o.amount, o.job,
                      ROW(x.id, x.account_id, x.request_id, x.amount, x.requested_ttl_seconds,
                          x.state, x.committed_amount, x.expires_at, x.job_id, x.created_at,
                          x.resolved_at, x.draws, x.budget_key_id,
                          x.budget_period_start)::engine_reservation, now()) = o.op
            RETURNING x.id, x.account_id, x.request_id, x.amount, x.requested_ttl_seconds, x.state,
                      x.committed_amount, x.expires_at, x.job_id, x.created_at, x.resolved_at,
                      x.draws, x.budget_key_id, x.budget_period_start, k.valid_key, k.last_used_at),
        -- (The kind from a lateral join: engine_deltas uses its kind
        -- several times, and an SQL function is not inlined when such an
        -- argument holds a sub-select: it ran through fmgr_sql, planned at
        -- every call, +0.35 M a cycle.)
        parts AS MATERIALIZED (
            SELECT x.n, k.kind, x.amount, x.grant_id, engine_deltas(k.kind, x.amount, s.id) AS delta
            FROM settled s
            CROSS JOIN LATERAL bench_split_draws(s.draws, s.amount, s.committed_amount) x
            LEFT JOIN LATERAL (SELECT g.expires_at FROM credit_grants g
                               WHERE g.id = x.grant_id LIMIT 1) g ON true
            CROSS JOIN LATERAL (
                SELECT CASE WHEN x.part = 'commit' THEN 'commit'
                            WHEN engine_grant_lapsed(g.expires_at, p_at) THEN 'grant_expire'
                            ELSE 'release' END AS kind) k),
        moved AS (
            UPDATE accounts a
            SET (available, reserved, used, grant_expired, topup_unconsumed) =
                (SELECT a.available + t.available, a.reserved + t.reserved, a.used + t.used,
                        a.grant_expired + t.grant_expired,
                        engine_topup_unconsumed(a.topup_unconsumed, t.used, 0)
                 FROM (SELECT sum((p.delta).available)::bigint AS available,
                              sum((p.delta).reserved)::bigint AS reserved,
                              sum((p.delta).used)::bigint AS used,
                              sum((p.delta).grant_expired)::bigint AS grant_expired
                       FROM parts p) t),
                active_reservations = a.active_reservations - 1,
                version = a.version + (SELECT count(*) FROM parts),
                updated_at = now()
            WHERE a.id = o.account AND EXISTS (SELECT 1 FROM settled)
            RETURNING a.available, a.reserved, a.used, a.low_balance_threshold, a.topup_threshold),
        g AS (UPDATE credit_grants g
              SET (remaining, reserved, consumed, debited, expired, drawable) =
                  (SELECT g.remaining + sum((x.t).remaining), g.reserved + sum((x.t).reserved),
                          g.consumed + sum((x.t).consumed), g.debited + sum((x.t).debited),
                          g.expired + sum((x.t).expired), g.remaining + sum((x.t).remaining) > 0
                   FROM (SELECT engine_grant_deltas(p.kind, p.amount, p.delta) AS t
                         FROM parts p WHERE p.grant_id = g.id) x)
              WHERE g.id = ANY (ARRAY(SELECT p.grant_id FROM parts p))),
        entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after,
                      reserved_after, used_after, reservation_id, actor, created_at, grant_id,
                      api_key_id)
                  SELECT o.account, p.kind, p.amount,
                         m.available - COALESCE(sum((p.delta).available) OVER later, 0),
                         m.reserved - COALESCE(sum((p.delta).reserved) OVER later, 0),
                         m.used - COALESCE(sum((p.delta).used) OVER later, 0),
                         o.reservation, o.actor, p_at, p.grant_id,
                         (SELECT s.valid_key FROM settled s)
                  FROM moved m, parts p
                  WINDOW later AS (ORDER BY p.n DESC
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                  ORDER BY p.n)
        SELECT m.*, s.valid_key, s.last_used_at, NULL::bigint AS budget_tokens,
               to_jsonb(s) - 'valid_key' - 'last_used_at' AS object
        INTO w FROM moved m, settled s;
        IF w.object IS NULL THEN
            RAISE EXCEPTION 'one-statement commit refused on %', o.reservation;
        END IF;
    END IF;
    -- What the engine does only for an account or key that has something
    -- more to do (events, notices, top-ups): one test, false here.
    IF w.low_balance_threshold > 0 OR w.topup_threshold > 0 OR w.available = 0
       OR w.budget_tokens IS NOT NULL THEN
        RAISE EXCEPTION 'one-statement engine: account % has events or top-ups to write', o.account;
    END IF;
    IF w.valid_key IS NOT NULL AND engine_key_use_stale(w.last_used_at) THEN
        PERFORM engine_touch_keys(ARRAY[w.valid_key]);
    END IF;
    RETURN w.object;
END;
$one$;
-- The batch's accounts locked in id order, the batch's stamp, then each
-- operation by itself.
CREATE OR REPLACE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $apply$
DECLARE
    at timestamptz;
BEGIN
    PERFORM 1 FROM accounts WHERE id = ANY (ARRAY(SELECT u.account FROM unnest(p_ops) u))
    ORDER BY id FOR NO KEY UPDATE;
    at := engine_now();
    FOR i IN 1 .. cardinality(p_ops) LOOP
        op_position := i;
        outcome := CASE WHEN p_ops[i].op = 'reserve' THEN 'created' ELSE 'committed' END;
        object := bench_one_statement(p_ops[i], at);
        RETURN NEXT;
    END LOOP;
END;
$apply$;
