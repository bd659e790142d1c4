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
-- `p_active` held reservations of at most `p_max_active` (0: no limit),
-- spent with a key whose budget has `p_budget_left` tokens free (NULL: no
-- budget; engine_key_budget_left), in this order: account_suspended,
-- key_budget_exhausted, insufficient_tokens, too_many_active_reservations;
-- NULL when none does. (The key's refusal, which engine_apply asks first,
-- is engine_key_refusal.)
CREATE FUNCTION engine_spend_refusal(p_status text, p_available bigint, p_amount bigint,
    p_active integer, p_max_active integer, p_budget_left bigint DEFAULT NULL) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_status <> 'active' THEN 'account_suspended'
                WHEN p_budget_left < p_amount THEN 'key_budget_exhausted'
                WHEN p_available < p_amount THEN 'insufficient_tokens'
                WHEN p_max_active > 0 AND p_active >= p_max_active
                    THEN 'too_many_active_reservations'
           END
$$;

-- One spend (`o`: a reserve or a job creation, engine_request), decided
-- against the account as the batch has left it so far (`a`; its id NULL
-- when there is none) at `p_at` (the batch's stamp), with the presented
-- key `p_key` (valid, and allowed to spend here: engine_apply asked
-- engine_key_refusal first; NULL when the service authorised it), and
-- `p_key_pending` the tokens the batch's earlier reserves, not written
-- yet, took from that key's budget. The caller (engine_apply) holds the
-- account's row lock and writes nothing of this batch's operations before
-- their one write (engine_record), so the grants are as they were when
-- the batch read them (engine_lock_accounts: `p_pools`, the drawable
-- tokens in draw order; `p_lapsing`, whether a grant is due to lapse): a
-- reserve takes the account's drawable tokens [p_from, p_from + amount)
-- (engine_draws), p_from being what the batch's earlier reserves on the
-- account took. In this order:
--   not_found {what: account}   the account does not exist;
--   (lapsing)                   a grant of the account is due to lapse:
--                               no outcome; the caller writes the lapse
--                               (engine_lapse_grants) and asks again;
--   replayed / idempotency_key_reused
--                               the request_id was seen before: a
--                               reservation (reserve: same amount and
--                               requested TTL = replayed) or a job
--                               (create_job: same request hash = replayed);
--   account_suspended, key_budget_exhausted {remaining, resets_at,
--   budget_tokens, budget_period}, insufficient_tokens {available,
--   reserved}, too_many_active_reservations {limit}
--                               engine_spend_refusal;
--   created                     the reservation (and job) as they are to
--                               be written (`made`, `job`), and the
--                               movements: one reserve entry per grant
--                               drawn, the first counting the reservation;
--                               with a key that has a budget, `budget`: the
--                               reserve's count in its period.
-- The object is the reservation (reserve) or the job as engine_job_view
-- shows it (create_job): the earlier one of a replay.
CREATE FUNCTION engine_spend(o engine_request, a engine_account, p_from bigint, p_at timestamptz,
    p_key engine_key, p_key_pending bigint, p_pools engine_pool[], p_lapsing boolean,
    OUT outcome text, OUT detail jsonb, OUT object jsonb, OUT lapsing boolean,
    OUT made engine_reservation, OUT job engine_job, OUT moves engine_movement[],
    OUT budget engine_budget_move)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    seen record;
    job_row generation_jobs;
    budget_left bigint;
BEGIN
    lapsing := false;
    -- An earlier use of the request_id (one probe of the (account_id,
    -- request_id) index) and the draws, in one statement.
    SELECT (SELECT to_jsonb(x) FROM reservations x
            WHERE o.op = 'reserve' AND x.account_id = o.account AND x.request_id = o.request
              AND x.job_id IS NULL LIMIT 1) AS earlier,
           (SELECT j FROM generation_jobs j
            WHERE o.op = 'create_job' AND j.account_id = o.account AND j.request_id = o.request
            LIMIT 1) AS earlier_job,
           -- The draws once, as the reservation's `draws` and as its
           -- movements. (In engine_draws' order, the draw order: an
           -- aggregate's own ORDER BY sorts again.)
           jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)) AS draws,
           array_agg(ROW(o.account, 'reserve', d.amount,
                         CASE WHEN d.lo = p_from THEN 1 ELSE 0 END, o.new_id,
                         CASE WHEN o.op = 'create_job' THEN o.job END, NULL, NULL, o.actor,
                         p_at, d.grant_id, p_key.key_id)::engine_movement) AS moves
    INTO seen
    FROM engine_draws(p_pools, o.account, p_from, p_from + o.amount) d;
    IF a.id IS NULL THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    IF p_lapsing THEN
        lapsing := true;
        RETURN;
    END IF;
    IF seen.earlier IS NOT NULL THEN
        IF (seen.earlier->>'amount')::bigint = o.amount
           AND (seen.earlier->>'requested_ttl_seconds')::integer
               IS NOT DISTINCT FROM o.requested_ttl THEN
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
    IF p_key.budget_tokens IS NOT NULL THEN
        budget_left := engine_key_budget_left(p_key.budget_tokens, p_key.budget_period,
            p_key.budget_time_zone, p_key.budget_spent, p_key.budget_period_start, p_at)
            - p_key_pending;
    END IF;
    outcome := engine_spend_refusal(a.status, a.available, o.amount, a.active_reservations,
                                    a.max_active_reservations, budget_left);
    IF outcome IS NOT NULL THEN
        detail := CASE outcome
            WHEN 'key_budget_exhausted' THEN
                jsonb_build_object('remaining', GREATEST(budget_left, 0),
                    'resets_at', engine_time(engine_key_period_end(p_key.budget_period,
                                                                   p_key.budget_time_zone, p_at)),
                    'budget_tokens', p_key.budget_tokens, 'budget_period', p_key.budget_period)
            WHEN 'insufficient_tokens' THEN
                jsonb_build_object('available', a.available, 'reserved', a.reserved)
            WHEN 'too_many_active_reservations' THEN
                jsonb_build_object('limit', a.max_active_reservations) END;
        RETURN;
    END IF;
    outcome := 'created';
    -- (One assignment, not one per field: each is compiled once a transaction.)
    made := ROW(o.new_id, o.account, o.request, o.amount, o.requested_ttl, 'held', 0,
                now() + make_interval(secs => o.ttl),
                CASE WHEN o.op = 'create_job' THEN o.job END, now(), NULL, seen.draws, NULL,
                NULL)::engine_reservation;
    IF o.op = 'create_job' THEN
        job := ROW(o.job, o.account, o.request, o.hash, o.kind, o.params, o.amount,
                   o.new_id)::engine_job;
        -- The job as it will be written (its columns' defaults), for its view.
        job_row.id := o.job; job_row.account_id := o.account; job_row.request_id := o.request;
        job_row.kind := o.kind; job_row.params := o.params; job_row.cost := o.amount;
        job_row.status := 'queued'; job_row.reservation_id := o.new_id; job_row.attempts := 0;
        job_row.created_at := now(); job_row.updated_at := now();
        object := engine_job_view(job_row, made.state, made.expires_at, made.draws);
    ELSE
        object := to_jsonb(made);
    END IF;
    moves := seen.moves;
    IF p_key.budget_tokens IS NOT NULL THEN
        made.budget_key_id := p_key.key_id;
        made.budget_period_start := engine_key_period_start(p_key.budget_period,
            p_key.budget_time_zone, p_at);
        budget := ROW(p_key.key_id, made.budget_period_start, o.new_id,
                      o.amount)::engine_budget_move;
    END IF;
END;
$$;
