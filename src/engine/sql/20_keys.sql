-- Key rules: which presented keys are valid, and who may spend where.

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
BEGIN
    RETURN QUERY
    WITH presented AS (
        SELECT p.* FROM unnest(p_ids, p_hashes) WITH ORDINALITY AS p (id, hash, n)
    ), valid AS (
        SELECT p.n, k.id, k.scope, k.account_id, k.last_used_at
        FROM presented p
        -- By the primary key (= ANY of the presented ids): the functions
        -- run generic plans, and a plain join is planned as a scan of
        -- every key.
        JOIN api_keys k ON k.id = p.id AND k.secret_hash = p.hash AND k.revoked_at IS NULL
                       AND (k.expires_at IS NULL OR k.expires_at > now())
                       AND k.id = ANY (ARRAY(SELECT id FROM presented))
    ), touched AS (
        UPDATE api_keys SET last_used_at = now()
        WHERE id IN (SELECT k.id FROM api_keys k
                     WHERE k.id IN (SELECT v.id FROM valid v
                                    WHERE v.last_used_at IS NULL
                                       OR v.last_used_at < now() - interval '1 minute')
                       AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute')
                     ORDER BY k.id
                     FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT v.n::integer, v.id, v.scope, v.account_id FROM valid v;
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
