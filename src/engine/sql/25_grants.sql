-- Credit grants: lapse, draw order, view, rollover, expiry notices, a priced grant's value.

-- A grant has lapsed at `p_at` once its expiry has come (NULL: never), written once. Inlined
-- where called, so a scan by expiry keeps its index.
CREATE FUNCTION engine_grant_lapsed(p_expires_at timestamptz, p_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at IS NOT NULL AND p_expires_at <= p_at
$$;

-- A grant's status at `p_at`: expired once lapsed (its lapse written or not), else active while
-- it holds tokens (remaining or reserved), else depleted.
CREATE FUNCTION engine_grant_status(p_expires_at timestamptz, p_remaining bigint,
    p_reserved bigint, p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN engine_grant_lapsed(p_expires_at, p_at) THEN 'expired'
                WHEN p_remaining + p_reserved > 0 THEN 'active'
                ELSE 'depleted' END
$$;

-- A grant as the API and events show it, from to_jsonb of its row (not a row type: 00_types.sql).
CREATE FUNCTION engine_grant_json(p_grant jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('grant_id', p_grant->'id', 'account_id', p_grant->'account_id',
        'amount', p_grant->'amount', 'remaining', p_grant->'remaining',
        'reserved', p_grant->'reserved', 'expires_at', engine_time_of(p_grant->'expires_at'),
        'priority', p_grant->'priority',
        'status', engine_grant_status((p_grant->>'expires_at')::timestamptz,
                                      (p_grant->>'remaining')::bigint,
                                      (p_grant->>'reserved')::bigint, now()),
        'external_ref', p_grant->'external_ref',
        'created_at', engine_time_of(p_grant->'created_at'),
        'expired_at', engine_time_of(p_grant->'expired_at'),
        'topup_rule_id', p_grant->'topup_rule_id',
        'amount_paid', p_grant->'amount_paid', 'currency', p_grant->'currency',
        'rolled_over_from', p_grant->'rolled_over_from')
$$;

-- A grant's lapse is due at `p_at`, written once: lapsed, not yet written, and holding drawable
-- tokens (one that holds none moves nothing; the reaper marks it). Callers also write
-- `g.drawable` beside it, so the look-up uses credit_grants_drawable_idx (its predicate).
CREATE FUNCTION engine_grant_lapse_due(p_drawable boolean, p_expired_at timestamptz,
    p_expires_at timestamptz, p_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_drawable AND p_expired_at IS NULL AND engine_grant_lapsed(p_expires_at, p_at)
$$;

-- A grant of `p_account` due to lapse at `p_at` (at most one row: a spend on the account lapses
-- them all first, engine_lapse_grants).
CREATE FUNCTION engine_lapsing_grants(p_account uuid, p_at timestamptz)
RETURNS TABLE (grant_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT g.id FROM credit_grants g
    WHERE g.account_id = p_account AND g.drawable
      AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, p_at)
    LIMIT 1
$$;

-- The draw order, written once: the account's drawable grants (remaining > 0) by priority (0
-- first), then soonest expiry (never-expiring last), then creation, each as the interval
-- [lo, hi) of the account's drawable tokens it covers. After them, one interval of no grant
-- (grant_id NULL): reached only when the grants do not hold the available tokens (a broken
-- invariant the checks report), so the tokens still move. One account per call, so the planner
-- inlines it (a call whose argument is a sub-select is not inlined: planned at every call).
CREATE FUNCTION engine_grant_pools(p_account uuid) RETURNS SETOF engine_pool
LANGUAGE sql STABLE AS $$
    SELECT p_account, p.grant_id, p.hi - p.remaining, p.hi
    FROM (SELECT g.id AS grant_id, g.remaining,
                 (sum(g.remaining) OVER (ORDER BY g.priority, g.expires_at, g.seq))::bigint AS hi
          FROM credit_grants g
          WHERE g.account_id = p_account AND g.drawable) p
    UNION ALL
    SELECT p_account, NULL::uuid, COALESCE(sum(g.remaining), 0)::bigint, 4611686018427387904
    FROM credit_grants g
    WHERE g.account_id = p_account AND g.drawable
$$;

-- The tokens a draw of the drawable tokens [p_from, p_to) takes from the pool `p` (an interval
-- of engine_grant_pools): their overlap, 0 when none. Written once: engine_spend draws a pool at
-- a time, engine_draws a set of them.
CREATE FUNCTION engine_draw(p engine_pool, p_from bigint, p_to bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT GREATEST(LEAST(p_to, p.hi) - GREATEST(p_from, p.lo), 0)
$$;

-- The draws taking `p_account`'s drawable tokens [p_from, p_to) from `p_pools` (engine_grant_pools,
-- in order; other accounts' skipped), in draw order, with where each starts (`lo`) and the tokens
-- it takes (engine_draw; grant_id NULL: no grant).
CREATE FUNCTION engine_draws(p_pools engine_pool[], p_account uuid, p_from bigint, p_to bigint)
RETURNS TABLE (grant_id uuid, lo bigint, amount bigint)
LANGUAGE sql IMMUTABLE AS $$
    SELECT p.grant_id, GREATEST(p_from, p.lo), engine_draw(p, p_from, p_to)
    FROM unnest(p_pools) p
    WHERE p.account_id = p_account AND engine_draw(p, p_from, p_to) > 0
$$;

-- The lapse, written once: each grant of `p_accounts` due at `p_at` (engine_grant_lapse_due) is
-- marked (expired_at); what it holds leaves the account as a grant_expire entry naming it
-- (reason grant_expired: grant.expired). What reservations drew from it stays reserved until
-- they settle (engine_settle). Called before a spend draws (by engine_apply when engine_spend
-- reports `lapsing`; by a removal in engine_external), so a lapsed grant is never drawn, and by
-- the reaper. The caller holds the accounts' row locks. Returns grants lapsed, tokens that left.
-- Rollover (docs/topups.md): a lapsed grant of a rule with rollover_max_tokens set, not itself
-- carried, carries engine_rollover_carry of what it held into a new unpriced credit
-- (engine_external) of its priority and rule; then grant.rolled_over. Unlike other credits it is
-- not use against a threshold rule; its external_ref, `rollover:<the credit's own id>`, no one
-- can book first. One carry per grant: the lapse is written once under the account's lock, and
-- rolled_over_from is unique.
CREATE FUNCTION engine_lapse_grants(p_accounts uuid[], p_at timestamptz,
    OUT grants integer, OUT tokens bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    lapsed credit_grants[];
    c record;
    made record;
    carried uuid;
BEGIN
    WITH due AS (
        UPDATE credit_grants g SET expired_at = p_at
        WHERE g.account_id = ANY (p_accounts) AND g.drawable
          AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, p_at)
        RETURNING g.*
    )
    SELECT array_agg(d ORDER BY d.account_id, d.seq), count(*), COALESCE(sum(d.remaining), 0)
    INTO lapsed, grants, tokens FROM due d;
    IF lapsed IS NULL THEN
        RETURN;
    END IF;
    PERFORM engine_record(ARRAY(
        SELECT ROW(l.account_id, 'grant_expire', l.remaining, 0, NULL, NULL, NULL, 'grant_expired',
                   'system', p_at, l.id, NULL)::engine_movement
        FROM unnest(lapsed) l
        ORDER BY l.account_id, l.seq));
    FOR c IN
        SELECT l.id, l.account_id, l.priority, l.remaining, r.id AS rule,
               r.rollover_max_tokens AS max,
               engine_rollover_carry(l.remaining, r.rollover_max_tokens) AS tokens,
               p_at + make_interval(secs => r.rollover_expires_after_seconds) AS expires
        FROM unnest(lapsed) l JOIN topup_rules r ON r.id = l.topup_rule_id
        WHERE r.rollover_max_tokens IS NOT NULL AND l.rolled_over_from IS NULL
        ORDER BY l.account_id, l.seq
    LOOP
        carried := gen_random_uuid();
        SELECT * INTO made FROM engine_external('credit', c.account_id, carried, c.tokens,
            'rollover:' || carried, 'rollover of grant ' || c.id, NULL, 'topup-rule:' || c.rule,
            NULL, c.priority, c.expires, NULL, NULL, c.rule, NULL, c.id);
        IF made.outcome <> 'created' THEN
            RAISE EXCEPTION 'engine_lapse_grants: the rollover of grant % was %', c.id, made.outcome;
        END IF;
        PERFORM engine_tally_add('topup_credited', c.tokens);
        PERFORM engine_emit_event('grant.rolled_over', a.id, engine_event_account(a)
            || jsonb_build_object('grant_id', c.id, 'unused', c.remaining, 'tokens', c.tokens,
                'max_tokens', c.max,
                'grant', (SELECT engine_grant_json(to_jsonb(g)) FROM credit_grants g
                          WHERE g.id = c.id),
                'credit', made.object->'credit'), p_at)
        FROM accounts a WHERE a.id = c.account_id;
    END LOOP;
END;
$$;

-- A rollover carries at most the rule's `p_max` (rollover.max_tokens) of `p_unused` tokens.
CREATE FUNCTION engine_rollover_carry(p_unused bigint, p_max bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT LEAST(p_unused, p_max)
$$;

-- The reaper's lapse: locks, in id order, the accounts of up to `p_limit` grants due (soonest
-- first), lapses them (engine_lapse_grants), and marks lapsed (expired_at), with no movement,
-- those holding no drawable token. Returns the grants lapsed and the tokens that left.
CREATE FUNCTION engine_expire_grants(p_limit integer, OUT grants integer, OUT tokens bigint)
LANGUAGE plpgsql AS $$
DECLARE
    due_accounts uuid[];
    at timestamptz;
    marked integer;
BEGIN
    SELECT array_agg(DISTINCT d.account_id) INTO due_accounts
    FROM (SELECT g.account_id FROM credit_grants g
          WHERE g.expired_at IS NULL AND engine_grant_lapsed(g.expires_at, now())
          ORDER BY g.expires_at LIMIT p_limit) d;
    grants := 0; tokens := 0;
    IF due_accounts IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = ANY (due_accounts) ORDER BY id FOR NO KEY UPDATE;
    at := engine_now();
    SELECT l.grants, l.tokens INTO grants, tokens FROM engine_lapse_grants(due_accounts, at) l;
    UPDATE credit_grants g SET expired_at = at
    WHERE g.account_id = ANY (due_accounts) AND g.expired_at IS NULL
      AND engine_grant_lapsed(g.expires_at, at);
    GET DIAGNOSTICS marked = ROW_COUNT;
    grants := grants + marked;
END;
$$;

-- The grant.expiring notices: up to `p_limit` grants lapsing within `p_notice_hours` (not lapsed
-- yet), not noticed before and still holding tokens, each get one event and are marked noticed
-- (expiring_notified_at). Returns how many.
CREATE FUNCTION engine_notice_expiring_grants(p_notice_hours integer, p_limit integer)
RETURNS integer
LANGUAGE sql AS $$
    WITH due AS (
        SELECT g.id FROM credit_grants g
        WHERE g.expired_at IS NULL AND g.expiring_notified_at IS NULL
          AND engine_grant_lapsed(g.expires_at, now() + make_interval(hours => p_notice_hours))
          AND NOT engine_grant_lapsed(g.expires_at, now()) AND g.remaining + g.reserved > 0
        ORDER BY g.expires_at LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), marked AS (
        UPDATE credit_grants g SET expiring_notified_at = now()
        FROM due WHERE g.id = due.id
        RETURNING g.*
    ), written AS (
        INSERT INTO events (type, account_id, data, created_at)
        SELECT 'grant.expiring', m.account_id,
               engine_event_account(a) || jsonb_build_object('grant_id', m.id,
                   'amount', m.remaining + m.reserved, 'expires_at', engine_time(m.expires_at),
                   'grant', engine_grant_json(to_jsonb(m))),
               clock_timestamp()
        FROM marked m JOIN accounts a ON a.id = m.account_id
        ORDER BY m.expires_at, m.id
        RETURNING 1
    )
    SELECT count(*)::integer FROM written
$$;

-- A priced grant's money (docs/finance.md, "Money"), written once: the value of the first
-- `p_gone` of its `p_tokens` tokens, bought for `p_paid` minor units. A cumulative floor, so the
-- tokens leaving it for good (used, lapsed, removed), valued in ledger order as differences of
-- this, add up to exactly `p_paid`. The revenue report (src/domain/revenue.rs) values with it.
CREATE FUNCTION engine_grant_value(p_paid bigint, p_gone bigint, p_tokens bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT div(p_paid::numeric * p_gone, p_tokens)::bigint
$$;

-- The value of `p_gone` tokens leaving a priced grant after `p_before` had left it.
CREATE FUNCTION engine_grant_value_of(p_paid bigint, p_before bigint, p_gone bigint,
    p_tokens bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT engine_grant_value(p_paid, p_before + p_gone, p_tokens)
           - engine_grant_value(p_paid, p_before, p_tokens)
$$;
