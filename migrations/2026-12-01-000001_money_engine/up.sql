-- The money engine: every token movement is decided and written here, once.
--
-- Each rule has one function:
--   engine_move          the arithmetic of every movement kind on the account
--                        row, and the one ledger INSERT (balances after it);
--   engine_reserve       who may spend: account active, enough available,
--                        under the active-reservation limit; replays;
--   engine_reservation_for  who may touch a reservation (its account, its
--                        owner: the API or the job);
--   engine_resolve       when a reservation may leave `held` (commit, partial
--                        commit, release, expire) and the settle arithmetic;
--   engine_extend        when a held reservation may be extended;
--   engine_create_job    a job row with its reservation (engine_reserve);
--   engine_finish_job    a fenced job finish (engine_resolve);
--   engine_credit,       top-ups and signed adjustments (engine_move);
--   engine_adjust
-- and every caller — a lone HTTP request, a coalesced batch, a worker, the
-- reaper — reaches them through the entry points at the end of this file,
-- which lock the accounts they touch in id order first. Rule functions assume
-- that lock is held: the account row is always locked before any
-- reservation or job row, by every path, so no two transactions can wait on
-- each other crosswise.
--
-- Every decision returns an outcome (text) decided by the same code that
-- checked it; refusals change nothing.

-- The authorisation of a presented key to spend on an account. `key` is
-- {"bootstrap": true} (verified by the service against ADMIN_API_KEY) or
-- {"id": uuid, "secret_hash": hex}. Outcomes: ok, unauthorized (unknown,
-- wrong secret, revoked, expired), forbidden (finance), not_found (a kiosk
-- key of another account: another account's ids are 404, not 403).
-- A valid key's last_used_at is brought up to date when it is older than a
-- minute: at most one write a minute per key (hence not STABLE).
-- expires_at and last_used_at are added by migration
-- 2026-12-01-000020_key_expiry_and_audit (PL/pgSQL is checked at call time).
CREATE FUNCTION engine_authorize_spend(p_key jsonb, p_account uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    found_scope text;
    found_account uuid;
    found_last_used timestamptz;
BEGIN
    IF (p_key->>'bootstrap')::boolean IS TRUE THEN
        RETURN 'ok';
    END IF;
    SELECT scope, account_id, last_used_at INTO found_scope, found_account, found_last_used
    FROM api_keys
    WHERE id = (p_key->>'id')::uuid
      AND secret_hash = decode(p_key->>'secret_hash', 'hex')
      AND revoked_at IS NULL
      AND (expires_at IS NULL OR expires_at > now());
    IF NOT FOUND THEN
        RETURN 'unauthorized';
    END IF;
    -- SKIP LOCKED: a key row locked by another transaction is being
    -- touched (or revoked) there; never wait for it, never deadlock on it.
    IF found_last_used IS NULL OR found_last_used < now() - interval '1 minute' THEN
        UPDATE api_keys SET last_used_at = now()
        WHERE id = (SELECT id FROM api_keys
                    WHERE id = (p_key->>'id')::uuid
                      AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
                    FOR UPDATE SKIP LOCKED);
    END IF;
    IF found_scope = 'admin' THEN
        RETURN 'ok';
    ELSIF found_scope = 'kiosk' AND found_account = p_account THEN
        RETURN 'ok';
    ELSIF found_scope = 'kiosk' THEN
        RETURN 'not_found';
    END IF;
    RETURN 'forbidden';
END;
$$;

-- The arithmetic of every movement, and the one place a ledger entry is
-- written. `p_active_delta` moves the held-reservation count (+1 on a
-- reserve, -1 on the last entry of a resolution). Returns the entry.
CREATE FUNCTION engine_move(
    p_account uuid, p_kind text, p_amount bigint, p_active_delta integer,
    p_reservation uuid, p_job uuid, p_external_ref text, p_reason text, p_actor text,
    p_at timestamptz
) RETURNS ledger_entries
LANGUAGE plpgsql AS $$
DECLARE
    d_available bigint;
    d_reserved bigint;
    d_used bigint;
    after accounts;
    entry ledger_entries;
BEGIN
    CASE p_kind
        WHEN 'credit', 'adjustment' THEN
            d_available := p_amount; d_reserved := 0; d_used := 0;
        WHEN 'reserve' THEN
            d_available := -p_amount; d_reserved := p_amount; d_used := 0;
        WHEN 'commit' THEN
            d_available := 0; d_reserved := -p_amount; d_used := p_amount;
        WHEN 'release', 'expire' THEN
            d_available := p_amount; d_reserved := -p_amount; d_used := 0;
    END CASE;
    UPDATE accounts
    SET available = available + d_available,
        reserved = reserved + d_reserved,
        used = used + d_used,
        credited = credited + CASE WHEN p_kind = 'credit' THEN p_amount ELSE 0 END,
        adjusted = adjusted + CASE WHEN p_kind = 'adjustment' THEN p_amount ELSE 0 END,
        active_reservations = active_reservations + p_active_delta,
        version = version + 1,
        updated_at = now()
    WHERE id = p_account
    RETURNING * INTO after;
    INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
        used_after, reservation_id, job_id, external_ref, reason, actor, created_at)
    VALUES (p_account, p_kind, p_amount, after.available, after.reserved, after.used,
        p_reservation, p_job, p_external_ref, p_reason, p_actor, p_at)
    RETURNING * INTO entry;
    RETURN entry;
END;
$$;

-- Who may spend. A reservation of `p_amount` on `p_account` for the API
-- (`p_job` NULL: idempotent on request_id) or for a job (`p_job`: the job
-- row is the idempotency record). Outcomes: created, replayed,
-- idempotency_key_reused, not_found, account_suspended,
-- insufficient_tokens {available, reserved}, too_many_active_reservations
-- {limit}. The checks are made in this order.
CREATE FUNCTION engine_reserve(
    p_account uuid, p_request uuid, p_amount bigint, p_requested_ttl integer, p_ttl integer,
    p_job uuid, p_reservation uuid, p_actor text,
    OUT outcome text, OUT detail jsonb, OUT reservation reservations
)
LANGUAGE plpgsql AS $$
DECLARE
    account accounts;
BEGIN
    SELECT * INTO account FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    IF p_job IS NULL THEN
        SELECT * INTO reservation FROM reservations
        WHERE account_id = p_account AND request_id = p_request AND job_id IS NULL;
        IF FOUND THEN
            IF reservation.amount = p_amount
               AND reservation.requested_ttl_seconds IS NOT DISTINCT FROM p_requested_ttl THEN
                outcome := 'replayed';
            ELSE
                outcome := 'idempotency_key_reused'; reservation := NULL;
            END IF;
            RETURN;
        END IF;
    END IF;
    IF account.status <> 'active' THEN
        outcome := 'account_suspended';
    ELSIF account.available < p_amount THEN
        outcome := 'insufficient_tokens';
        detail := jsonb_build_object('available', account.available, 'reserved', account.reserved);
    ELSIF account.max_active_reservations > 0
          AND account.active_reservations >= account.max_active_reservations THEN
        outcome := 'too_many_active_reservations';
        detail := jsonb_build_object('limit', account.max_active_reservations);
    ELSE
        INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds,
            state, expires_at, job_id)
        VALUES (p_reservation, p_account, p_request, p_amount, p_requested_ttl,
            'held', now() + make_interval(secs => p_ttl), p_job)
        RETURNING * INTO reservation;
        PERFORM engine_move(p_account, 'reserve', p_amount, 1, reservation.id, p_job,
            NULL, NULL, p_actor, clock_timestamp());
        outcome := 'created';
    END IF;
