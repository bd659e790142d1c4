-- The lean path: what a kiosk sends most — a reserve or a job, a commit
-- (of all or part of what it holds) or a release, alone or a few together —
-- applied
-- in two short statements per operation: the account's row lock (and its
-- balances), then one conditional statement that checks what is left to
-- check and writes everything. engine_apply (`70_apply.sql`) tries it
-- first, operation by operation in batch order.
--
-- It decides only the plain case, where the answer is the success and no
-- event is due: the key verifies and may spend here (and its last use was
-- written less than a minute ago), the account is active and holds the
-- tokens and a free reservation slot, the request_id is new, no grant of
-- the account is due to lapse, a settlement returns nothing to a lapsed
-- grant, and the movement crosses no threshold and empties nothing. For
-- anything else (a refusal, a replay, a lapse, an event) it writes nothing
-- and answers NULL, and engine_apply hands that operation and every one
-- after it to the full machinery, which then decides them as if one by one
-- after the ones the lean path applied: the answers are the ones the full
-- machinery would have given, operation by operation (the differential
-- test compares the service with the model on every step, and
-- tests/api/lean.rs compares the two paths on the same histories).
--
-- The rules are not written again here: the key's validity and when its
-- use is written (engine_valid_key, engine_key_use_stale), the draw order
-- (engine_grant_pools), a settlement's split over its draws
-- (engine_split_draws), what a movement does to the account and to its
-- grant (engine_deltas, engine_grant_deltas), the low-balance state
-- (engine_is_low) and a grant's lapse (engine_grant_lapse_due) are the
-- functions the full machinery calls, inlined. What the lean path adds is
-- only the test that a case is plain.
--
-- The caller holds no lock; the account's row lock is taken by the first
-- statement. The second statement runs with a snapshot taken after the
-- lock, so it sees every reservation and grant committed before it.

-- The first statement of every lean operation: `p_account`'s row, locked
-- (FOR NO KEY UPDATE, as every path locks it), when the caller may spend on
-- it — the service vouches for it (`p_authorized`), or its key is valid
-- (engine_valid_key) and may spend here (engine_spend_authority). NULL
-- when there is no such account or the caller may not spend on it. A valid
-- key whose last use is stale (engine_key_use_stale) has it written now, as
-- engine_verify_keys does: a key row another transaction holds is skipped,
-- never waited for.
CREATE FUNCTION engine_lean_account(p_account uuid, p_authorized boolean, p_key_id uuid,
    p_key_hash bytea)
RETURNS accounts
LANGUAGE plpgsql AS $$
DECLARE
    locked record;
