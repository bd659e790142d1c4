-- Spends: a reserve or a job creation, their refusals, and a job's view.

-- A job as the API and the job events show it (GET …/jobs/{request_id}, job.succeeded,
-- job.failed), with its reservation's state, expiry and draws. The worker's lease, the request's
-- hash and the provider's bookkeeping are never shown.
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

-- A spend's refusals, written once, in this order: account_suspended, key_budget_exhausted,
-- insufficient_tokens, too_many_active_reservations; NULL: none. For `p_amount` tokens, an
-- account in `p_status` with `p_available` tokens and `p_active` held reservations of at most
-- `p_max_active` (0: no limit), and a key budget with `p_budget_left` free (NULL: no budget).
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

-- One spend (`o`: a reserve or a job creation), against the account as the batch has left it
-- (`a`; id NULL: none), its entries stamped `p_at` (the batch's stamp). `p_key`: the presented
-- key, already passed by engine_key_refusal (NULL: the service authorised it); `p_key_pending`:
-- what the batch's unwritten reserves took from its budget. The caller (engine_apply) holds the
-- account's row lock and writes nothing before the batch's one write (engine_record), so the
-- grants are as engine_lock_accounts read them (`p_pools`; `p_lapsing`: one is due to lapse).
-- A reserve takes the drawable tokens [p_from, p_from + amount), p_from being what the batch's
-- earlier reserves on the account took. Outcomes, in this order:
--   not_found: no such account;
--   `lapsing` (no outcome): a grant is due to lapse; the caller lapses it and asks again;
--   replayed / idempotency_key_reused: the request_id was seen; replayed for a reservation of
--     the same amount and requested TTL, or a job of the same request hash;
--   engine_spend_refusal's refusals;
--   created: `made` (and `job`) to write, `moves` (one reserve entry per grant drawn, the first
--     counting the reservation) and, with a budgeted key, `budget` (its count in the period).
-- The object is the reservation or the job (engine_job_view); a replay's is the earlier one.
CREATE FUNCTION engine_spend(o engine_request, a engine_account, p_from bigint, p_at timestamptz,
    p_key engine_key, p_key_pending bigint, p_pools engine_pool[], p_lapsing boolean,
    OUT outcome text, OUT detail jsonb, OUT object jsonb, OUT lapsing boolean,
    OUT made engine_reservation, OUT job engine_job, OUT moves engine_movement[],
    OUT budget engine_budget_move)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    earlier jsonb;
    earlier_job generation_jobs;
    job_row generation_jobs;
    budget_left bigint;
    pool engine_pool;
    draws jsonb;
    upto bigint := p_from + o.amount;
    took bigint;
BEGIN
    IF a.id IS NULL THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    IF p_lapsing THEN
        lapsing := true;
        RETURN;
    END IF;
    -- An earlier use of the request_id: the same request again is replayed.
    IF o.op = 'reserve' THEN
        SELECT to_jsonb(x) INTO earlier FROM reservations x
        WHERE x.account_id = o.account AND x.request_id = o.request AND x.job_id IS NULL LIMIT 1;
        IF earlier IS NOT NULL THEN
            IF (earlier->>'amount')::bigint = o.amount
               AND (earlier->>'requested_ttl_seconds')::integer IS NOT DISTINCT FROM o.requested_ttl
            THEN
                outcome := 'replayed'; object := earlier;
            ELSE
                outcome := 'idempotency_key_reused';
            END IF;
            RETURN;
        END IF;
    ELSE
        SELECT j.* INTO earlier_job FROM generation_jobs j
        WHERE j.account_id = o.account AND j.request_id = o.request LIMIT 1;
        IF earlier_job.id IS NOT NULL THEN
            IF earlier_job.request_hash = o.hash THEN
                outcome := 'replayed'; object := engine_job_json(earlier_job);
            ELSE
                outcome := 'idempotency_key_reused';
            END IF;
            RETURN;
        END IF;
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
    -- The draws: the tokens [p_from, p_from + amount) of the account's pools, in draw order (a
    -- loop of plain expressions: a statement's plan would be started for every spend of a batch).
    FOREACH pool IN ARRAY p_pools LOOP
        CONTINUE WHEN pool.account_id <> o.account;
        took := engine_draw(pool, p_from, upto);
        CONTINUE WHEN took = 0;
        draws := COALESCE(draws, '[]') || jsonb_build_object('grant_id', pool.grant_id,
                                                             'amount', took);
        -- (The first draw counts the reservation.)
        moves := moves || ROW(o.account, 'reserve', took,
            CASE WHEN pool.lo <= p_from THEN 1 ELSE 0 END, o.new_id,
            CASE WHEN o.op = 'create_job' THEN o.job END, NULL, NULL, o.actor, p_at, pool.grant_id,
            p_key.key_id)::engine_movement;
        EXIT WHEN pool.hi >= upto;  -- (the later pools start at or after it)
    END LOOP;
    -- (One assignment, not one per field: each is compiled once a transaction.)
    made := ROW(o.new_id, o.account, o.request, o.amount, o.requested_ttl, 'held', 0,
                now() + make_interval(secs => o.ttl),
                CASE WHEN o.op = 'create_job' THEN o.job END, now(), NULL, draws, NULL,
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
    IF p_key.budget_tokens IS NOT NULL THEN
        made.budget_key_id := p_key.key_id;
        made.budget_period_start := engine_key_period_start(p_key.budget_period,
            p_key.budget_time_zone, p_at);
        budget := ROW(p_key.key_id, made.budget_period_start, o.new_id,
                      o.amount)::engine_budget_move;
    END IF;
END;
$$;