END;
$$;

-- Who may touch a reservation: it must be this account's, and its owner's
-- (`p_job`: the job acting; NULL for the API, which may not touch a job's
-- reservation). Locks the row. Outcomes: ok, not_found, owned_by_job.
CREATE FUNCTION engine_reservation_for(
    p_account uuid, p_reservation uuid, p_job uuid,
    OUT outcome text, OUT detail jsonb, OUT reservation reservations
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT * INTO reservation FROM reservations
    WHERE id = p_reservation AND account_id = p_account FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "reservation"}';
    ELSIF reservation.job_id IS DISTINCT FROM p_job THEN
        outcome := 'owned_by_job';
    ELSE
        outcome := 'ok';
    END IF;
END;
$$;

-- When a reservation may leave `held`, and the settle arithmetic.
-- `p_action`: commit (`p_amount` tokens, NULL = all held; the rest goes
-- back to available), release, or expire. `p_job` is the job acting (its
-- worker, or the reaper on its behalf); NULL for the API, which may not
-- touch a job's reservation. A commit or release of a reservation past
-- its expiry expires it instead (`reason` expired_on_access): expiry
-- dominates. Outcomes: committed, released, expired, replayed (the same
-- resolution again), not_found, owned_by_job, not_held {state},
-- amount_exceeds_held {held}, not_due (an expire before expires_at);
-- `resolved` is true when this call moved the reservation out of `held`
-- (also when it expired it on access).
CREATE FUNCTION engine_resolve(
    p_account uuid, p_reservation uuid, p_action text, p_amount bigint, p_job uuid,
    p_reason text, p_actor text, p_at timestamptz,
    OUT outcome text, OUT detail jsonb, OUT reservation reservations, OUT resolved boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    found record;
    action text := p_action;
    reason text := p_reason;
    committed bigint;
    returned bigint;
BEGIN
    resolved := false;
    SELECT * INTO found FROM engine_reservation_for(p_account, p_reservation, p_job);
    reservation := found.reservation;
    IF found.outcome <> 'ok' THEN
        outcome := found.outcome; detail := found.detail;
        RETURN;
    END IF;
    IF reservation.state <> 'held' THEN
        IF (action = 'commit' AND reservation.state = 'committed'
                AND reservation.committed_amount = COALESCE(p_amount, reservation.amount))
           OR (action = 'release' AND reservation.state = 'released') THEN
            outcome := 'replayed';
        ELSE
            outcome := 'not_held';
        END IF;
        detail := jsonb_build_object('state', reservation.state);
        RETURN;
    END IF;
    IF action = 'commit' AND p_amount > reservation.amount THEN
        outcome := 'amount_exceeds_held';
        detail := jsonb_build_object('held', reservation.amount, 'amount', p_amount);
        RETURN;
    END IF;
    IF action = 'expire' AND reservation.expires_at > now() THEN
        outcome := 'not_due';
        RETURN;
    END IF;
    IF action <> 'expire' AND reservation.expires_at <= now() THEN
        action := 'expire'; reason := 'expired_on_access';
    END IF;

    committed := CASE WHEN action = 'commit' THEN COALESCE(p_amount, reservation.amount) ELSE 0 END;
    returned := reservation.amount - committed;
    UPDATE reservations
    SET state = CASE action WHEN 'commit' THEN 'committed'
                            WHEN 'release' THEN 'released' ELSE 'expired' END,
        committed_amount = committed,
        resolved_at = now()
    WHERE id = reservation.id
    RETURNING * INTO reservation;
    resolved := true;
    -- The commit entry first, then the return of the rest, so a replay of
    -- the entries passes through both balances; the held count drops on
    -- the last entry.
    IF committed > 0 THEN
        PERFORM engine_move(p_account, 'commit', committed, CASE WHEN returned = 0 THEN -1 ELSE 0 END,
            reservation.id, reservation.job_id, NULL, reason, p_actor, p_at);
    END IF;
    IF returned > 0 THEN
        PERFORM engine_move(p_account, CASE action WHEN 'expire' THEN 'expire' ELSE 'release' END,
            returned, -1, reservation.id, reservation.job_id, NULL, reason, p_actor, p_at);
    END IF;
    IF p_action <> action THEN
        outcome := 'not_held';
        detail := jsonb_build_object('state', reservation.state, 'resolved', true);
    ELSE
        outcome := reservation.state;
    END IF;
END;
$$;

-- A heartbeat: a held, unexpired reservation now expires `p_seconds` from
-- now (for a job, never earlier than it already did). A reservation past
-- its expiry is expired now. Outcomes: extended, not_found, owned_by_job,
-- not_held {state}.
CREATE FUNCTION engine_extend(
    p_account uuid, p_reservation uuid, p_seconds double precision, p_job uuid, p_actor text,
    OUT outcome text, OUT detail jsonb, OUT reservation reservations
)
LANGUAGE plpgsql AS $$
DECLARE
    found record;
    expired record;
BEGIN
    SELECT * INTO found FROM engine_reservation_for(p_account, p_reservation, p_job);
    reservation := found.reservation;
    IF found.outcome <> 'ok' THEN
        outcome := found.outcome; detail := found.detail;
        RETURN;
    ELSIF reservation.state = 'held' AND reservation.expires_at <= now() THEN
        -- Expiry dominates: the same rule as a commit or release.
        SELECT * INTO expired FROM engine_resolve(p_account, p_reservation, 'release', NULL, p_job,
            NULL, p_actor, clock_timestamp());
        reservation := expired.reservation;
    END IF;
    IF reservation.state <> 'held' THEN
        outcome := 'not_held';
        detail := jsonb_build_object('state', reservation.state);
        RETURN;
    END IF;
    UPDATE reservations
    SET expires_at = CASE WHEN p_job IS NULL THEN now() + make_interval(secs => p_seconds)
                          ELSE GREATEST(expires_at, now() + make_interval(secs => p_seconds)) END
    WHERE id = p_reservation
    RETURNING * INTO reservation;
    outcome := 'extended';
END;
$$;

-- A job's representation for the API: the row (without its hash) and its
-- reservation's state and expiry.
CREATE FUNCTION engine_job_json(p_job generation_jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(p_job) - 'request_hash'
        || jsonb_build_object('reservation_state', r.state, 'reservation_expires_at', r.expires_at)
    FROM reservations r WHERE r.id = p_job.reservation_id
$$;

-- A generation job: the job row and the reservation of its cost, or the
-- existing job for this request_id (replayed, or idempotency_key_reused when
-- the canonical request differs). Refusals are engine_reserve's.
CREATE FUNCTION engine_create_job(
    p_account uuid, p_request uuid, p_job uuid, p_reservation uuid, p_hash bytea, p_kind text,
    p_params jsonb, p_cost bigint, p_ttl integer, p_actor text,
    OUT outcome text, OUT detail jsonb, OUT job generation_jobs
)
LANGUAGE plpgsql AS $$
DECLARE
    reserved record;
BEGIN
    PERFORM 1 FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs WHERE account_id = p_account AND request_id = p_request;
    IF FOUND THEN
        outcome := CASE WHEN job.request_hash = p_hash THEN 'replayed' ELSE 'idempotency_key_reused' END;
        RETURN;
    END IF;
    SELECT * INTO reserved FROM engine_reserve(p_account, p_request, p_cost, NULL, p_ttl, p_job,
        p_reservation, p_actor);
    outcome := reserved.outcome; detail := reserved.detail;
    IF outcome <> 'created' THEN
        RETURN;
    END IF;
    INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
        reservation_id)
    VALUES (p_job, p_account, p_request, p_hash, p_kind, p_params, p_cost, p_reservation)
    RETURNING * INTO job;
END;
$$;

-- A top-up, idempotent on external_ref. Outcomes: created, replayed,
-- idempotency_key_reused, not_found. A created credit writes its audit
-- event (credit.created; `p_request_id` is the HTTP request's id, if any);
-- a replay or a refusal writes none. audit_events is created by migration
-- 2026-12-01-000020_key_expiry_and_audit.
CREATE FUNCTION engine_credit(
    p_account uuid, p_credit uuid, p_amount bigint, p_external_ref text, p_note text, p_actor text,
    p_request_id text,
    OUT outcome text, OUT detail jsonb, OUT credit credits, OUT entry ledger_entries
)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    INSERT INTO credits (id, account_id, amount, external_ref, note, actor)
    VALUES (p_credit, p_account, p_amount, p_external_ref, p_note, p_actor)
    ON CONFLICT (external_ref) DO NOTHING
    RETURNING * INTO credit;
    IF FOUND THEN
        entry := engine_move(p_account, 'credit', p_amount, 0, NULL, NULL, p_external_ref, NULL,
            p_actor, clock_timestamp());
        INSERT INTO audit_events (actor, action, target, before, after, request_id)
        VALUES (p_actor, 'credit.created', 'account:' || p_account, NULL,
            jsonb_build_object('credit_id', credit.id, 'amount', p_amount,
                'external_ref', p_external_ref, 'note', p_note,
                'available', entry.available_after, 'reserved', entry.reserved_after,
                'used', entry.used_after),
            p_request_id);
        outcome := 'created';
        RETURN;
    END IF;
    SELECT * INTO credit FROM credits WHERE external_ref = p_external_ref;
    IF credit.account_id = p_account AND credit.amount = p_amount
       AND credit.note IS NOT DISTINCT FROM p_note THEN
        SELECT * INTO entry FROM ledger_entries
        WHERE external_ref = p_external_ref AND kind = 'credit';
        outcome := 'replayed';
    ELSE
        outcome := 'idempotency_key_reused'; credit := NULL;
    END IF;
END;
$$;

-- A signed adjustment, idempotent on external_ref; never drives available
-- below zero (insufficient_tokens {available, reserved}, nothing recorded).
-- A created adjustment writes its audit event (adjustment.created), like
-- engine_credit.
CREATE FUNCTION engine_adjust(
    p_account uuid, p_adjustment uuid, p_amount bigint, p_reason text, p_external_ref text,
    p_actor text, p_request_id text,
    OUT outcome text, OUT detail jsonb, OUT adjustment adjustments, OUT entry ledger_entries
)
LANGUAGE plpgsql AS $$
DECLARE
    account accounts;
BEGIN
    SELECT * INTO account FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    SELECT * INTO adjustment FROM adjustments WHERE external_ref = p_external_ref;
    IF NOT FOUND THEN
        IF account.available + p_amount < 0 THEN
            outcome := 'insufficient_tokens';
            detail := jsonb_build_object('available', account.available, 'reserved', account.reserved);
            RETURN;
        END IF;
        INSERT INTO adjustments (id, account_id, amount, reason, external_ref, actor)
        VALUES (p_adjustment, p_account, p_amount, p_reason, p_external_ref, p_actor)
        ON CONFLICT (external_ref) DO NOTHING
        RETURNING * INTO adjustment;
        IF FOUND THEN
            entry := engine_move(p_account, 'adjustment', p_amount, 0, NULL, NULL, p_external_ref,
                p_reason, p_actor, clock_timestamp());
            INSERT INTO audit_events (actor, action, target, before, after, request_id)
            VALUES (p_actor, 'adjustment.created', 'account:' || p_account, NULL,
                jsonb_build_object('adjustment_id', adjustment.id, 'amount', p_amount,
                    'reason', p_reason, 'external_ref', p_external_ref,
                    'available', entry.available_after, 'reserved', entry.reserved_after,
                    'used', entry.used_after),
                p_request_id);
            outcome := 'created';
            RETURN;
        END IF;
        -- Taken meanwhile by an adjustment of another account.
        SELECT * INTO adjustment FROM adjustments WHERE external_ref = p_external_ref;
    END IF;
    IF adjustment.account_id = p_account AND adjustment.amount = p_amount
       AND adjustment.reason = p_reason THEN
        SELECT * INTO entry FROM ledger_entries
        WHERE external_ref = p_external_ref AND kind = 'adjustment';
        outcome := 'replayed';
    ELSE
        outcome := 'idempotency_key_reused'; adjustment := NULL;
    END IF;
END;
$$;

-- A fenced job finish. `p_fence` says which claim may finish it:
--   {"lease_token": n}  the worker holding that lease (job running);
--   {"exhausted": max}  the reaper: running, lease expired, attempts >= max,
--                       never submitted to the provider.
-- Success commits the cost; failure releases it (`p_reason`). A job whose
-- reservation is no longer held (expired meanwhile: engine_resolve expires
-- it on access) cannot succeed without a charge: it fails with
-- reservation_expired. The job's finished_at is its ledger entries'
-- created_at: one movement, one timestamp. Outcomes: done, lease_lost,
-- reservation_lost; `resolved` and `reservation` say what happened to the
-- tokens.
CREATE FUNCTION engine_finish_job(
    p_job uuid, p_fence jsonb, p_status text, p_result jsonb, p_error jsonb, p_reason text,
    p_actor text,
    OUT outcome text, OUT job generation_jobs, OUT reservation reservations, OUT resolved boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
    settled record;
    final_status text := p_status;
    final_error jsonb := p_error;
BEGIN
    resolved := false;
    SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = job.account_id FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs
    WHERE id = p_job AND status = 'running'
      AND CASE WHEN p_fence ? 'lease_token' THEN lease_token = (p_fence->>'lease_token')::bigint
               ELSE lease_expires_at < now() AND attempts >= (p_fence->>'exhausted')::integer
                    AND provider_job_id IS NULL END
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    at := clock_timestamp();
    SELECT * INTO settled FROM engine_resolve(job.account_id, job.reservation_id,
        CASE p_status WHEN 'succeeded' THEN 'commit' ELSE 'release' END, job.cost, job.id,
        p_reason, p_actor, at);
    reservation := settled.reservation;
    resolved := settled.resolved;
    outcome := 'done';
    IF p_status = 'succeeded' AND settled.outcome <> 'committed' THEN
        final_status := 'failed';
        final_error := jsonb_build_object('code', 'reservation_expired',
            'message', 'the job''s reservation expired before it finished');
        outcome := 'reservation_lost';
    END IF;
    UPDATE generation_jobs
    SET status = final_status,
        result = CASE WHEN final_status = 'succeeded' THEN p_result END,
        error = final_error,
        finished_at = at, updated_at = now(), lease_expires_at = NULL,
        -- The reaper fences off a worker that may still hold the job.
        lease_token = lease_token + CASE WHEN p_fence ? 'lease_token' THEN 0 ELSE 1 END
    WHERE id = p_job
    RETURNING * INTO job;
END;
$$;

-- Entry point for every spending request of the API: a batch of operations
-- on any accounts, applied in order as if one by one, in one statement (and
-- so one transaction and one WAL flush). Accounts are locked in id order
-- first. Each op is a JSON object:
--   {"op": "reserve", "account", "key", "actor", "request_id", "amount",
--    "requested_ttl", "ttl", "reservation_id"}
--   {"op": "commit" | "release", "account", "key", "actor", "reservation_id",
--    "amount"?}
--   {"op": "extend", "account", "key", "actor", "reservation_id", "ttl"}
--   {"op": "create_job", "account", "key", "actor", "request_id", "job_id",
--    "reservation_id", "hash" (hex), "kind", "params", "cost", "ttl"}
--   {"op": "credit", "account", "actor", "credit_id", "amount",
--    "external_ref", "note"?}
--   {"op": "adjust", "account", "actor", "adjustment_id", "amount", "reason",
--    "external_ref"}
-- Credits and adjustments may carry "http_request_id" (the audit event's
-- request_id).
-- `key` (spending ops) is verified here (engine_authorize_spend); credits and
-- adjustments are authorised by the caller (admin only). Returns one row per
-- op, in order: the outcome, its detail and the object (JSON).
CREATE FUNCTION engine_apply(p_ops jsonb)
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    op jsonb;
    acct uuid;
    authorized text;
    r record;
BEGIN
    -- An array, so the accounts are found by index whatever the plan.
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT DISTINCT (o->>'account')::uuid FROM jsonb_array_elements(p_ops) o))
    ORDER BY id FOR NO KEY UPDATE;
    op_position := 0;
    FOR op IN SELECT value FROM jsonb_array_elements(p_ops) LOOP
        op_position := op_position + 1;
        acct := (op->>'account')::uuid;
        detail := NULL; object := NULL;
        IF op ? 'key' THEN
            authorized := engine_authorize_spend(op->'key', acct);
            IF authorized <> 'ok' THEN
                outcome := authorized;
                IF authorized = 'not_found' THEN detail := '{"what": "account"}'; END IF;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        CASE op->>'op'
        WHEN 'reserve' THEN
            SELECT * INTO r FROM engine_reserve(acct, (op->>'request_id')::uuid,
                (op->>'amount')::bigint, (op->>'requested_ttl')::integer, (op->>'ttl')::integer,
                NULL, (op->>'reservation_id')::uuid, op->>'actor');
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.reservation).id IS NOT NULL THEN to_jsonb(r.reservation) END;
        WHEN 'commit', 'release' THEN
            SELECT * INTO r FROM engine_resolve(acct, (op->>'reservation_id')::uuid, op->>'op',
                (op->>'amount')::bigint, NULL, NULL, op->>'actor', clock_timestamp());
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.reservation).id IS NOT NULL THEN to_jsonb(r.reservation) END;
        WHEN 'extend' THEN
            SELECT * INTO r FROM engine_extend(acct, (op->>'reservation_id')::uuid,
                (op->>'ttl')::double precision, NULL, op->>'actor');
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.reservation).id IS NOT NULL THEN to_jsonb(r.reservation) END;
        WHEN 'create_job' THEN
            SELECT * INTO r FROM engine_create_job(acct, (op->>'request_id')::uuid,
                (op->>'job_id')::uuid, (op->>'reservation_id')::uuid, decode(op->>'hash', 'hex'),
                op->>'kind', op->'params', (op->>'cost')::bigint, (op->>'ttl')::integer,
                op->>'actor');
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.job).id IS NOT NULL THEN engine_job_json(r.job) END;
        WHEN 'credit' THEN
            SELECT * INTO r FROM engine_credit(acct, (op->>'credit_id')::uuid,
                (op->>'amount')::bigint, op->>'external_ref', op->>'note', op->>'actor',
                op->>'http_request_id');
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.credit).id IS NOT NULL
                           THEN jsonb_build_object('credit', to_jsonb(r.credit), 'entry', to_jsonb(r.entry)) END;
        WHEN 'adjust' THEN
            SELECT * INTO r FROM engine_adjust(acct, (op->>'adjustment_id')::uuid,
                (op->>'amount')::bigint, op->>'reason', op->>'external_ref', op->>'actor',
                op->>'http_request_id');
            outcome := r.outcome; detail := r.detail;
            object := CASE WHEN (r.adjustment).id IS NOT NULL
                           THEN jsonb_build_object('adjustment', to_jsonb(r.adjustment), 'entry', to_jsonb(r.entry)) END;
        ELSE
            RAISE EXCEPTION 'engine_apply: unknown op %', op->>'op';
        END CASE;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Entry point of the reaper's first step: up to `p_limit` held reservations