BEGIN
    -- The key is read in the statement that locks the account.
    SELECT x AS account, k.key_id, k.scope, k.account_id AS key_account, k.last_used_at
    INTO locked
    FROM accounts x LEFT JOIN LATERAL engine_valid_key(p_key_id, p_key_hash) k ON true
    WHERE x.id = p_account FOR NO KEY UPDATE OF x;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF p_authorized THEN
        RETURN locked.account;
    ELSIF locked.key_id IS NULL
          OR engine_spend_authority(locked.scope, locked.key_account, p_account) <> 'ok' THEN
        RETURN NULL;
    END IF;
    IF engine_key_use_stale(locked.last_used_at) THEN
        UPDATE api_keys SET last_used_at = now()
        WHERE id = (SELECT k.id FROM api_keys k
                    WHERE k.id = p_key_id AND engine_key_use_stale(k.last_used_at)
                    FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN locked.account;
END;
$$;

-- A reserve: `p_amount` tokens for the API's `p_request`, drawn from the
-- account's grants in draw order; or, when `p_job` is set, a generation
-- job of `p_kind` with `p_params` (its canonical request hash `p_hash`)
-- and its reservation of its cost `p_amount` (create_job). Answers the new
-- reservation, or the new job as the API shows it (engine_job_view), as
-- JSON; or NULL when the case is not plain (nothing written).
CREATE FUNCTION engine_lean_reserve(p_account uuid, p_actor text, p_key_id uuid,
    p_key_hash bytea, p_authorized boolean, p_request uuid, p_amount bigint,
    p_requested_ttl integer, p_ttl integer, p_reservation uuid, p_job uuid, p_hash bytea,
    p_kind text, p_params jsonb)
RETURNS jsonb
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    a accounts;
    at timestamptz;
    created jsonb;
BEGIN
    a := engine_lean_account(p_account, p_authorized, p_key_id, p_key_hash);
    IF a.id IS NULL OR a.status <> 'active' OR a.available <= p_amount
       OR (a.max_active_reservations > 0 AND a.active_reservations >= a.max_active_reservations)
       OR (a.low_balance_threshold > 0
           AND engine_is_low(a.available - p_amount, a.low_balance_threshold) <> a.balance_low) THEN
        -- (available = amount would empty the account: its event.)
        RETURN NULL;
    END IF;
    at := clock_timestamp();
    WITH plain AS (
        -- The request_id is new: no reservation of the API (reserve) or
        -- job (create_job) of this account has it.
        SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM reservations r
                          WHERE p_job IS NULL AND r.account_id = p_account
                            AND r.request_id = p_request AND r.job_id IS NULL)
          AND NOT EXISTS (SELECT 1 FROM generation_jobs j
                          WHERE p_job IS NOT NULL AND j.account_id = p_account
                            AND j.request_id = p_request)
          AND NOT EXISTS (SELECT 1 FROM credit_grants g
                          WHERE g.account_id = p_account AND g.drawable
                            AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, at))
    ), draws AS MATERIALIZED (
        -- The reserve takes the account's drawable tokens [0, amount).
        SELECT p.grant_id, (LEAST(p_amount, p.hi) - p.lo)::bigint AS amount, p.lo
        FROM plain CROSS JOIN engine_grant_pools(p_account) p
        WHERE p.lo < p_amount
    ), moves AS MATERIALIZED (
        SELECT d.grant_id, d.amount, d.lo, m.*
        FROM draws d CROSS JOIN LATERAL engine_deltas('reserve', d.amount, p_reservation) m
    ), grants AS (
        UPDATE credit_grants g
        SET remaining = g.remaining + t.remaining, reserved = g.reserved + t.reserved,
            drawable = g.remaining + t.remaining > 0
        FROM (SELECT d.grant_id, x.remaining, x.reserved FROM draws d
              CROSS JOIN LATERAL engine_grant_deltas('reserve', d.amount, p_reservation) x) t
        WHERE g.id = t.grant_id AND g.id = ANY (ARRAY(SELECT grant_id FROM draws))
        RETURNING g.id
    ), held AS (
        INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds,
            state, expires_at, job_id, draws)
        SELECT p_reservation, p_account, p_request, p_amount, p_requested_ttl, 'held',
               now() + make_interval(secs => p_ttl), p_job,
               (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)
                                 ORDER BY d.lo) FROM draws d)
        FROM plain
        RETURNING *
    ), job AS (
        INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
            reservation_id)
        SELECT p_job, p_account, p_request, p_hash, p_kind, p_params, p_amount, p_reservation
        FROM plain WHERE p_job IS NOT NULL
        RETURNING *
    ), moved AS (
        UPDATE accounts x
        SET available = x.available + s.available, reserved = x.reserved + s.reserved,
            active_reservations = x.active_reservations + 1, version = x.version + s.entries,
            balance_low = engine_is_low(x.available + s.available, x.low_balance_threshold),
            updated_at = now()
        FROM (SELECT sum(m.available)::bigint AS available, sum(m.reserved)::bigint AS reserved,
                     count(*) AS entries FROM moves m) s
        WHERE x.id = p_account AND s.entries > 0
        RETURNING x.available - s.available AS available, x.reserved - s.reserved AS reserved,
                  x.used
    ), entries AS (
        INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
            used_after, reservation_id, job_id, external_ref, reason, actor, created_at, grant_id)
        SELECT p_account, 'reserve', m.amount, b.available + (sum(m.available) OVER w)::bigint,
               b.reserved + (sum(m.reserved) OVER w)::bigint, b.used, p_reservation, p_job, NULL,
               NULL, p_actor, at, m.grant_id
        FROM moves m CROSS JOIN moved b
        WINDOW w AS (ORDER BY m.lo)
        ORDER BY m.lo
        RETURNING 1
    )
    -- (Every part of a WITH that writes runs once, read or not.)
    SELECT CASE WHEN p_job IS NULL THEN to_jsonb(h)
                ELSE (SELECT engine_job_view(j, h.state, h.expires_at, h.draws) FROM job j) END
    INTO created FROM held h;
    RETURN created;
END;
$$;

-- A commit (`p_op` commit: exactly `p_amount`; commit_all: all held) or a
-- release of the API's held, unexpired reservation `p_reservation`.
-- Answers the reservation as it is after (as JSON), or NULL when the case
-- is not plain (nothing written).
CREATE FUNCTION engine_lean_settle(p_op text, p_account uuid, p_actor text, p_key_id uuid,
    p_key_hash bytea, p_authorized boolean, p_reservation uuid, p_amount bigint)
