-- Job rules: how a job finishes, keeps its lease, and fails when its
-- tokens are gone. Every function here locks the job's account row before
-- its reservation or its job row, like every other path.

-- job.succeeded / job.failed for jobs that have just reached that status,
-- in the transaction that finished them, at their finished_at. (PL/pgSQL:
-- its statement's plan is kept for the session, where an SQL function's
-- is made again at every call, and every finish calls it.)
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

-- The one rule for a job whose reservation is no longer held: it can never
-- be charged, so it fails (reservation_expired; its tokens are already
-- back), and its lease token moves on, which fences off a worker that may
-- still hold it. Only unfinished jobs change; their finished_at is the
-- transaction's stamp (engine_now: the time of the movement that took
-- their tokens back). Returns the jobs failed.
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

-- The accounts of the jobs `p_jobs`, row-locked in id order: every path
-- that settles or finishes a list of jobs takes them first, as a batch
-- does, so no two paths wait on each other crosswise. (`= ANY (ARRAY(…))`:
-- found by the primary key whatever the plan, 00_types.sql.)
CREATE FUNCTION engine_lock_job_accounts(p_jobs uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT j.account_id FROM generation_jobs j WHERE j.id = ANY (p_jobs)))
    ORDER BY id FOR NO KEY UPDATE;
END;
$$;

