-- What makes an operation plain, written once, and the lone path.
--
-- An operation is plain when its answer is the success and no event is
-- due (68_lean.sql says why that case is worth a path of its own). The
-- rules below decide it. Both lean paths call them: the batch statement
-- (engine_lean_batch, 68_lean.sql), which decides a batch's plain prefix
-- as a set, and the lone path (engine_lean_one, below), which applies one
-- operation with statements of the size of a hand-written one. They are
-- inlined where they are called (SQL functions of one SELECT).

-- A spend (reserve, create_job) leaving the account with `p_available_after`
-- available tokens and `p_active_after` held reservations is plain when the
-- account is active, keeps at least one token (available = amount would
-- empty the account: its event), keeps a free reservation slot, does not
-- cross the low-balance threshold (its event) and makes no top-up rule
-- due (it fires in engine_record, 80_topups.sql).
CREATE FUNCTION engine_spend_plain(p_status text, p_available_after bigint,
    p_active_after bigint, p_max_active integer, p_low_threshold bigint, p_balance_low boolean,
    p_topup_threshold bigint, p_topup_armed boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_status = 'active'
       AND p_available_after >= 1
       AND (p_max_active = 0 OR p_active_after <= p_max_active)
       AND (p_low_threshold = 0
            OR engine_is_low(p_available_after, p_low_threshold) = p_balance_low)
       AND NOT engine_topup_due(p_available_after, p_topup_threshold, p_topup_armed)
$$;

-- A settlement (`p_op` commit of `p_amount`, commit_all, release) that
-- spends `p_committed` of a reservation holding `p_held`, in state
-- `p_state`, of job `p_job`, expiring at `p_expires_at`, is plain when the
-- reservation is a held, unexpired one of no job (a job's finish passes
-- NULL for its own job: NULLIF(job_id, job)), a commit takes no more
-- than is held, and nothing goes back to the account while it has a
-- low-balance threshold or a top-up rule (a return may cross the
-- threshold, or re-arm the rule).
CREATE FUNCTION engine_settle_plain(p_op text, p_amount bigint, p_committed bigint,
    p_held bigint, p_state text, p_job uuid, p_expires_at timestamptz, p_low_threshold bigint,
    p_topup_threshold bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_job IS NULL AND p_state = 'held' AND p_expires_at > now()
       AND (p_op <> 'commit' OR p_amount <= p_held)
       AND (p_low_threshold = 0 OR p_committed = p_held)
       AND (p_topup_threshold = 0 OR p_committed = p_held)
$$;

-- The outcome of a plain operation: its success.
CREATE FUNCTION engine_plain_outcome(p_op text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_op WHEN 'release' THEN 'released' WHEN 'commit' THEN 'committed'
                     WHEN 'commit_all' THEN 'committed' WHEN 'finish_job' THEN 'done'
                     ELSE 'created' END
$$;

-- What a settlement spends: a commit its amount, commit_all all that is
-- held, a release nothing.
CREATE FUNCTION engine_settle_committed(p_op text, p_amount bigint, p_held bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_op WHEN 'commit' THEN p_amount WHEN 'commit_all' THEN p_held ELSE 0 END
$$;

-- The grants of `p_account` due to lapse at `p_at` (a spend on the account
-- lapses them first: not plain).
CREATE FUNCTION engine_lapsing_grants(p_account uuid, p_at timestamptz)
RETURNS TABLE (grant_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT g.id FROM credit_grants g
    WHERE g.account_id = p_account AND g.drawable
      AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, p_at)
    LIMIT 1
$$;

-- Whether a spend's request_id is taken on its account (a replay, not
-- plain): a reserve's by a reservation of no job, a job creation's by a
-- job.
CREATE FUNCTION engine_request_taken(p_op text, p_account uuid, p_request uuid)
RETURNS TABLE (taken boolean)
LANGUAGE sql STABLE AS $$
    SELECT true FROM reservations x
    WHERE p_op = 'reserve' AND x.account_id = p_account AND x.request_id = p_request
      AND x.job_id IS NULL
    UNION ALL
    SELECT true FROM generation_jobs j
    WHERE p_op = 'create_job' AND j.account_id = p_account AND j.request_id = p_request
    LIMIT 1
$$;

-- The draws (`p_draws`, a reservation's) whose grant has expired at
-- `p_at` (a return to it would expire: not plain). By the primary key: a
-- join with the draws is planned as a scan of every grant.
CREATE FUNCTION engine_lapsed_draws(p_draws jsonb, p_at timestamptz)
RETURNS TABLE (grant_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT g.id FROM jsonb_array_elements(p_draws) d
    CROSS JOIN LATERAL (SELECT g.id FROM credit_grants g
                        WHERE g.id = (d->>'grant_id')::uuid AND g.expires_at <= p_at
                        LIMIT 1) g
    LIMIT 1
$$;

-- The draws of a spend taking the account's drawable tokens [p_from, p_to)
-- (engine_grant_pools: the draw order): one row per grant it draws from
-- (grant_id NULL: tokens no grant holds), with the start of its interval
-- (`lo`, the draw order) and the tokens it takes.
CREATE FUNCTION engine_draws(p_account uuid, p_from bigint, p_to bigint)
RETURNS TABLE (grant_id uuid, lo bigint, amount bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.grant_id, GREATEST(p_from, p.lo),
           (LEAST(p_to, p.hi) - GREATEST(p_from, p.lo))::bigint
    FROM engine_grant_pools(p_account) p
    WHERE p.lo < p_to AND p.hi > p_from
$$;

-- A verified key's last use, written once a minute at most
-- (engine_key_use_stale): the keys `p_keys` whose last use is stale have
-- it written; a key row another transaction holds is skipped, never
-- waited for. PL/pgSQL, not SQL: its callers PERFORM it, and a SQL
-- function called so is planned again at every call (pg_stat_statements
-- with track_planning showed one plan per call, 0.14 ms each); PL/pgSQL
-- keeps the statement's plan for the session.
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

-- Whether an operation of kind `p_op` goes to the lone path: a reserve,
-- job creation, commit or release alone in its batch or with one other
-- (engine_apply), and a job's finish
-- alone or in the run of finishes that ends a batch (engine_apply), unless
-- the setting token_billing.lean sends it elsewhere (off: the full
-- machinery only; batch: the batch statement for one or two operations too, and
-- finishes to the full machinery).
CREATE FUNCTION engine_lone_applies(p_op text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_op IN ('reserve', 'create_job', 'commit', 'commit_all', 'release', 'finish_job')
       AND COALESCE(current_setting('token_billing.lean', true), '') NOT IN ('off', 'batch')
$$;


-- The lone path: one plain reserve, job creation, commit, commit_all,
-- release or job finish, applied with at most three statements of the
-- size of the hand-written ones — the account's row (locked; the caller
-- may hold the lock already), what the decision reads besides (the key, a
-- replay, lapses), and the writes (the reservation, its grants, the
-- balances, the ledger entries) — plus, for a job creation, the job's
-- row; for a job's finish, the job's row (locked, fenced on the lease
-- token), its final status (engine_job_finish) and its event
-- (engine_job_finished_events); and once a minute per key, its last use.
-- The service calls it directly for a batch of one such operation
-- (src/engine/mod.rs: a statement of values, where engine_apply takes an
-- array of engine_request and answers as a set), and engine_apply sends
-- such a batch here too, each operation of a batch of two such, and the
-- run of job finishes that ends a batch (a batch statement's plan is
-- started whole for every batch: 110 nodes, where a lone operation needs a
-- tenth of them). Returns the answer's object (the
-- reservation; the job as engine_job_view shows it; for a finish
-- {job, reservation, resolved} as engine_apply_full answers it; the
-- outcome is engine_plain_outcome's), or NULL when the operation is not
-- plain (or engine_lone_applies says no, or it lacks a field): then
-- nothing was written, and the full machinery decides it
-- (engine_apply_full; the service calls it directly when
-- engine_lone_applies said yes, so the operation is not tried twice).
-- Fields as engine_apply's.
CREATE FUNCTION engine_lean_one(p_op text, p_account uuid, p_actor text, p_key_id uuid,
    p_key_hash bytea, p_authorized boolean, p_request uuid, p_amount bigint,
    p_requested_ttl integer, p_ttl integer, p_new_id uuid, p_reservation uuid, p_job uuid,
    p_hash bytea, p_kind text, p_params jsonb, p_lease_token bigint, p_status text,
    p_result jsonb, p_error jsonb, p_reason text)
RETURNS jsonb
-- (Look-ups by key only, as the batch statement: 68_lean.sql says why.)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    a accounts;
    at timestamptz;
    spends boolean := p_op IN ('reserve', 'create_job');
    job_made uuid := CASE WHEN p_op = 'create_job' THEN p_job END;
    -- A finish settles its job's reservation: a commit of its cost when
    -- it succeeded, a release when it failed (as engine_finish_job).
    finishes boolean := p_op = 'finish_job';
    settle_op text := CASE WHEN p_op <> 'finish_job' THEN p_op
                           WHEN p_status = 'succeeded' THEN 'commit' ELSE 'release' END;
    target uuid := p_reservation;
    settle_amount bigint := p_amount;
    -- What a finish's ledger entries carry (an API settlement's: neither).
    entry_job uuid := CASE WHEN p_op = 'finish_job' THEN p_job END;
    entry_reason text := CASE WHEN p_op = 'finish_job' THEN p_reason END;
    job_row generation_jobs;
    seen record;
    committed bigint;
    answer jsonb;
BEGIN
    -- Only the lone path's kinds, each with the fields it needs
    -- (engine_op_incomplete).
    IF NOT engine_lone_applies(p_op)
       OR engine_op_incomplete(p_op, p_account, p_actor, p_authorized, p_key_id, p_key_hash,
              p_request, p_amount, p_ttl, p_new_id, p_job, p_hash, p_kind, p_params,
              p_reservation, NULL, p_reason, NULL, p_lease_token, p_status, p_result, NULL)
              IS NOT FALSE THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The transaction's stamp after the account's lock (engine_now).
    at := engine_now();
    IF finishes THEN
        -- The job's row, after its account's (as engine_finish_job), if
        -- this lease still holds it.
        SELECT * INTO job_row FROM generation_jobs
        WHERE id = p_job AND account_id = p_account AND status = 'running'
          AND lease_token = p_lease_token
        FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        target := job_row.reservation_id;
        settle_amount := job_row.cost;
    END IF;
    -- What the decision reads besides the account (this statement's
    -- snapshot is taken after the lock: 68_lean.sql): the key
    -- (engine_key_may), and for a spend whether its request_id is taken or
    -- a grant lapses, for a settlement its reservation — one statement per
    -- kind, so that neither starts the other's look-ups.
    IF spends THEN
        SELECT k.may, k.valid_key, k.last_used_at,
               EXISTS (SELECT 1 FROM engine_request_taken(p_op, p_account, p_request))
               OR EXISTS (SELECT 1 FROM engine_lapsing_grants(p_account, at)) AS refused
        INTO seen
        FROM engine_key_may(p_authorized, p_key_id, p_key_hash, p_account) k;
    ELSE
        SELECT k.may, k.valid_key, k.last_used_at, t.*
        INTO seen
        FROM engine_key_may(p_authorized, p_key_id, p_key_hash, p_account) k
        LEFT JOIN LATERAL (SELECT x.id, x.amount, x.draws, x.state, x.expires_at, x.job_id,
                                  EXISTS (SELECT 1 FROM engine_lapsed_draws(x.draws, at)) AS lapsed
                           FROM reservations x
                           WHERE x.id = target AND x.account_id = p_account
                           LIMIT 1) t ON true;
    END IF;
    IF seen.may IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    IF spends THEN
        IF seen.refused
           OR NOT engine_spend_plain(a.status, a.available - p_amount, a.active_reservations + 1,
                                     a.max_active_reservations, a.low_balance_threshold,
                                     a.balance_low, a.topup_threshold, a.topup_armed) THEN
            RETURN NULL;
        END IF;
        IF job_made IS NOT NULL THEN
            -- The job first (its reservation_id's foreign key is checked
            -- at commit).
            INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params,
                cost, reservation_id)
            VALUES (job_made, p_account, p_request, p_hash, p_kind, p_params, p_amount, p_new_id)
            RETURNING * INTO job_row;
        END IF;
        WITH draws AS MATERIALIZED (
            SELECT d.*, x.available, x.reserved, x.used
            FROM engine_draws(p_account, 0, p_amount) d
            CROSS JOIN LATERAL engine_deltas('reserve', d.amount, p_new_id) x
        ), grants AS (
            UPDATE credit_grants g
            SET remaining = g.remaining + x.remaining, reserved = g.reserved + x.reserved,
                consumed = g.consumed + x.consumed, drawable = g.remaining + x.remaining > 0
            FROM draws d CROSS JOIN LATERAL engine_grant_deltas('reserve', d.amount, p_new_id) x
            WHERE g.id = d.grant_id AND g.id = ANY (ARRAY(SELECT grant_id FROM draws))
        ), made AS (
            INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds,
                state, expires_at, job_id, draws)
            SELECT p_new_id, p_account, p_request, p_amount, p_requested_ttl, 'held',
                   now() + make_interval(secs => p_ttl), job_made,
                   (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)
                                     ORDER BY d.lo) FROM draws d)
            RETURNING *
        ), moved AS (
            UPDATE accounts x
            SET available = x.available + s.available, reserved = x.reserved + s.reserved,
                used = x.used + s.used, active_reservations = x.active_reservations + 1,
                version = x.version + s.entries,
                balance_low = engine_is_low(x.available + s.available, x.low_balance_threshold),
                updated_at = now()
            FROM (SELECT sum(d.available)::bigint AS available,
                         sum(d.reserved)::bigint AS reserved, sum(d.used)::bigint AS used,
                         count(*) AS entries FROM draws d) s
            WHERE x.id = p_account
        ), entries AS (
            INSERT INTO ledger_entries (account_id, kind, amount, available_after,
                reserved_after, used_after, reservation_id, job_id, external_ref, reason, actor,
                created_at, grant_id)
            SELECT p_account, 'reserve', d.amount,
                   a.available + (sum(d.available) OVER w)::bigint,
                   a.reserved + (sum(d.reserved) OVER w)::bigint,
                   a.used + (sum(d.used) OVER w)::bigint,
                   p_new_id, job_made, NULL, NULL, p_actor, at, d.grant_id
            FROM draws d
            WINDOW w AS (ORDER BY d.lo)
            ORDER BY d.lo
        )
        SELECT CASE WHEN job_made IS NULL THEN to_jsonb(h)
                    ELSE engine_job_view(job_row, h.state, h.expires_at, h.draws) END
        INTO answer FROM made h;
    ELSE
        IF seen.id IS NULL OR seen.lapsed THEN
            RETURN NULL;
        END IF;
        committed := engine_settle_committed(settle_op, settle_amount, seen.amount);
        IF NOT engine_settle_plain(settle_op, settle_amount, committed, seen.amount, seen.state,
                                   NULLIF(seen.job_id, entry_job), seen.expires_at,
                                   a.low_balance_threshold, a.topup_threshold) THEN
            RETURN NULL;
        END IF;
        WITH moves AS MATERIALIZED (
            SELECT s.n, s.grant_id, s.amount, m.kind, x.available, x.reserved, x.used
            FROM engine_split_draws(seen.draws, seen.amount, committed) s
            CROSS JOIN LATERAL (SELECT CASE s.part WHEN 'commit' THEN 'commit'
                                                   ELSE 'release' END AS kind) m
            CROSS JOIN LATERAL engine_deltas(m.kind, s.amount, target) x
        ), grants AS (
            UPDATE credit_grants g
            SET remaining = g.remaining + t.remaining, reserved = g.reserved + t.reserved,
                consumed = g.consumed + t.consumed, drawable = g.remaining + t.remaining > 0
            FROM (SELECT m.grant_id, sum(x.remaining)::bigint AS remaining,
                         sum(x.reserved)::bigint AS reserved, sum(x.consumed)::bigint AS consumed
                  FROM moves m
                  CROSS JOIN LATERAL engine_grant_deltas(m.kind, m.amount, target) x
                  WHERE m.grant_id IS NOT NULL
                  GROUP BY m.grant_id) t
            WHERE g.id = t.grant_id AND g.id = ANY (ARRAY(SELECT grant_id FROM moves))
        ), settled AS (
            -- The reservation's row lock is taken here, under the account's.
            UPDATE reservations x
            SET state = CASE WHEN settle_op = 'release' THEN 'released' ELSE 'committed' END,
                committed_amount = committed, resolved_at = now()
            WHERE x.id = target
            RETURNING to_jsonb(x) AS answer
        ), moved AS (
            UPDATE accounts x
            SET available = x.available + s.available, reserved = x.reserved + s.reserved,
                used = x.used + s.used, active_reservations = x.active_reservations - 1,
                version = x.version + s.entries,
                balance_low = engine_is_low(x.available + s.available, x.low_balance_threshold),
                updated_at = now()
            FROM (SELECT COALESCE(sum(m.available), 0)::bigint AS available,
                         COALESCE(sum(m.reserved), 0)::bigint AS reserved,
                         COALESCE(sum(m.used), 0)::bigint AS used,
                         count(*) AS entries FROM moves m) s
            WHERE x.id = p_account
        ), entries AS (
            INSERT INTO ledger_entries (account_id, kind, amount, available_after,
                reserved_after, used_after, reservation_id, job_id, external_ref, reason, actor,
                created_at, grant_id)
            SELECT p_account, m.kind, m.amount,
                   a.available + (sum(m.available) OVER w)::bigint,
                   a.reserved + (sum(m.reserved) OVER w)::bigint,
                   a.used + (sum(m.used) OVER w)::bigint,
                   target, entry_job, NULL, entry_reason, p_actor, at, m.grant_id
            FROM moves m
            WINDOW w AS (ORDER BY m.n)
            ORDER BY m.n
        )
        SELECT s.answer INTO answer FROM settled s;
        IF finishes THEN
            job_row := engine_job_finish(p_job, p_status, p_result, p_error, at, false);
            PERFORM engine_job_finished_events(ARRAY[p_job]);
            answer := jsonb_build_object('job', to_jsonb(job_row) - 'request_hash',
                                         'reservation', answer, 'resolved', true);
        END IF;
    END IF;
    IF seen.valid_key IS NOT NULL AND engine_key_use_stale(seen.last_used_at) THEN
        PERFORM engine_touch_keys(ARRAY[seen.valid_key]);
    END IF;
    RETURN answer;
END;
$$;

-- engine_lean_one of one engine_request (engine_apply's lone loops; the
-- service calls engine_lean_one with the values directly). Inlined where
-- it is called.
CREATE FUNCTION engine_lean_one_of(o engine_request) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT engine_lean_one(o.op, o.account, o.actor, o.key_id, o.key_hash, o.authorized,
        o.request, o.amount, o.requested_ttl, o.ttl, o.new_id, o.reservation, o.job, o.hash,
        o.kind, o.params, o.lease_token, o.status, o.result, o.error, o.reason)
$$;