RETURNS jsonb
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    a accounts;
    at timestamptz;
    settled jsonb;
BEGIN
    a := engine_lean_account(p_account, p_authorized, p_key_id, p_key_hash);
    IF a.id IS NULL THEN
        RETURN NULL;
    END IF;
    at := clock_timestamp();
    WITH changed AS (
        -- The reservation's row lock is taken here, under the account's.
        UPDATE reservations r
        SET state = CASE WHEN p_op = 'release' THEN 'released' ELSE 'committed' END,
            committed_amount = CASE p_op WHEN 'commit' THEN p_amount
                                         WHEN 'commit_all' THEN r.amount ELSE 0 END,
            resolved_at = now()
        WHERE r.id = p_reservation AND r.account_id = p_account AND r.job_id IS NULL
          AND r.state = 'held' AND r.expires_at > now()
          AND (p_op <> 'commit' OR p_amount <= r.amount)
          -- A return of tokens may cross the threshold (an event): only
          -- without a threshold, or when nothing goes back.
          AND (a.low_balance_threshold = 0 OR p_op = 'commit_all'
               OR (p_op = 'commit' AND p_amount = r.amount))
          -- No draw's grant has lapsed (a return to it would expire).
          -- (By the primary key: a join with the draws is planned as a
          -- scan of every grant.)
          AND NOT EXISTS (SELECT 1 FROM credit_grants g
                          WHERE g.id = ANY (ARRAY(SELECT (d->>'grant_id')::uuid
                                                  FROM jsonb_array_elements(r.draws) d))
                            AND g.expires_at <= at)
        RETURNING r.*
    ), parts AS MATERIALIZED (
        SELECT x.n, CASE x.part WHEN 'commit' THEN 'commit' ELSE 'release' END AS kind,
               x.grant_id, x.amount, c.job_id
        FROM changed c
        CROSS JOIN LATERAL engine_split_draws(c.draws, c.amount, c.committed_amount) x
    ), moves AS MATERIALIZED (
        SELECT p.*, m.available AS d_available, m.reserved AS d_reserved, m.used AS d_used
        FROM parts p CROSS JOIN LATERAL engine_deltas(p.kind, p.amount, p_reservation) m
    ), grants AS (
        UPDATE credit_grants g
        SET remaining = g.remaining + t.remaining, reserved = g.reserved + t.reserved,
            consumed = g.consumed + t.consumed,
            drawable = g.remaining + t.remaining > 0
        FROM (SELECT p.grant_id, sum(x.remaining)::bigint AS remaining,
                     sum(x.reserved)::bigint AS reserved, sum(x.consumed)::bigint AS consumed
              FROM parts p
              CROSS JOIN LATERAL engine_grant_deltas(p.kind, p.amount, p_reservation) x
              WHERE p.grant_id IS NOT NULL
              GROUP BY p.grant_id) t
        WHERE g.id = t.grant_id AND g.id = ANY (ARRAY(SELECT grant_id FROM parts))
        RETURNING g.id
    ), moved AS (
        UPDATE accounts x
        SET available = x.available + s.available, reserved = x.reserved + s.reserved,
            used = x.used + s.used, active_reservations = x.active_reservations - 1,
            version = x.version + s.entries,
            balance_low = engine_is_low(x.available + s.available, x.low_balance_threshold),
            updated_at = now()
        FROM (SELECT sum(m.d_available)::bigint AS available,
                     sum(m.d_reserved)::bigint AS reserved, sum(m.d_used)::bigint AS used,
                     count(*) AS entries FROM moves m) s
        WHERE x.id = p_account AND s.entries > 0
        RETURNING x.available - s.available AS available, x.reserved - s.reserved AS reserved,
                  x.used - s.used AS used
    ), entries AS (
        INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
            used_after, reservation_id, job_id, external_ref, reason, actor, created_at, grant_id)
        SELECT p_account, m.kind, m.amount, b.available + (sum(m.d_available) OVER w)::bigint,
               b.reserved + (sum(m.d_reserved) OVER w)::bigint,
               b.used + (sum(m.d_used) OVER w)::bigint, p_reservation, m.job_id, NULL, NULL,
               p_actor, at, m.grant_id
        FROM moves m CROSS JOIN moved b
        WINDOW w AS (ORDER BY m.n)
        ORDER BY m.n
        RETURNING 1
    )
    SELECT to_jsonb(c) INTO settled FROM changed c;
    RETURN settled;
END;
$$;
