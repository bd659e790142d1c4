-- Key rules: which presented keys are valid, and who may spend where.

-- The rule of a valid key, written once: the presented key `p_id` is
-- valid when it is known, the SHA-256 of the presented secret (`p_hash`)
-- matches, and it is neither revoked nor expired. At most one row: the key.
-- Inlined where it is called (one probe of the primary key): by
-- engine_verify_keys and engine_key_refusal below.
CREATE FUNCTION engine_valid_key(p_id uuid, p_hash bytea)
RETURNS TABLE (key_id uuid, scope text, account_id uuid, last_used_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT k.id, k.scope, k.account_id, k.last_used_at FROM api_keys k
    WHERE k.id = p_id AND k.secret_hash = p_hash AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > now())
$$;

-- A valid key's last_used_at is written again when it is this old: at most
-- one write a minute per key.
CREATE FUNCTION engine_key_use_stale(p_last_used_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_last_used_at IS NULL OR p_last_used_at < now() - interval '1 minute'
$$;

-- The presented keys (`p_ids[i]` with the SHA-256 of its secret
-- `p_hashes[i]`) that are valid: known, the secret's hash matching, not
-- revoked, not expired. One row per valid key, with its position `n`. A
-- valid key's last_used_at is brought up to date when it is more than a
-- minute old: at most one write a minute per key, and a key row another
-- transaction holds is skipped, never waited for.
CREATE FUNCTION engine_verify_keys(p_ids uuid[], p_hashes bytea[])
RETURNS TABLE (n integer, key_id uuid, scope text, account_id uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    valid record;
    stale uuid[] := '{}';
BEGIN
    -- One probe of the primary key per presented key (the rule is inlined).
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

-- Who may spend on `p_account` with a valid key of `p_scope` (bound to
-- `p_key_account` for a kiosk key): ok for an admin key and for the
-- account's own kiosk key; not_found for another account's kiosk key
-- (another account's ids are 404, not 403); forbidden for finance.
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

-- A spending operation's key refusal, written once: NULL when the
-- service authorised the operation (`p_authorized`) or the key `p_key_id`
-- with the secret's hash `p_key_hash` is valid (engine_valid_key) and may
-- spend on `p_account` (engine_spend_authority); else unauthorized (no such
-- valid key), not_found (another account's kiosk key: `detail` names the
-- account as what is not found) or forbidden. One row, always, with the
-- valid key and its last use (NULL when authorised or not valid):
-- engine_apply writes a stale use (engine_key_use_stale, engine_touch_keys).
-- Inlined where it is called.
CREATE FUNCTION engine_key_refusal(p_authorized boolean, p_key_id uuid, p_key_hash bytea,
    p_account uuid)
RETURNS TABLE (refusal text, detail jsonb, valid_key uuid, last_used_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT r.refusal, CASE WHEN r.refusal = 'not_found' THEN '{"what": "account"}'::jsonb END,
           r.key_id, r.last_used_at
    FROM (SELECT CASE WHEN p_authorized THEN NULL
                      WHEN v.key_id IS NULL THEN 'unauthorized'
                      ELSE NULLIF(engine_spend_authority(v.scope, v.account_id, p_account), 'ok')
                 END AS refusal,
                 v.key_id, v.last_used_at
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (SELECT k.* FROM engine_valid_key(p_key_id, p_key_hash) k
                             WHERE NOT p_authorized LIMIT 1) v ON true) r
$$;

-- A verified key's last use, written once a minute at most
-- (engine_key_use_stale): the keys `p_keys` whose last use is stale have
-- it written; a key row another transaction holds is skipped, never
-- waited for. PL/pgSQL, not SQL: its callers PERFORM it, and a SQL
-- function called so is planned again at every call; PL/pgSQL keeps the
-- statement's plan for the session.
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
