-- Credit grants: their draw order, their view, and their lapse.

-- Whether a grant expiring at `p_expires_at` has lapsed at `p_at`, written
-- once: its expiry has come (NULL: it never expires, never lapsed). Every
-- other place asks this function (inlined where it is called, so a scan
-- by expiry still uses its index).
CREATE FUNCTION engine_grant_lapsed(p_expires_at timestamptz, p_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at IS NOT NULL AND p_expires_at <= p_at
$$;

-- A grant's status at `p_at`: expired once its expiry has passed (whether
-- or not its lapse is written yet), else active while it holds tokens
-- (remaining or reserved), else depleted. (No engine function takes a
-- credit_grants row: a row type in a signature would tie the table to
-- every installed engine schema.)
CREATE FUNCTION engine_grant_status(p_expires_at timestamptz, p_remaining bigint,
    p_reserved bigint, p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN engine_grant_lapsed(p_expires_at, p_at) THEN 'expired'
                WHEN p_remaining + p_reserved > 0 THEN 'active'
                ELSE 'depleted' END
$$;

-- A grant (its row as JSON: to_jsonb of a credit_grants row) as the API
-- and the events show it (the other resources' are in 05_views.sql).
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

-- When a grant's lapse is due at `p_at`, written once: its expiry has
-- passed, its lapse is not written yet, and it holds drawable tokens (a
-- lapsed grant that holds none leaves nothing; the reaper marks it).
-- Callers write `g.drawable` beside it as well: the look-up by account then
-- uses credit_grants_drawable_idx, whose predicate that is.
CREATE FUNCTION engine_grant_lapse_due(p_drawable boolean, p_expired_at timestamptz,
    p_expires_at timestamptz, p_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_drawable AND p_expired_at IS NULL AND engine_grant_lapsed(p_expires_at, p_at)
$$;

-- The grants of `p_account` due to lapse at `p_at` (at most one row: a
-- spend on the account lapses them first, engine_lapse_grants).
CREATE FUNCTION engine_lapsing_grants(p_account uuid, p_at timestamptz)
RETURNS TABLE (grant_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT g.id FROM credit_grants g
    WHERE g.account_id = p_account AND g.drawable
      AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, p_at)
    LIMIT 1
$$;

-- The draw order, written once: the account's grants that hold tokens
-- (drawable: remaining > 0) ordered by priority (0 first), then the soonest expiry
-- (grants that never expire last), then creation order, each as the
-- interval [lo, hi) of the account's drawable tokens it covers. After them
-- lies one interval of no grant (grant_id NULL): only an account whose
-- grants do not hold its available tokens (a broken invariant, which the
-- checks report) reaches it, and its tokens still move. A spend
-- (engine_spend) or a removal (engine_external) drawing the account's
-- tokens [from, to) takes the overlap with each interval. One account per
-- call, so that the planner inlines it (a call whose argument is a
-- sub-select is not inlined, and would be planned on every call).
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

-- The draws of a spend taking the account `p_account`'s drawable tokens
-- [p_from, p_to) in draw order, from its intervals `p_pools`
-- (engine_grant_pools, in their order; intervals of other accounts are
-- passed over): one row per grant it draws from (grant_id NULL: tokens no
-- grant holds), in draw order, with the start of its interval (`lo`) and
-- the tokens it takes.
CREATE FUNCTION engine_draws(p_pools engine_pool[], p_account uuid, p_from bigint, p_to bigint)
RETURNS TABLE (grant_id uuid, lo bigint, amount bigint)
LANGUAGE sql IMMUTABLE AS $$
    SELECT p.grant_id, GREATEST(p_from, p.lo),
           (LEAST(p_to, p.hi) - GREATEST(p_from, p.lo))::bigint
    FROM unnest(p_pools) p
    WHERE p.account_id = p_account AND p.lo < p_to AND p.hi > p_from
$$;

-- The lapse, written once: every grant of `p_accounts` that still holds
-- drawable tokens, whose expiry has passed at `p_at` and whose lapse is not
-- written yet is marked lapsed (expired_at), and what it holds leaves the
-- account as a grant_expire entry naming it (engine_record; reason
-- grant_expired, which writes the grant.expired event). A lapsed grant
-- that holds no drawable token moves nothing: the reaper marks it
-- (engine_expire_grants). Tokens held reservations drew from it
-- stay reserved: when their reservation settles, the rest that goes back
-- to it expires at once (engine_settle). Called by every spending decision
-- on its accounts before it draws (engine_spend, a removal in
-- engine_external), so a lapsed grant is never drawn, and by the reaper
-- (engine_expire_grants) for the others. The caller holds the accounts'
-- row locks. Returns the grants lapsed and the tokens that left.
--
-- Rollover (docs/topups.md): a lapsed grant of a top-up rule with
-- `rollover` (rollover_max_tokens set; the rule as it is at the lapse,
-- deleted or disabled included) that is not itself a carried grant
-- carries engine_rollover_carry of what it held into a new grant, in this
-- transaction: a credit (engine_external: credited and the ledger show it;
-- unlike other credits, it is not use against a threshold rule) of the
-- grant's priority and rule (external_ref `rollover:<its own id>`: no
-- one can book it first), lapsing `rollover_expires_after_seconds` after
-- `p_at` (NULL: never), unpriced (the lapsed grant's price is
-- recognised as its lapse's breakage), naming it (rolled_over_from: one
-- per grant, a unique index); then `grant.rolled_over`. A lapse is
-- written once (expired_at, under the account's lock), so is its carry.
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

-- What a rollover carries of the `p_unused` tokens a lapsing grant held:
-- at most the rule's `p_max` (rollover.max_tokens).
CREATE FUNCTION engine_rollover_carry(p_unused bigint, p_max bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT LEAST(p_unused, p_max)
$$;

-- The reaper's lapse: the accounts of up to `p_limit` grants due to lapse
-- (soonest first) are locked in id order and their lapsed grants written
-- (engine_lapse_grants); the lapsed grants that hold no drawable token are
-- marked lapsed (expired_at) without a movement. Returns the grants lapsed
-- and the tokens that left.
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

-- The grant.expiring notices: up to `p_limit` grants that lapse within
-- `p_notice_hours` (and have not yet), not noticed before, still holding
-- tokens, each get one grant.expiring event (the grant and its account's
-- balances) and are marked noticed. Returns how many.
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

-- A priced grant's money (docs/finance.md, "Money"): the value of the first
-- `p_gone` of its `p_tokens` tokens, bought for `p_paid` minor units, is
-- floor(p_paid × p_gone / p_tokens) — a cumulative floor, so the tokens
-- that leave it for good (used, lapsed, removed), valued in ledger order as
-- differences of this, add up to exactly `p_paid` once all have left: the
-- last token takes the remainder. The revenue report (src/domain/revenue.rs)
-- values every such entry and every deferred balance with it, at read time.
CREATE FUNCTION engine_grant_value(p_paid bigint, p_gone bigint, p_tokens bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT div(p_paid::numeric * p_gone, p_tokens)::bigint
$$;

-- The value of `p_gone` tokens leaving a priced grant after `p_before` had
-- left it (engine_grant_value's difference).
CREATE FUNCTION engine_grant_value_of(p_paid bigint, p_before bigint, p_gone bigint,
    p_tokens bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT engine_grant_value(p_paid, p_before + p_gone, p_tokens)
           - engine_grant_value(p_paid, p_before, p_tokens)
$$;
