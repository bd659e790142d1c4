-- Who may spend: reservations, and generation jobs with their reservation.

-- A job as the API and the job events show it (the one representation,
-- like those of 05_views.sql): what GET …/jobs/{request_id} answers and
-- job.succeeded / job.failed carry, with its reservation's state, expiry
-- and draws. The worker's lease (owner, token, expiry), the request's hash
-- and the provider's bookkeeping are the service's own, never shown.
CREATE FUNCTION engine_job_view(p_job generation_jobs, p_state text, p_expires_at timestamptz,
    p_draws jsonb)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('job_id', p_job.id, 'request_id', p_job.request_id,
        'account_id', p_job.account_id, 'kind', p_job.kind, 'status', p_job.status,
        'cost', p_job.cost, 'attempts', p_job.attempts,
        'reservation', jsonb_build_object('reservation_id', p_job.reservation_id,
            'state', p_state, 'expires_at', engine_time(p_expires_at),
            'draws', COALESCE(p_draws, '[]')),
        'result', p_job.result, 'error', p_job.error,
        'created_at', engine_time(p_job.created_at), 'updated_at', engine_time(p_job.updated_at),
        'finished_at', engine_time(p_job.finished_at))
$$;

-- The same, reading the job's reservation.
CREATE FUNCTION engine_job_json(p_job generation_jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT engine_job_view(p_job, r.state, r.expires_at, r.draws)
    FROM reservations r WHERE r.id = p_job.reservation_id
$$;

-- A spend's refusals, written once: what refuses `p_amount` tokens to an
-- account in status `p_status` holding `p_available` tokens and
-- `p_active` held reservations of at most `p_max_active` (0: no limit), in
-- this order: account_suspended, insufficient_tokens,
-- too_many_active_reservations; NULL when none does. (The key's refusal,
-- asked before it, is engine_key_refusal.)
CREATE FUNCTION engine_spend_refusal(p_status text, p_available bigint, p_amount bigint,
    p_active integer, p_max_active integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_status <> 'active' THEN 'account_suspended'
                WHEN p_available < p_amount THEN 'insufficient_tokens'
                WHEN p_max_active > 0 AND p_active >= p_max_active
                    THEN 'too_many_active_reservations'
           END
$$;

-- One spend (`o`: a reserve or a job creation, engine_request), decided and
-- applied. The caller (engine_apply) holds the account's row lock and has
-- checked the key (engine_key_refusal). In this order:
--   not_found {what: account}   the account does not exist;
--   replayed / idempotency_key_reused
--                               the request_id was seen before: a
--                               reservation (reserve: same amount and
--                               requested TTL = replayed) or a job
--                               (create_job: same request hash = replayed);
--   account_suspended, insufficient_tokens {available, reserved},
--   too_many_active_reservations {limit}
--                               engine_spend_refusal;
--   created                     the reservation (and job) is made and the
--                               tokens move available → reserved, drawn
--                               from the account's grants in draw order
--                               (engine_draws; grants lapsed by now leave
--                               the account first, engine_lapse_grants):
--                               one reserve entry per grant drawn
--                               (engine_record), the reservation's `draws`.
-- The object is the reservation (reserve) or the job as engine_job_view
-- shows it (create_job): the earlier one of a replay.
CREATE FUNCTION engine_spend(o engine_request, OUT outcome text, OUT detail jsonb,
    OUT object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := engine_now();
    seen record;
    job_row generation_jobs;
    made record;
BEGIN
    -- The account, an earlier use of the request_id (one probe of the
    -- (account_id, request_id) index) and whether a grant lapses, in one
    -- statement.
    SELECT a.id, a.status, a.available, a.reserved, a.active_reservations,
           a.max_active_reservations,
           (SELECT to_jsonb(x) FROM reservations x
            WHERE o.op = 'reserve' AND x.account_id = o.account AND x.request_id = o.request
              AND x.job_id IS NULL LIMIT 1) AS earlier,
           (SELECT j FROM generation_jobs j
            WHERE o.op = 'create_job' AND j.account_id = o.account AND j.request_id = o.request
            LIMIT 1) AS earlier_job,
           EXISTS (SELECT 1 FROM engine_lapsing_grants(o.account, at)) AS lapsing
    INTO seen
    FROM accounts a WHERE a.id = o.account;
    IF seen.id IS NULL THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    IF seen.lapsing THEN
        PERFORM engine_lapse_grants(ARRAY[o.account], at);
        SELECT a.available, a.reserved INTO seen.available, seen.reserved
        FROM accounts a WHERE a.id = o.account;
    END IF;
    IF seen.earlier IS NOT NULL THEN
        IF (seen.earlier->>'amount')::bigint = o.amount
           AND (seen.earlier->>'requested_ttl_seconds')::integer IS NOT DISTINCT FROM o.requested_ttl THEN
            outcome := 'replayed'; object := seen.earlier;
        ELSE
            outcome := 'idempotency_key_reused';
        END IF;
        RETURN;
    END IF;
    IF (seen.earlier_job).id IS NOT NULL THEN
        IF (seen.earlier_job).request_hash = o.hash THEN
            outcome := 'replayed'; object := engine_job_json(seen.earlier_job);
        ELSE
            outcome := 'idempotency_key_reused';
        END IF;
        RETURN;
    END IF;
    outcome := engine_spend_refusal(seen.status, seen.available, o.amount,
                                    seen.active_reservations, seen.max_active_reservations);
    IF outcome IS NOT NULL THEN
        detail := CASE outcome
            WHEN 'insufficient_tokens' THEN
                jsonb_build_object('available', seen.available, 'reserved', seen.reserved)
            WHEN 'too_many_active_reservations' THEN
                jsonb_build_object('limit', seen.max_active_reservations) END;
        RETURN;
    END IF;
    IF o.op = 'create_job' THEN
        -- The job first (its reservation_id's foreign key is checked at
        -- commit).
        INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
            reservation_id)
        VALUES (o.job, o.account, o.request, o.hash, o.kind, o.params, o.amount, o.new_id)
        RETURNING * INTO job_row;
    END IF;
    WITH draws AS MATERIALIZED (
        SELECT d.grant_id, d.lo, d.amount FROM engine_draws(o.account, 0, o.amount) d
    ), made AS (
        INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds, state,
            expires_at, job_id, draws)
        SELECT o.new_id, o.account, o.request, o.amount, o.requested_ttl, 'held',
               now() + make_interval(secs => o.ttl), job_row.id,
               (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)
                                 ORDER BY d.lo) FROM draws d)
        RETURNING *
    )
    -- One reserve entry per draw, in draw order; the first counts the
    -- reservation.
    SELECT to_jsonb(m) AS answer, m.state, m.expires_at, m.draws,
           ARRAY(SELECT ROW(o.account, 'reserve', d.amount, CASE WHEN d.lo = 0 THEN 1 ELSE 0 END,
                            o.new_id, job_row.id, NULL, NULL, o.actor, at,
                            d.grant_id)::engine_movement
                 FROM draws d ORDER BY d.lo) AS moves
    INTO made
    FROM made m;
    PERFORM engine_record(made.moves);
    outcome := 'created';
    object := CASE WHEN o.op = 'reserve' THEN made.answer
                   ELSE engine_job_view(job_row, made.state, made.expires_at, made.draws) END;
END;
$$;
