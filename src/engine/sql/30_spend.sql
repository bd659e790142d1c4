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

-- Spend items (reserve, create_job), decided as if one by one in `pos`
-- order, set-based. For each item, in this order:
--   not_found {what: account}   the account does not exist;
--   replayed / idempotency_key_reused
--                               the request_id was seen before: a
--                               reservation (reserve: same amount and
--                               requested TTL = replayed) or a job
--                               (create_job: same request hash = replayed);
--   account_suspended           the account is not active;
--   insufficient_tokens {available, reserved}
--                               fewer tokens available than the amount;
--   too_many_active_reservations {limit}
--                               the account holds its limit of reservations
--                               (max_active_reservations; 0 = no limit);
--   created                     the reservation (and job) is made and the
--                               tokens move available → reserved, drawn
--                               from the account's grants in draw order
--                               (grants lapsed by then left the account
--                               first: engine_lapse_grants)
--                               (the reservation's `draws`; one reserve
--                               entry per grant drawn).
-- The balance and the limit are checked against running sums per account:
-- every item sees the items before it. All items before an account's first
-- refusal are decided at once; the refusal is final (it saw exactly the
-- state its predecessors left), and the items after it are decided again
-- against the state it left, until none is left. The caller holds the
-- accounts' row locks and passes each request_id at most once per account.
-- Returns one row per item: outcome, detail, and the reservation (reserve)
-- or the job (create_job) as JSON.
CREATE FUNCTION engine_spend(p_items engine_spend_item[])
RETURNS TABLE (pos integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    pending engine_spend_item[] := p_items;
    later engine_spend_item[];
    moves engine_movement[];
    spenders uuid[];
    at timestamptz;
    d record;
    m record;
BEGIN
    WHILE cardinality(pending) > 0 LOOP
        later := '{}';
        moves := '{}';
        at := engine_now();
        -- Grants lapsed by now leave first (engine_lapse_grants), so the
        -- decision sees the balance without them and never draws them. The
        -- look-up alone (the accounts' grants that hold tokens, by
        -- credit_grants_drawable_idx) is what most rounds cost: a call that
        -- updates nothing costs several times more. (A lapsed grant that
        -- holds none leaves nothing; the reaper marks it.)
        spenders := ARRAY(SELECT DISTINCT i.account FROM unnest(pending) i);
        IF EXISTS (SELECT 1 FROM credit_grants g
                   WHERE g.account_id = ANY (spenders) AND g.drawable
                     AND engine_grant_lapse_due(g.drawable, g.expired_at, g.expires_at, at)) THEN
            PERFORM engine_lapse_grants(spenders, at);
        END IF;
        FOR d IN
            WITH items AS (
                SELECT i.* FROM unnest(pending) i
            ), seen AS (
                SELECT i.*, a.id IS NOT NULL AS account_found, a.status, a.available, a.reserved,
                       a.active_reservations, a.max_active_reservations,
                       x.found AS earlier_reservation,
                       g.found AS earlier_job,
                       CASE
                           WHEN a.id IS NULL THEN 'not_found'
                           WHEN i.op = 'reserve' AND (x.found).id IS NOT NULL THEN
                               CASE WHEN (x.found).amount = i.amount
                                         AND (x.found).requested_ttl_seconds
                                             IS NOT DISTINCT FROM i.requested_ttl
                                    THEN 'replayed' ELSE 'idempotency_key_reused' END
                           WHEN i.op = 'create_job' AND (g.found).id IS NOT NULL THEN
                               CASE WHEN (g.found).request_hash = i.hash
                                    THEN 'replayed' ELSE 'idempotency_key_reused' END
                           WHEN a.status <> 'active' THEN 'account_suspended'
                       END AS early
                FROM items i
                -- The accounts by their primary key (= ANY of the batch's
                -- keys): a plain join is planned as a scan of the whole
                -- table.
                LEFT JOIN accounts a
                       ON a.id = i.account AND a.id = ANY (ARRAY(SELECT account FROM items))
                -- An earlier reservation or job of the item's request_id:
                -- one probe of the (account_id, request_id) index per
                -- item. (`request_id = ANY` of the batch's requests walks
                -- the whole index: request_id is its second column. LIMIT
                -- keeps each look-up a subquery of its own, never
                -- flattened into a join the planner could turn into a
                -- scan.)
                LEFT JOIN LATERAL (
                    SELECT r AS found FROM reservations r
                    WHERE i.op = 'reserve' AND r.account_id = i.account
                      AND r.request_id = i.request AND r.job_id IS NULL
                    LIMIT 1) x ON true
                LEFT JOIN LATERAL (
                    SELECT j AS found FROM generation_jobs j
                    WHERE i.op = 'create_job' AND j.account_id = i.account
                      AND j.request_id = i.request
                    LIMIT 1) g ON true
            ), summed AS (
                SELECT s.*,
                       sum(s.amount) OVER w AS through_amount,
                       count(*) OVER w AS through_count
                FROM seen s WHERE s.early IS NULL
                WINDOW w AS (PARTITION BY s.account ORDER BY s.pos)
            ), checked AS (
                SELECT s.*,
                       CASE WHEN s.available - s.through_amount < 0 THEN 'insufficient_tokens'
                            WHEN s.max_active_reservations > 0
                                 AND s.active_reservations + s.through_count > s.max_active_reservations
                            THEN 'too_many_active_reservations'
                       END AS refusal
                FROM summed s
            ), decided AS (
                SELECT c.*,
                       CASE WHEN c.pos < COALESCE(min(c.pos) FILTER (WHERE c.refusal IS NOT NULL)
                                                      OVER (PARTITION BY c.account), 2147483647)
                            THEN 'created'
                            WHEN c.pos = min(c.pos) FILTER (WHERE c.refusal IS NOT NULL)
                                             OVER (PARTITION BY c.account)
                            THEN c.refusal
                       END AS verdict
                FROM checked c
            ), draws AS (
                -- Each created item with its draws: the spending account's
                -- grants in draw order are intervals of their drawable
                -- tokens (engine_grant_pools); item i takes the account's
                -- tokens [through - amount, through) (through: its running
                -- sum), and its draw from each grant is the overlap with
                -- that grant's interval. One pass over `decided`, each
                -- item's grants by their index: a join of two of the
                -- batch's CTEs is planned as a nested loop (their sizes
                -- are unknown to the planner), quadratic in the batch. (So
                -- an account with several items in the batch has its
                -- grants read once per item: one index probe each.)
                SELECT d.pos, d.reservation, d.account, d.request, d.amount, d.requested_ttl,
                       d.ttl, d.job,
                       jsonb_agg(jsonb_build_object('grant_id', p.grant_id, 'amount',
                           (LEAST(d.through_amount, p.hi) - GREATEST(d.through_amount - d.amount, p.lo))::bigint)
                           ORDER BY p.lo) AS draws
                FROM decided d
                CROSS JOIN LATERAL engine_grant_pools(d.account) p
                WHERE d.verdict = 'created'
                  AND p.lo < d.through_amount AND p.hi > d.through_amount - d.amount
                GROUP BY d.pos, d.reservation, d.account, d.request, d.amount, d.requested_ttl,
                         d.ttl, d.job
            ), new_reservations AS (
                INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds,
                    state, expires_at, job_id, draws)
                SELECT w.reservation, w.account, w.request, w.amount, w.requested_ttl, 'held',
                       now() + make_interval(secs => w.ttl), w.job, w.draws
                FROM draws w
                ORDER BY w.pos
                RETURNING *
            ), new_jobs AS (
                INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params,
                    cost, reservation_id)
                SELECT d.job, d.account, d.request, d.hash, d.kind, d.params, d.amount, d.reservation
                FROM decided d WHERE d.verdict = 'created' AND d.op = 'create_job'
                ORDER BY d.pos
                RETURNING *
            )
            SELECT s.pos, s.op, s.account, s.actor, s.amount, s.reservation, s.job, nr.draws,
                   COALESCE(s.early, d.verdict) AS verdict,
                   CASE
                       WHEN s.early = 'not_found' THEN '{"what": "account"}'::jsonb
                       WHEN d.verdict = 'insufficient_tokens' THEN jsonb_build_object(
                           'available', d.available - (d.through_amount - d.amount),
                           'reserved', d.reserved + (d.through_amount - d.amount))
                       WHEN d.verdict = 'too_many_active_reservations' THEN
                           jsonb_build_object('limit', d.max_active_reservations)
                   END AS detail,
                   CASE
                       WHEN s.early IN ('replayed', 'idempotency_key_reused') AND s.op = 'reserve'
                            AND s.early = 'replayed' THEN to_jsonb(s.earlier_reservation)
                       WHEN s.early = 'replayed' AND s.op = 'create_job'
                            THEN engine_job_json(s.earlier_job)
                       WHEN d.verdict = 'created' AND s.op = 'reserve' THEN to_jsonb(nr)
                       WHEN d.verdict = 'created' THEN engine_job_view(nj, nr.state, nr.expires_at, nr.draws)
                   END AS object
            FROM seen s
            LEFT JOIN decided d ON d.pos = s.pos
            LEFT JOIN new_reservations nr ON nr.id = s.reservation AND d.verdict = 'created'
            LEFT JOIN new_jobs nj ON nj.id = s.job AND d.verdict = 'created'
            ORDER BY s.pos
        LOOP
            IF d.verdict IS NULL THEN
                -- After its account's first refusal: decided in the next round.
                later := later || ARRAY(SELECT i FROM unnest(pending) i WHERE i.pos = d.pos);
                CONTINUE;
            END IF;
            IF d.verdict = 'created' THEN
                -- One reserve entry per draw, in draw order; the first
                -- counts the reservation. Appended one at a time (`moves
                -- || ARRAY(...)` copies the whole array on every item:
                -- quadratic in the batch).
                FOR m IN
                    SELECT ROW(d.account, 'reserve', (x.draw->>'amount')::bigint,
                               CASE WHEN x.k = 1 THEN 1 ELSE 0 END, d.reservation, d.job, NULL, NULL,
                               d.actor, at, (x.draw->>'grant_id')::uuid)::engine_movement AS move
                    FROM jsonb_array_elements(d.draws) WITH ORDINALITY AS x (draw, k)
                    ORDER BY x.k
                LOOP
                    moves := moves || m.move;
                END LOOP;
            END IF;
            pos := d.pos; outcome := d.verdict; detail := d.detail; object := d.object;
            RETURN NEXT;
        END LOOP;
        IF cardinality(moves) > 0 THEN
            PERFORM engine_record(moves);
        END IF;
        pending := later;
    END LOOP;
END;
$$;
