-- API keys: which presented keys are valid, who may spend where, and key budgets.

-- The valid-key rule, written once: key `p_id` is known, `p_hash` (the SHA-256 of the presented
-- secret) matches, and it is neither revoked nor expired. At most one row. Inlined where called
-- (one primary-key probe): engine_verify_keys and engine_lock_accounts (70_apply.sql).
CREATE FUNCTION engine_valid_key(p_id uuid, p_hash bytea) RETURNS SETOF engine_key
LANGUAGE sql STABLE AS $$
    SELECT k.id, k.scope, k.account_id, k.last_used_at, k.budget_tokens, k.budget_period,
           k.budget_time_zone, k.budget_spent, k.budget_period_start FROM api_keys k
    WHERE k.id = p_id AND k.secret_hash = p_hash AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > now())
$$;

-- A valid key's last_used_at is written again only when this stale: one write a minute per key.
CREATE FUNCTION engine_key_use_stale(p_last_used_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_last_used_at IS NULL OR p_last_used_at < now() - interval '1 minute'
$$;

-- The valid keys among those presented (`p_ids[i]`, its secret's SHA-256 `p_hashes[i]`): one
-- row each, with its position `n`. Stale last uses are written (engine_touch_keys).
CREATE FUNCTION engine_verify_keys(p_ids uuid[], p_hashes bytea[])
RETURNS TABLE (n integer, key_id uuid, scope text, account_id uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    valid record;
    stale uuid[] := '{}';
BEGIN
    FOR valid IN
        SELECT p.n::integer AS n, k.key_id, k.scope, k.account_id, k.last_used_at
        FROM unnest(p_ids, p_hashes) WITH ORDINALITY AS p (id, hash, n)
        CROSS JOIN LATERAL engine_valid_key(p.id, p.hash) k
    LOOP
        IF engine_key_use_stale(valid.last_used_at) THEN
            stale := stale || valid.key_id;
        END IF;
        n := valid.n; key_id := valid.key_id; scope := valid.scope;
        account_id := valid.account_id;
        RETURN NEXT;
    END LOOP;
    IF cardinality(stale) > 0 THEN
        PERFORM engine_touch_keys(stale);
    END IF;
END;
$$;

-- Who may spend on `p_account` with a valid key of `p_scope` (`p_key_account`: a kiosk key's
-- account): ok for admin and for the account's own kiosk key; not_found for another account's
-- kiosk key (another account's ids are 404, not 403); forbidden for finance.
CREATE FUNCTION engine_spend_authority(p_scope text, p_key_account uuid, p_account uuid)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_scope = 'admin' THEN 'ok'
        WHEN p_scope = 'kiosk' AND p_key_account = p_account THEN 'ok'
        WHEN p_scope = 'kiosk' THEN 'not_found'
        ELSE 'forbidden'
    END
$$;

-- A spending operation's key refusal, written once: NULL when the service authorised it
-- (`p_authorized`) or the key `p_key` (engine_valid_key's row; NULL: not valid) may spend on
-- `p_account`; else unauthorized, not_found or forbidden. engine_apply asks it first.
CREATE FUNCTION engine_key_refusal(p_authorized boolean, p_key engine_key, p_account uuid)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_authorized THEN NULL
                WHEN p_key.key_id IS NULL THEN 'unauthorized'
                ELSE NULLIF(engine_spend_authority(p_key.scope, p_key.account_id, p_account), 'ok')
           END
$$;

-- Writes last_used_at of the keys `p_keys` whose last use is stale (engine_key_use_stale); a key
-- row another transaction holds is skipped, never waited for. PL/pgSQL, not SQL: callers PERFORM
-- it, and a SQL function called so is planned again at every call.
CREATE FUNCTION engine_touch_keys(p_keys uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE api_keys SET last_used_at = now()
    WHERE id = ANY (ARRAY(SELECT k.id FROM api_keys k
                          WHERE k.id = ANY (p_keys) AND engine_key_use_stale(k.last_used_at)
                          ORDER BY k.id
                          FOR UPDATE SKIP LOCKED));
END;
$$;

-- Key budget periods, written once: the period holding `p_at` is a day, a week (from Monday) or
-- a month in the time zone `p_tz` (a name PostgreSQL knows), start included, end excluded;
-- `total` starts at -infinity and never ends (NULL).
CREATE FUNCTION engine_key_period_start(p_period text, p_tz text, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_period = 'total' THEN '-infinity'::timestamptz
                ELSE date_trunc(p_period, p_at AT TIME ZONE p_tz) AT TIME ZONE p_tz END
$$;

CREATE FUNCTION engine_key_period_end(p_period text, p_tz text, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_period <> 'total'
                THEN (date_trunc(p_period, p_at AT TIME ZONE p_tz) + ('1 ' || p_period)::interval)
                     AT TIME ZONE p_tz END
$$;

-- The tokens of a key's budget (`p_budget` per `p_period` in `p_tz`) free at `p_at`, when
-- `p_spent` counts the period starting at `p_spent_start` (an older period counts 0); NULL: no
-- budget. A spend of more is refused key_budget_exhausted (engine_spend_refusal).
CREATE FUNCTION engine_key_budget_left(p_budget bigint, p_period text, p_tz text,
    p_spent bigint, p_spent_start timestamptz, p_at timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT p_budget - CASE WHEN p_spent_start = engine_key_period_start(p_period, p_tz, p_at)
                           THEN p_spent ELSE 0 END
$$;

-- A key's budget as the API and the key.budget_* events show it at `p_at` (NULL: no budget).
-- `spent`: what its reservations hold or used this period; `resets_at` NULL: total, never.
CREATE FUNCTION engine_key_budget_json(p_budget bigint, p_period text, p_tz text,
    p_low_percent smallint, p_spent bigint, p_spent_start timestamptz, p_at timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_budget IS NOT NULL THEN jsonb_build_object(
        'budget_tokens', p_budget, 'budget_period', p_period, 'budget_time_zone', p_tz,
        'budget_low_percent', p_low_percent, 'spent', p_budget - l.tokens,
        'remaining', GREATEST(l.tokens, 0),
        'resets_at', engine_time(engine_key_period_end(p_period, p_tz, p_at)))
    END
    FROM (SELECT engine_key_budget_left(p_budget, p_period, p_tz, p_spent, p_spent_start,
                                        p_at) AS tokens) l
$$;
