-- Job rules: claim, heartbeat, finish, reaper. Lock order as everywhere: the job's account row, its
-- reservation, its job row; only the claim and a lease-only heartbeat lock no account.

-- job.succeeded / job.failed events for the jobs `p_jobs` just finished, in their transaction, at
-- their finished_at. (PL/pgSQL: its plan is kept for the session; every finish calls it.)
CREATE FUNCTION engine_job_finished_events(p_jobs uuid[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    INSERT INTO events (type, account_id, data, created_at)
    SELECT 'job.' || j.status, j.account_id,
           engine_event_account(a) || jsonb_build_object('job', engine_job_json(j)),
           COALESCE(j.finished_at, engine_now())
    FROM generation_jobs j JOIN accounts a ON a.id = j.account_id
    WHERE j.id = ANY (p_jobs) AND j.status IN ('succeeded', 'failed')
    ORDER BY j.id;
END;
$$;

-- The one rule for a job whose reservation is no longer held: it can never be charged, so if still
-- unfinished it fails (reservation_expired; its tokens are already back) at engine_now, the time of
-- the movement that took them back, and its lease token moves on, fencing off a worker that may
-- still hold it. The caller holds the jobs' account locks. Returns the jobs failed.
CREATE FUNCTION engine_fail_unreserved_jobs(p_jobs uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    failed uuid[];
BEGIN
    WITH changed AS (
        UPDATE generation_jobs j
        SET status = 'failed', finished_at = engine_now(), updated_at = now(),
            lease_expires_at = NULL, lease_token = j.lease_token + 1,
            error = jsonb_build_object('code', 'reservation_expired',
                'message', 'the job''s reservation expired before it finished')
        FROM reservations r
        WHERE j.id = ANY (p_jobs) AND j.status IN ('queued', 'running')
          AND r.id = j.reservation_id AND r.state <> 'held'
        RETURNING j.id
    )
    SELECT array_agg(id ORDER BY id) INTO failed FROM changed;
    IF failed IS NOT NULL THEN
        PERFORM engine_job_finished_events(failed);
        RETURN QUERY SELECT unnest(failed);
    END IF;
END;
$$;

-- Locks the accounts of `p_jobs` in id order: the first step of any path settling or ending jobs.
CREATE FUNCTION engine_lock_job_accounts(p_jobs uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT j.account_id FROM generation_jobs j WHERE j.id = ANY (p_jobs)))
    ORDER BY id FOR NO KEY UPDATE;
END;
$$;

-- The max-attempts rule: a job claimed `p_attempts` times has none left once that reaches `p_max`.
CREATE FUNCTION engine_attempts_exhausted(p_attempts integer, p_max integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_attempts >= p_max
$$;

-- A settlement the service makes itself (authorized), as one engine_request for engine_apply:
-- `p_action` of reservation `p_reservation` of `p_account` by job `p_job` (NULL: the reaper's
-- expiry of an API reservation). `p_ttl`: an extension's seconds, rounded up (never shortened).
CREATE FUNCTION engine_settlement(p_action text, p_account uuid, p_reservation uuid,
    p_amount bigint, p_ttl double precision, p_job uuid, p_reason text, p_actor text)
RETURNS engine_request
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_action, p_account, p_actor, NULL, NULL, true, NULL, p_amount, NULL,
               ceil(p_ttl)::integer, NULL, p_job, p_reservation, NULL, NULL, NULL, NULL, NULL,
               p_reason, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::engine_request
$$;

-- A fenced job finish by exactly one of: `p_lease_token`, the worker holding that lease (job
-- running); `p_exhausted_max`, the reaper (running, lease expired, attempts exhausted, never
-- submitted to the provider). Success commits the cost; failure releases it (`p_reason`); a job
-- whose reservation is no longer held (expired meanwhile or on this access) cannot succeed without
-- a charge, so it fails (engine_fail_unreserved_jobs). finished_at is its ledger entries' time.
-- Outcomes: done, lease_lost, reservation_lost; `resolved`: the reservation left `held`.
CREATE FUNCTION engine_finish_job(
    p_job uuid, p_lease_token bigint, p_exhausted_max integer, p_status text, p_result jsonb,
    p_error jsonb, p_reason text, p_actor text,
    OUT outcome text, OUT job generation_jobs, OUT reservation reservations, OUT resolved boolean
)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    settled record;
BEGIN
    IF (p_lease_token IS NULL) = (p_exhausted_max IS NULL) THEN
        RAISE EXCEPTION 'engine_finish_job: give exactly one of a lease token and an attempts limit';
    END IF;
    IF p_status NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'engine_finish_job: status % is not final', p_status;
    END IF;
    resolved := false;
    SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = job.account_id FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs
    WHERE id = p_job AND status = 'running'
      AND CASE WHEN p_lease_token IS NOT NULL THEN lease_token = p_lease_token
               ELSE lease_expires_at < now() AND engine_attempts_exhausted(attempts, p_exhausted_max)
                    AND provider_job_id IS NULL END
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    SELECT r.outcome, r.object,
           r.outcome IN ('committed', 'released', 'expired')
           OR COALESCE((r.detail->>'resolved')::boolean, false) AS resolved
    INTO settled
    FROM engine_apply(ARRAY[engine_settlement(
             CASE p_status WHEN 'succeeded' THEN 'commit' ELSE 'release' END, job.account_id,
             job.reservation_id, CASE p_status WHEN 'succeeded' THEN job.cost END, NULL, job.id,
             p_reason, p_actor)]) r;
    reservation := jsonb_populate_record(NULL::reservations, settled.object);
    resolved := settled.resolved;
    IF p_status = 'succeeded' AND settled.outcome <> 'committed' THEN
        PERFORM engine_fail_unreserved_jobs(ARRAY[p_job]);
        outcome := 'reservation_lost';
        SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    ELSE
        -- The lease let go; the reaper's finish moves the token on, fencing off its old worker.
        UPDATE generation_jobs
        SET status = p_status, result = CASE WHEN p_status = 'succeeded' THEN p_result END,
            error = p_error, finished_at = engine_now(), updated_at = now(),
            lease_expires_at = NULL,
            lease_token = lease_token + CASE WHEN p_lease_token IS NULL THEN 1 ELSE 0 END
        WHERE id = p_job
        RETURNING * INTO job;
        PERFORM engine_job_finished_events(ARRAY[p_job]);
        outcome := 'done';
    END IF;
END;
$$;

-- The heartbeat of a replica's in-flight jobs `p_jobs`, with the lease token each worker holds
-- (`p_tokens`, same order). A job still running under its token gets its lease extended by
-- `p_lease_seconds`, and its reservation by `p_reservation_seconds` once that expires within
-- `p_extend_within` seconds (neither ever shortened; the NULL default makes a reservation outlive
-- the lease by more than a heartbeat's interval, half a lease). One row per distinct job and token:
-- done, lease_lost (that token no longer holds the job), reservation_lost.
-- Most ticks extend no reservation: one UPDATE, fenced by its own condition, moves the leases with
-- no lock before it, taking the job rows in id order (sent sorted; `= ANY` walks the primary key in
-- order) as a finishing batch does after its accounts, so neither waits on the other crosswise.
-- Jobs whose reservation is due or lost go as a batch: accounts locked in id order, the jobs, one
-- engine_apply; a job whose reservation is lost fails (engine_fail_unreserved_jobs).
CREATE FUNCTION engine_heartbeat_jobs(
    p_jobs uuid[], p_tokens bigint[], p_lease_seconds integer,
    p_reservation_seconds double precision, p_extend_within double precision DEFAULT NULL
)
RETURNS TABLE (job_id uuid, lease_token bigint, outcome text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    due uuid[];
    fenced generation_jobs[];
    extended uuid[] := '{}';
    leased uuid[] := '{}';
    lost uuid[];
BEGIN
    IF cardinality(p_jobs) IS DISTINCT FROM cardinality(p_tokens) THEN
        RAISE EXCEPTION 'engine_heartbeat_jobs: % jobs but % tokens',
            cardinality(p_jobs), cardinality(p_tokens);
    END IF;
    p_extend_within := COALESCE(p_extend_within,
                                GREATEST(p_reservation_seconds / 2, 2.0 * p_lease_seconds));
    -- Read without locks: a job's reservation is settled only by its lease holder (this worker) or,
    -- past its expiry, by the reaper, so one far from its expiry stays held until the lease moves.
    due := ARRAY(
        SELECT j.id FROM generation_jobs j
        JOIN reservations r ON r.id = j.reservation_id
        WHERE j.id = ANY (p_jobs) AND j.status = 'running'
          AND (r.state <> 'held'
               OR r.expires_at < now() + make_interval(secs => p_extend_within)));
    IF cardinality(due) > 0 THEN
        PERFORM engine_lock_job_accounts(due);
        fenced := ARRAY(
            SELECT j FROM generation_jobs j
            JOIN (SELECT DISTINCT u.id, u.token FROM unnest(p_jobs, p_tokens) AS u(id, token)) h
              ON h.id = j.id AND h.token = j.lease_token
            WHERE j.status = 'running' AND j.id = ANY (due)
            ORDER BY j.id
            FOR UPDATE OF j);
    END IF;
    IF cardinality(fenced) > 0 THEN
        -- extended_capped (capped at its grants' expiry) is an extension too: the lease moves on.
        SELECT COALESCE(array_agg(f.id) FILTER (WHERE s.outcome IN ('extended', 'extended_capped')),
                        '{}'),
               array_agg(f.id) FILTER (WHERE s.outcome NOT IN ('extended', 'extended_capped'))
        INTO extended, lost
        FROM engine_apply(ARRAY(
                 SELECT engine_settlement('extend', f.account_id, f.reservation_id, NULL,
                                          p_reservation_seconds, f.id, NULL, 'system')
                 FROM unnest(fenced) WITH ORDINALITY AS f ORDER BY f.ordinality)) s
        JOIN unnest(fenced) WITH ORDINALITY AS f ON f.ordinality = s.op_position;
        IF lost IS NOT NULL THEN
            PERFORM engine_fail_unreserved_jobs(lost);
        END IF;
    END IF;
    WITH moved AS (
        UPDATE generation_jobs j
        SET lease_expires_at = GREATEST(j.lease_expires_at,
                now() + make_interval(secs => p_lease_seconds)),
            updated_at = now()
        FROM (SELECT DISTINCT u.id, u.token FROM unnest(p_jobs, p_tokens) AS u(id, token)) h
        WHERE j.id = h.id AND j.lease_token = h.token AND j.status = 'running'
          AND j.id = ANY (p_jobs)
          AND (j.id = ANY (extended) OR NOT j.id = ANY (due))
        RETURNING j.id
    )
    SELECT COALESCE(array_agg(m.id), '{}') INTO leased FROM moved m;
    RETURN QUERY
    SELECT h.id, h.token,
           CASE WHEN h.id = ANY (leased) THEN 'done'
                WHEN f.id IS NOT NULL THEN 'reservation_lost'
                ELSE 'lease_lost' END
    FROM (SELECT DISTINCT u.id, u.token FROM unnest(p_jobs, p_tokens) AS u(id, token)) h
    LEFT JOIN unnest(fenced) f ON f.id = h.id AND f.lease_token = h.token
    ORDER BY h.id, h.token;
END;
$$;

-- The worker's heartbeat of one job (engine_heartbeat_jobs), and its retry: with `p_requeue_after`
-- set, once the reservation is extended by `p_reservation_seconds` the job goes back to the queue
-- for `p_requeue_after` seconds, `p_error` recorded. A job whose reservation is no longer held
-- fails instead, never queued again. Outcomes: done, lease_lost, reservation_lost.
CREATE FUNCTION engine_job_heartbeat(
    p_job uuid, p_lease_token bigint, p_lease_seconds integer, p_reservation_seconds double precision,
    p_requeue_after double precision, p_error jsonb,
    OUT outcome text
)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    -- A retry always extends the reservation (to outlive the backoff).
    SELECT h.outcome INTO outcome
    FROM engine_heartbeat_jobs(ARRAY[p_job], ARRAY[p_lease_token], p_lease_seconds,
                               p_reservation_seconds,
                               CASE WHEN p_requeue_after IS NOT NULL THEN p_reservation_seconds END) h;
    IF outcome = 'done' AND p_requeue_after IS NOT NULL THEN
        UPDATE generation_jobs
        SET status = 'queued', lease_expires_at = NULL, error = p_error, updated_at = now(),
            next_attempt_at = now() + make_interval(secs => p_requeue_after)
        WHERE id = p_job;
    END IF;
END;
$$;

-- The reaper's fix-up of a finished job whose reservation is still held: succeeded → commit its
-- cost, failed → release, reason `fixup`. Outcome: not_finished, or engine_settle's outcome.
CREATE FUNCTION engine_fixup(p_job uuid, OUT outcome text, OUT amount bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    job generation_jobs;
    settled record;
BEGIN
    SELECT * INTO job FROM generation_jobs WHERE id = p_job;
    IF NOT FOUND THEN
        outcome := 'not_finished';
        RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = job.account_id FOR NO KEY UPDATE;
    SELECT * INTO job FROM generation_jobs WHERE id = p_job AND status IN ('succeeded', 'failed');
    IF NOT FOUND THEN
        outcome := 'not_finished';
        RETURN;
    END IF;
    SELECT r.outcome INTO outcome
    FROM engine_apply(ARRAY[engine_settlement(
             CASE job.status WHEN 'succeeded' THEN 'commit' ELSE 'release' END, job.account_id,
             job.reservation_id, CASE job.status WHEN 'succeeded' THEN job.cost END, NULL, job.id,
             'fixup', 'system')]) r;
    amount := job.cost;
END;
$$;

-- The reaper's fix-up of up to `p_limit` queued or running jobs whose reservation is no longer held
-- (engine_fail_unreserved_jobs), accounts locked in id order first. Returns how many failed.
CREATE FUNCTION engine_fail_orphaned_jobs(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    orphans uuid[];
BEGIN
    SELECT array_agg(j.id ORDER BY j.id) INTO orphans
    FROM (SELECT j.id, j.account_id FROM generation_jobs j
          JOIN reservations r ON r.id = j.reservation_id
          WHERE j.status IN ('queued', 'running') AND r.state <> 'held'
          ORDER BY j.id LIMIT p_limit) j;
    IF orphans IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM engine_lock_job_accounts(orphans);
    RETURN (SELECT count(*) FROM engine_fail_unreserved_jobs(orphans));
END;
$$;

-- The reaper's expiry: up to `p_limit` held reservations past their expiry → expired (ledger
-- `expire`, reason `expired`) by one engine_apply, and their unfinished jobs fail
-- (engine_fail_unreserved_jobs). One row per reservation this call expired.
CREATE FUNCTION engine_expire_due(p_limit integer)
RETURNS TABLE (reservation_id uuid, amount bigint, job_failed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    due reservations[];
    expired jsonb[];
    failed uuid[];
BEGIN
    due := ARRAY(SELECT r FROM reservations r
                 WHERE r.state = 'held' AND engine_reservation_expired(r.expires_at, now())
                 ORDER BY r.account_id, r.id LIMIT p_limit);
    IF cardinality(due) = 0 THEN
        RETURN;
    END IF;
    expired := ARRAY(
        SELECT s.object
        FROM engine_apply(ARRAY(SELECT engine_settlement('expire', d.account_id, d.id, NULL, NULL,
                                                       d.job_id, 'expired', 'system')
                              FROM unnest(due) WITH ORDINALITY AS d ORDER BY d.ordinality)) s
        WHERE s.outcome = 'expired'
        ORDER BY s.op_position);
    failed := ARRAY(SELECT engine_fail_unreserved_jobs(
        ARRAY(SELECT (e->>'job_id')::uuid FROM unnest(expired) e WHERE e->>'job_id' IS NOT NULL)));
    RETURN QUERY
    SELECT (e->>'id')::uuid, (e->>'amount')::bigint,
           e->>'job_id' IS NOT NULL AND (e->>'job_id')::uuid = ANY (failed)
    FROM unnest(expired) e;
END;
$$;

-- A worker's claim of up to `p_limit` due jobs: queued ones whose backoff has passed, running ones
-- whose lease expired (their worker died). Found without locks, then locked (SKIP LOCKED: a job
-- another transaction holds is left to it) and checked again. A claim moves the fencing token on,
-- counts an attempt and leases the job to `p_owner` for `p_lease_seconds`. Per job:
-- `reservation_outlasts_lease` (no heartbeat needed before the first provider call); `over_limit`,
-- no attempt was left before this claim (only a result the provider already holds may still finish
-- it); `last_attempt`, no retry follows this one.
CREATE FUNCTION engine_claim_jobs(p_owner text, p_lease_seconds integer, p_max_attempts integer,
    p_limit integer)
RETURNS TABLE (job generation_jobs, reservation_outlasts_lease boolean, over_limit boolean,
               last_attempt boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidates uuid[];
BEGIN
    candidates := ARRAY(
        (SELECT j.id FROM generation_jobs j
         WHERE j.status = 'queued' AND j.next_attempt_at <= now()
         ORDER BY j.next_attempt_at LIMIT p_limit)
        UNION ALL
        (SELECT j.id FROM generation_jobs j
         WHERE j.status = 'running' AND j.lease_expires_at < now()
         ORDER BY j.lease_expires_at LIMIT p_limit));
    IF cardinality(candidates) = 0 THEN
        RETURN;
    END IF;
    -- No account lock: a claim changes only job rows, and SKIP LOCKED never waits, so it cannot
    -- close a cycle with the transactions that hold an account and then a job.
    RETURN QUERY
    WITH claimable AS (
        SELECT j.id FROM generation_jobs j
        WHERE j.id = ANY (candidates)
          AND (j.status = 'queued' AND j.next_attempt_at <= now()
               OR j.status = 'running' AND j.lease_expires_at < now())
        ORDER BY j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE generation_jobs j
        SET status = 'running', lease_owner = p_owner, lease_token = j.lease_token + 1,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            attempts = j.attempts + 1, updated_at = now()
        FROM claimable c WHERE j.id = c.id
        RETURNING j
    )
    SELECT c.j,
           COALESCE((SELECT NOT engine_reservation_expired(r.expires_at,
                                                            now() + make_interval(secs => p_lease_seconds))
                     FROM reservations r
                     WHERE r.id = (c.j).reservation_id AND r.state = 'held'), false),
           engine_attempts_exhausted((c.j).attempts - 1, p_max_attempts),
           engine_attempts_exhausted((c.j).attempts, p_max_attempts)
    FROM claimed c
    ORDER BY (c.j).id;
END;
$$;

-- The reaper's requeue of up to `p_limit` running jobs whose lease expired, with attempts left or a
-- result the provider may hold (else: engine_fail_exhausted_jobs); the fencing token moves on.
-- Accounts locked in id order first. Returns how many were requeued.
CREATE FUNCTION engine_requeue_expired_leases(p_limit integer, p_max_attempts integer)
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidates uuid[];
    requeued integer;
BEGIN
    candidates := ARRAY(
        SELECT j.id FROM generation_jobs j
        WHERE j.status = 'running' AND j.lease_expires_at < now()
          AND (NOT engine_attempts_exhausted(j.attempts, p_max_attempts)
               OR j.provider_job_id IS NOT NULL)
        ORDER BY j.id LIMIT p_limit);
    IF cardinality(candidates) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM engine_lock_job_accounts(candidates);
    UPDATE generation_jobs j
    SET status = 'queued', lease_expires_at = NULL, lease_token = j.lease_token + 1,
        next_attempt_at = now(), updated_at = now()
    WHERE j.id IN (SELECT x.id FROM generation_jobs x
                   WHERE x.id = ANY (candidates) AND x.status = 'running'
                     AND x.lease_expires_at < now()
                   ORDER BY x.id FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS requeued = ROW_COUNT;
    RETURN requeued;
END;
$$;

-- The reaper's end of up to `p_limit` running jobs, lease expired, attempts exhausted, never
-- submitted to the provider: they fail `attempts_exhausted`, tokens back (engine_finish_job, the
-- reaper's fence). Returns them with their resolved reservation (for the metrics).
CREATE FUNCTION engine_fail_exhausted_jobs(p_limit integer, p_max_attempts integer)
RETURNS TABLE (job_id uuid, reservation reservations, resolved boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidates uuid[];
    candidate uuid;
    finished record;
BEGIN
    candidates := ARRAY(
        SELECT j.id FROM generation_jobs j
        WHERE j.status = 'running' AND j.lease_expires_at < now()
          AND engine_attempts_exhausted(j.attempts, p_max_attempts)
          AND j.provider_job_id IS NULL
        ORDER BY j.id LIMIT p_limit);
    -- All their accounts first, in id order: one transaction finishes them all.
    PERFORM engine_lock_job_accounts(candidates);
    FOREACH candidate IN ARRAY candidates
    LOOP
        SELECT * INTO finished FROM engine_finish_job(candidate, NULL, p_max_attempts, 'failed',
            NULL, jsonb_build_object('code', 'attempts_exhausted',
                'message', 'the job''s workers kept losing their lease'),
            'attempts_exhausted', 'system');
        CONTINUE WHEN finished.outcome = 'lease_lost';
        job_id := candidate;
        reservation := finished.reservation;
        resolved := finished.resolved;
        RETURN NEXT;
    END LOOP;
END;
$$;