-- past their expiry → expired (ledger `expire`, reason `expired`), their
-- unfinished jobs → failed (reservation_expired). Accounts locked in id
-- order. One row per reservation this call expired.
CREATE FUNCTION engine_expire_due(p_limit integer)
RETURNS TABLE (reservation_id uuid, amount bigint, job_failed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    due_ids uuid[];
    due_accounts uuid[];
    due_jobs uuid[];
    r record;
BEGIN
    SELECT array_agg(id ORDER BY account_id, id), array_agg(account_id ORDER BY account_id, id),
           array_agg(job_id ORDER BY account_id, id)
    INTO due_ids, due_accounts, due_jobs
    FROM (SELECT id, account_id, job_id FROM reservations
          WHERE state = 'held' AND expires_at <= now()
          ORDER BY account_id, id LIMIT p_limit) due;
    PERFORM 1 FROM accounts WHERE id = ANY(due_accounts) ORDER BY id FOR NO KEY UPDATE;
    FOR i IN 1 .. COALESCE(array_length(due_ids, 1), 0) LOOP
        SELECT * INTO r FROM engine_resolve(due_accounts[i], due_ids[i], 'expire', NULL,
            due_jobs[i], 'expired', 'system', clock_timestamp());
        CONTINUE WHEN r.outcome <> 'expired';
        reservation_id := due_ids[i];
        amount := (r.reservation).amount;
        job_failed := false;
        IF due_jobs[i] IS NOT NULL THEN
            -- Bumping lease_token fences off a worker that may still hold it.
            UPDATE generation_jobs
            SET status = 'failed', finished_at = now(), updated_at = now(), lease_expires_at = NULL,
                lease_token = lease_token + 1,
                error = jsonb_build_object('code', 'reservation_expired',
                                           'message', 'the job''s reservation expired')
            WHERE id = due_jobs[i] AND status IN ('queued', 'running');
            job_failed := FOUND;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Entry point of the reaper's fix-up: a finished job whose reservation is
-- still held — succeeded → commit, failed → release — reason `fixup`.
-- Outcome: committed, released, or what engine_resolve refused.
CREATE FUNCTION engine_fixup(p_job uuid, OUT outcome text, OUT amount bigint)
LANGUAGE plpgsql AS $$
DECLARE
    job generation_jobs;
    r record;
BEGIN
    SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    PERFORM 1 FROM accounts WHERE id = job.account_id FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs WHERE id = p_job AND status IN ('succeeded', 'failed');
    IF NOT FOUND THEN
        outcome := 'not_finished';
        RETURN;
    END IF;
    SELECT * INTO r FROM engine_resolve(job.account_id, job.reservation_id,
        CASE job.status WHEN 'succeeded' THEN 'commit' ELSE 'release' END, job.cost, job.id,
        'fixup', 'system', clock_timestamp());
    outcome := r.outcome;
    amount := job.cost;
END;
$$;

-- Entry point of the worker's heartbeat and retry: extends the job's
-- reservation (engine_extend) and then, fenced on the lease, updates the
-- job: `p_requeue_after` NULL extends the lease by `p_lease_seconds`;
-- otherwise the job goes back to the queue for that many seconds, with
-- `p_error` recorded. Outcomes: done, lease_lost, reservation_lost.
CREATE FUNCTION engine_job_heartbeat(
    p_job uuid, p_lease_token bigint, p_lease_seconds integer, p_reservation_seconds double precision,
    p_requeue_after double precision, p_error jsonb,
    OUT outcome text
)
LANGUAGE plpgsql AS $$
DECLARE
    job generation_jobs;
    r record;
BEGIN
    SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = job.account_id FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs
    WHERE id = p_job AND lease_token = p_lease_token AND status = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    SELECT * INTO r FROM engine_extend(job.account_id, job.reservation_id, p_reservation_seconds,
        job.id, 'system');
    IF p_requeue_after IS NULL THEN
        UPDATE generation_jobs
        SET lease_expires_at = now() + make_interval(secs => p_lease_seconds), updated_at = now()
        WHERE id = p_job;
    ELSE
        UPDATE generation_jobs
        SET status = 'queued', lease_expires_at = NULL, error = p_error, updated_at = now(),
            next_attempt_at = now() + make_interval(secs => p_requeue_after)
        WHERE id = p_job;
    END IF;
    outcome := CASE WHEN r.outcome = 'extended' THEN 'done' ELSE 'reservation_lost' END;
END;
$$;