-- The max-attempts rule: a job that has been claimed `p_attempts` times has
-- no attempt left when that reaches `p_max`.
CREATE FUNCTION engine_attempts_exhausted(p_attempts integer, p_max integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_attempts >= p_max
$$;

-- A settlement the service makes itself (authorised): `p_action` of the
-- reservation `p_reservation` of `p_account` by the job `p_job` (NULL: the
-- reaper's expiry of an API reservation), as one engine_request for
-- engine_apply; `p_ttl` whole seconds (an extension; a fraction of a second
-- is rounded up: a hold is never shortened).
CREATE FUNCTION engine_settlement(p_action text, p_account uuid, p_reservation uuid,
    p_amount bigint, p_ttl double precision, p_job uuid, p_reason text, p_actor text)
RETURNS engine_request
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_action, p_account, p_actor, NULL, NULL, true, NULL, p_amount, NULL,
               ceil(p_ttl)::integer, NULL, p_job, p_reservation, NULL, NULL, NULL, NULL, NULL,
               p_reason, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::engine_request
$$;

-- A fenced job finish. Which claim may finish it:
--   p_lease_token       the worker holding that lease (job running);
--   p_exhausted_max     the reaper: running, lease expired, attempts
--                       exhausted (engine_attempts_exhausted), never
--                       submitted to the provider.
-- Exactly one of the two is set. Success commits the cost; failure
-- releases it (`p_reason`). A job whose reservation is no longer held
-- (expired meanwhile, or expired on this access) cannot succeed without a
-- charge: it fails (engine_fail_unreserved_jobs). The job's finished_at is
-- its ledger entries' time. Outcomes: done, lease_lost, reservation_lost;
-- `resolved` and `reservation` say what happened to the tokens.
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
    -- (`resolved`: the settlement moved the reservation out of `held`.)
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
        -- The job's final status, the lease let go; the reaper moves the
        -- token on, fencing off a worker that may still hold the job.
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

-- The heartbeat of all of a replica's in-flight jobs at once: `p_jobs`
-- with the lease token each worker holds (`p_tokens`, same order). Each
-- job still running under its token has its lease extended by
-- `p_lease_seconds`, and its reservation by `p_reservation_seconds` once
-- the reservation's expiry comes within `p_extend_within` seconds (neither
-- is ever shortened). `p_extend_within` NULL (a replica's heartbeat as the
-- worker sends it): within half of `p_reservation_seconds`, or two leases
-- when that is longer, so a reservation always outlives the lease by more
-- than a heartbeat's interval (half a lease). Most ticks extend no
-- reservation (a reservation outlives several leases): those jobs' leases
-- move by one conditional UPDATE, fenced by its own condition (the token,
-- `running`), with no lock taken before it and no other row touched — a
-- heartbeat writes one row version per job. Without account locks, it
-- takes the job rows in id order (the worker sends them sorted; the
-- look-up by `= ANY` walks the primary key in order), as a batch that
-- finishes jobs does after its accounts, so neither waits on the other
-- crosswise. The jobs whose
-- reservation is due (or no longer held) are settled as a batch is: their
-- accounts locked in id order, then the jobs, then one engine_settle
-- extending their reservations; a job whose reservation is no longer held
-- (expired meanwhile, or past its expiry on this access) fails
-- (engine_fail_unreserved_jobs). One row per distinct job and token: done,
-- lease_lost (that token no longer holds the job), reservation_lost.
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
    -- Read without locks: a job's reservation is settled only by the
    -- holder of its lease (this worker) or, past its expiry, by the
    -- reaper, so one far from its expiry stays held until the lease moves.
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
        -- (An extension capped at its grants' expiry is an extension: the
        -- job keeps its reservation until then, and its lease moves on.)
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
    -- The leases: of the jobs just extended, and of every other job still
    -- running under its token (the UPDATE's condition is the fence).
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

-- The worker's heartbeat of one job (engine_heartbeat_jobs) and its retry:
-- `p_requeue_after` NULL is the heartbeat; otherwise, once the heartbeat
-- has extended the reservation by `p_reservation_seconds`, the job goes
-- back to the queue for that many seconds, with `p_error` recorded. A job
-- whose reservation is no longer held fails instead: it is never queued
-- again. Outcomes: done, lease_lost, reservation_lost.
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

-- The reaper's fix-up of a finished job whose reservation is still held:
-- succeeded → commit its cost, failed → release, reason `fixup`. Outcome:
-- committed, released, not_finished, or what engine_settle decided.
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

-- The reaper's fix-up of jobs still queued or running whose reservation is
-- no longer held (engine_fail_unreserved_jobs), up to `p_limit`, accounts
-- locked in id order first. Returns how many failed.
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

-- The reaper's expiry: up to `p_limit` held reservations past their expiry
-- → expired (ledger `expire`, reason `expired`), and their unfinished jobs
-- fail (engine_fail_unreserved_jobs). Accounts locked in id order, then
-- one engine_settle for all of them. One row per reservation this call
-- expired.
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
    -- One batch through the one path (its accounts locked in id order).
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

-- A worker's claim of up to `p_limit` due jobs: queued jobs whose backoff
-- has passed, and running jobs whose lease expired (their worker died).
-- The candidates are found without locks, then the jobs themselves are
-- locked (SKIP LOCKED: a job another transaction holds is left to it) and
-- checked again. Each claim moves the fencing token on, counts an attempt
-- and leases the job to `p_owner` for `p_lease_seconds`. For each job:
-- whether its reservation is held for longer than the lease (then no
-- heartbeat is needed before the first provider call), and what the
-- max-attempts rule (engine_attempts_exhausted with `p_max_attempts`)
-- says: `over_limit`, the job had no attempt left before this claim (only
-- a result the provider already holds may still finish it);
-- `last_attempt`, no retry follows this one.
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
    -- No account lock: a claim changes only job rows, and SKIP LOCKED
    -- never waits, so it cannot close a cycle with the transactions that
    -- hold an account and then a job (it used to wait behind every create
    -- and finish on a busy account for a lock it did not need).
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

-- The reaper's requeue: up to `p_limit` running jobs whose lease expired
-- go back to the queue (the fencing token moves on, so their old worker is
-- shut out) when they have attempts left (engine_attempts_exhausted with
-- `p_max_attempts`) or the provider may hold their result; the others are
-- for engine_fail_exhausted_jobs. Accounts locked in id order first.
-- Returns how many were requeued.
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

-- The reaper's end of a job whose workers kept losing their lease: up to
-- `p_limit` running jobs, lease expired, attempts exhausted, never
-- submitted to the provider, fail `attempts_exhausted` and their tokens go
-- back (engine_finish_job with the reaper's fence), in one transaction.
-- Returns the finished
-- jobs with their resolved reservation (for the metrics).
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
    -- All their accounts first: one transaction finishes them all.
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
