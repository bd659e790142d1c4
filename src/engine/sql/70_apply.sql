-- Whether an operation lacks a field its kind needs, carries one it may
-- not, or names an unknown kind (the fields each kind sets are listed
-- below, at engine_apply_full), written once: engine_apply_full refuses a
-- batch holding such an operation (nothing at all is written), and
-- engine_apply sends no operation to the lean path unless this is false.
CREATE FUNCTION engine_op_incomplete(p_op text, p_account uuid, p_actor text,
    p_authorized boolean, p_key_id uuid, p_key_hash bytea, p_request uuid, p_amount bigint,
    p_ttl integer, p_new_id uuid, p_job uuid, p_hash bytea, p_kind text, p_params jsonb,
    p_reservation uuid, p_external_ref text, p_reason text, p_priority integer,
    p_lease_token bigint, p_status text, p_result jsonb, p_expires_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_account IS NULL OR p_actor IS NULL OR NOT CASE p_op
        WHEN 'reserve' THEN p_request IS NOT NULL AND p_amount IS NOT NULL AND p_ttl IS NOT NULL
                            AND p_new_id IS NOT NULL
        WHEN 'create_job' THEN p_request IS NOT NULL AND p_amount IS NOT NULL AND p_ttl IS NOT NULL
                            AND p_new_id IS NOT NULL AND p_job IS NOT NULL AND p_hash IS NOT NULL
                            AND p_kind IS NOT NULL AND p_params IS NOT NULL
        WHEN 'commit' THEN p_reservation IS NOT NULL AND p_amount IS NOT NULL
        WHEN 'commit_all' THEN p_reservation IS NOT NULL AND p_amount IS NULL
        WHEN 'release' THEN p_reservation IS NOT NULL
        WHEN 'extend' THEN p_reservation IS NOT NULL AND p_ttl IS NOT NULL
        WHEN 'credit' THEN p_new_id IS NOT NULL AND p_amount IS NOT NULL
                           AND p_external_ref IS NOT NULL AND p_priority IS NOT NULL
        WHEN 'adjust' THEN p_new_id IS NOT NULL AND p_amount IS NOT NULL
                           AND p_external_ref IS NOT NULL AND p_reason IS NOT NULL
                           AND (p_priority IS NOT NULL) = (p_amount > 0)
        WHEN 'finish_job' THEN p_job IS NOT NULL AND p_lease_token IS NOT NULL
                           AND (p_status = 'succeeded' AND p_result IS NOT NULL
                                OR p_status = 'failed' AND p_result IS NULL)
        ELSE false END
       OR (p_expires_at IS NOT NULL AND NOT (p_op IN ('credit', 'adjust') AND p_amount > 0))
       OR p_authorized IS NULL
       -- Credits, adjustments and job finishes are the service's own
       -- (authorised); a spending operation's key is verified here.
       OR (p_authorized = false AND (p_op IN ('credit', 'adjust', 'finish_job')
                                     OR p_key_id IS NULL OR p_key_hash IS NULL))
$$;

-- The entry point of every spending request of the API, alone or
-- coalesced with concurrent ones: a batch of operations on any accounts,
-- in one statement (one transaction, one WAL flush). engine_apply (at the
-- end of this file) applies the batch's plain reserves, commits and
-- releases on the lean path (`68_lean.sql`) and hands the rest, from the
-- first operation that is not plain, to engine_apply_full: the full
-- machinery below.
--
-- The batch crosses as one array of engine_request (00_types.sql), one
-- element per operation, in order. `op` names the operation; the fields
-- each needs must be set, the others NULL:
--   reserve      account, actor, request, amount, ttl, new_id (the
--                reservation); requested_ttl as the client sent it (NULL:
--                none)
--   create_job   account, actor, request, amount (its cost), ttl, new_id
--                (the reservation), job, hash, kind, params
--   commit       account, actor, reservation, amount (exactly this many)
--   commit_all   account, actor, reservation (all held; amount NULL)
--   release      account, actor, reservation
--   extend       account, actor, reservation, ttl
--   credit       account, actor, new_id, amount, external_ref, priority (of
--                its grant); note and expires_at (its grant's; NULL: never)
--                may be NULL
--   adjust       account, actor, new_id, amount, external_ref, reason;
--                priority exactly when the amount is positive (its grant's),
--                expires_at only then (may be NULL)
--   finish_job   account (the job's), actor, job, lease_token (the
--                worker's lease), status (succeeded or failed), result
--                (succeeded) or error (failed; may be NULL), reason (the
--                ledger reason of a release; may be NULL)
-- `authorized` says who vouches for the caller: true when the service has
-- authorised it already (the ADMIN_API_KEY bootstrap admin, an admin
-- request, a worker); false when the operation carries the caller's key —
-- key_id and key_hash (SHA-256 of its secret), both set — verified here in
-- the same statement (engine_verify_keys, engine_spend_authority). Credits
-- and adjustments are always authorised by the caller (admin);
-- http_request_id is the audit event's request id. A job's finish comes
-- from a worker the service vouches for (authorised). A missing field is an
-- error (the whole batch fails), never a default.
--
-- Accounts are locked in id order first. Operations are then applied as if
-- one by one in array order, each getting the answer it would have had
-- alone at that point: an operation that cannot be decided together with
-- the ones before it on its account — a different class of operation
-- (spend: reserve, create_job; settle: commit, release, extend; external:
-- credit, adjust; job: finish_job), or the same request_id, reservation,
-- external_ref or job again — starts a new round on that account. Each
-- round is one engine_spend and one engine_settle for all accounts
-- (set-based), then the external operations and the job finishes one by
-- one (engine_external, engine_finish_job: a worker's finish shares the
-- batch's transaction and WAL flush with the requests around it). Returns
-- one row per operation: its position (1-based), outcome, detail and
-- object (JSON); and, when the batch left a tally (engine_tally: tokens
-- of lapsed grants expired — a spend or removal lapsing them on access, a
-- return to a lapsed grant — or tokens top-up rules credited), a row at
-- position 0, outcome tallies, detail {grant_expired, topup_credited},
-- for the caller's metrics.
CREATE FUNCTION engine_apply_full(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    batch integer := cardinality(p_ops);
    ops engine_op[];
    refused integer[] := '{}';
    last_round integer;
    spends engine_spend_item[];
    settles engine_settle_item[];
    externals boolean;
    finishes boolean;
    owner uuid;
    f record;
    bad record;
    r record;
    e record;
BEGIN
    IF batch IS NULL OR batch = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(ROW(o.n, o.op, o.class, o.round, o.account, o.actor, o.key_id, o.key_hash, o.authorized, o.request, o.amount,
               o.requested_ttl, o.ttl, o.new_id, o.job, o.reservation, o.hash, o.kind, o.params,
               o.external_ref, o.note, o.reason, o.http_request_id, o.lease_token, o.status,
               o.result, o.error, o.priority, o.expires_at)::engine_op ORDER BY o.n),
           max(o.round)
    INTO ops, last_round
    FROM (
      SELECT s.*, sum(s.starts::integer) OVER (PARTITION BY s.account ORDER BY s.n)::integer AS round
      FROM (
        SELECT c.*,
               COALESCE(lag(c.class) OVER (PARTITION BY c.account ORDER BY c.n) <> c.class, false)
               OR row_number() OVER (PARTITION BY c.account, c.class, c.target ORDER BY c.n) > 1
                   AS starts
        FROM (
            SELECT u.*,
                   CASE WHEN u.op IN ('reserve', 'create_job') THEN 'spend'
                        WHEN u.op IN ('commit', 'commit_all', 'release', 'extend') THEN 'settle'
                        WHEN u.op = 'finish_job' THEN 'job'
                        ELSE 'external' END AS class,
                   CASE WHEN u.op IN ('reserve', 'create_job') THEN u.op || ':' || u.request
                        WHEN u.op IN ('credit', 'adjust') THEN u.op || ':' || u.external_ref
                        WHEN u.op = 'finish_job' THEN u.job::text
                        ELSE u.reservation::text END AS target
            FROM unnest(p_ops) WITH ORDINALITY
                 AS u (op, account, actor, key_id, key_hash, authorized, request,
                     amount, requested_ttl, ttl, new_id, job, reservation, hash, kind, params,
                     external_ref, note, reason, http_request_id, lease_token, status, result,
                     error, priority, expires_at, n)
        ) c
      ) s
    ) o;

    SELECT o.n, o.op INTO bad FROM unnest(ops) o
    WHERE engine_op_incomplete(o.op, o.account, o.actor, o.authorized, o.key_id, o.key_hash,
        o.request, o.amount, o.ttl, o.new_id, o.job, o.hash, o.kind, o.params, o.reservation,
        o.external_ref, o.reason, o.priority, o.lease_token, o.status, o.result, o.expires_at)
    ORDER BY o.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'engine_apply: operation % (%) lacks a required field or names an unknown operation',
            bad.n, COALESCE(bad.op, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- An array, so the accounts are found by index whatever the plan.
    PERFORM 1 FROM accounts
    WHERE id = ANY (ARRAY(SELECT DISTINCT o.account FROM unnest(ops) o))
    ORDER BY id FOR NO KEY UPDATE;
    -- The jobs the batch finishes, in id order, before it touches any:
    -- a replica's heartbeat moves its jobs' leases without account locks,
    -- in job id order too, so the two never wait on each other crosswise.
    IF EXISTS (SELECT 1 FROM unnest(ops) o WHERE o.class = 'job') THEN
        PERFORM 1 FROM generation_jobs g
        WHERE g.id = ANY (ARRAY(SELECT o.job FROM unnest(ops) o WHERE o.class = 'job'))
          AND g.account_id = ANY (ARRAY(SELECT DISTINCT o.account FROM unnest(ops) o))
        ORDER BY g.id FOR UPDATE;
    END IF;

    -- Keys: a spending operation whose key does not verify, or may not
    -- spend on this account, is answered here and takes no further part.
    FOR r IN
        SELECT o.n,
               CASE WHEN o.authorized THEN 'ok'
                    WHEN k.key_id IS NULL THEN 'unauthorized'
                    ELSE engine_spend_authority(k.scope, k.account_id, o.account) END AS verdict
        FROM unnest(ops) o
        LEFT JOIN engine_verify_keys(ARRAY(SELECT x.key_id FROM unnest(ops) x ORDER BY x.n),
                                     ARRAY(SELECT x.key_hash FROM unnest(ops) x ORDER BY x.n)) k
               ON k.n = o.n
        WHERE o.class IN ('spend', 'settle')
        ORDER BY o.n
    LOOP
        CONTINUE WHEN r.verdict = 'ok';
        refused := refused || r.n;
        op_position := r.n; outcome := r.verdict; object := NULL;
        detail := CASE WHEN r.verdict = 'not_found' THEN '{"what": "account"}'::jsonb END;
        RETURN NEXT;
    END LOOP;

    FOR k IN 0 .. last_round LOOP
        -- The round's items of each class, in one pass.
        SELECT array_agg(ROW(o.n, o.op, o.account, o.actor, o.request, o.amount, o.requested_ttl,
                             o.ttl, o.new_id, o.job, o.hash, o.kind, o.params)::engine_spend_item
                         ORDER BY o.n) FILTER (WHERE o.class = 'spend'),
               array_agg(ROW(o.n, o.op, o.account, o.reservation, o.amount, o.ttl::double precision,
                             NULL, NULL, o.actor)::engine_settle_item ORDER BY o.n)
                   FILTER (WHERE o.class = 'settle'),
               COALESCE(bool_or(o.class = 'external'), false),
               COALESCE(bool_or(o.class = 'job'), false)
        INTO spends, settles, externals, finishes
        FROM unnest(ops) o
        WHERE o.round = k AND (o.class IN ('external', 'job') OR o.n <> ALL (refused));
        IF spends IS NOT NULL THEN
            RETURN QUERY SELECT s.pos, s.outcome, s.detail, s.object FROM engine_spend(spends) s;
        END IF;

        IF settles IS NOT NULL THEN
            RETURN QUERY
            SELECT s.pos, s.outcome, s.detail,
                   CASE WHEN (s.reservation).id IS NOT NULL THEN to_jsonb(s.reservation) END
            FROM engine_settle(settles) s;
        END IF;

        CONTINUE WHEN NOT (externals OR finishes);
        FOR e IN SELECT o.* FROM unnest(ops) o
                 WHERE o.round = k AND o.class IN ('external', 'job') ORDER BY o.n LOOP
            op_position := e.n; detail := NULL; object := NULL;
            IF e.class = 'external' THEN
                SELECT * INTO r FROM engine_external(
                    CASE e.op WHEN 'credit' THEN 'credit' ELSE 'adjustment' END, e.account,
                    e.new_id, e.amount, e.external_ref, e.note, e.reason, e.actor,
                    e.http_request_id, e.priority, e.expires_at, NULL);
                outcome := r.outcome; detail := r.detail; object := r.object;
            ELSE
                -- The job's account is locked above only if it is the one
                -- the operation names: any other is refused unread.
                SELECT g.account_id INTO owner FROM generation_jobs g WHERE g.id = e.job;
                IF owner IS DISTINCT FROM e.account THEN
                    outcome := 'not_found'; detail := '{"what": "job"}';
                ELSE
                    SELECT * INTO f FROM engine_finish_job(e.job, e.lease_token, NULL, e.status,
                        e.result, e.error, e.reason, e.actor);
                    outcome := f.outcome;
                    object := jsonb_build_object('job', to_jsonb(f.job) - 'request_hash',
                        'reservation', to_jsonb(f.reservation), 'resolved', f.resolved);
                END IF;
            END IF;
            RETURN NEXT;
        END LOOP;
    END LOOP;

    -- (engine_tally's test, inline: most batches leave no tally, and a
    -- function call per batch is not free.)
    IF COALESCE(current_setting('token_billing.grant_expired', true), '') NOT IN ('', '0')
       OR COALESCE(current_setting('token_billing.topup_credited', true), '') NOT IN ('', '0') THEN
        op_position := 0; outcome := 'tallies'; object := NULL;
        detail := jsonb_build_object('grant_expired', engine_tally_take('grant_expired'),
                                     'topup_credited', engine_tally_take('topup_credited'));
        RETURN NEXT;
    END IF;
END;
$$;

-- The entry point: the batch's leading plain operations on the lean path
-- (one or two reserves, job creations, commits or releases: 66_lone.sql, a
-- few statements of the size of a hand-written one each — the service
-- calls that path directly for a batch of one, src/engine/mod.rs; three or
-- more: 68_lean.sql, one statement for all of them), then everything from the
-- first operation that is not plain on (a refusal, a replay, a lapse, an
-- event, another kind of operation) in engine_apply_full, in the same
-- transaction: each operation gets the answer it would have had alone at
-- its place, whichever path decided it. The lean path first locks all the
-- batch's accounts in id order, as engine_apply_full does, so two batches
-- never wait on each other crosswise. The setting
-- token_billing.lean = off sends every batch to engine_apply_full, and
-- token_billing.lean = batch one or two operations to the batch statement
-- (the tests compare the paths with them).
CREATE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    batch integer := COALESCE(cardinality(p_ops), 0);
    done integer := 0;
    lean integer := 0;
    o engine_request;
    applied record;
    path text := COALESCE(current_setting('token_billing.lean', true), '');
BEGIN
    IF batch = 0 THEN
        RETURN;
    END IF;
    IF batch <= 64 AND path <> 'off' THEN
        -- The leading operations of the lean kinds, each with every field
        -- it needs (engine_apply_full refuses a batch with a field
        -- missing, and then nothing at all is written).
        FOR i IN 1 .. batch LOOP
            o := p_ops[i];
            EXIT WHEN o.op NOT IN ('reserve', 'create_job', 'commit', 'commit_all', 'release')
                   OR engine_op_incomplete(o.op, o.account, o.actor, o.authorized, o.key_id,
                          o.key_hash, o.request, o.amount, o.ttl, o.new_id, o.job, o.hash,
                          o.kind, o.params, o.reservation, o.external_ref, o.reason,
                          o.priority, o.lease_token, o.status, o.result, o.expires_at)
                      IS NOT FALSE;
            lean := i;
        END LOOP;
        IF lean = batch AND batch <= 2 AND engine_lone_applies(o.op) THEN
            -- One or two plain operations: the lone path (66_lone.sql), one
            -- after the other. For two, cheaper than the batch statement,
            -- whose plan is started whole for every batch (9 % fewer
            -- instructions for a batch of two, 11 % more for three:
            -- BENCHMARKS.md); their accounts are locked first, in id order,
            -- as the batch statement locks them.
            IF batch > 1 THEN
                PERFORM 1 FROM accounts
                WHERE id = ANY (ARRAY(SELECT b.account FROM unnest(p_ops) b))
                ORDER BY id FOR NO KEY UPDATE;
            END IF;
            WHILE done < batch LOOP
                o := p_ops[done + 1];
                object := engine_lean_one_of(o);
                EXIT WHEN object IS NULL;
                done := done + 1;
                op_position := done; outcome := engine_plain_outcome(o.op); detail := NULL;
                RETURN NEXT;
            END LOOP;
            IF done = batch THEN
                RETURN;
            END IF;
        ELSIF lean > 0 THEN
            FOR applied IN SELECT * FROM engine_lean_batch(p_ops, p_ops[:lean]) LOOP
                op_position := applied.op_position; outcome := applied.outcome;
                detail := NULL; object := applied.object;
                RETURN NEXT;
                done := applied.op_position;
            END LOOP;
            IF done = batch THEN
                RETURN;
            END IF;
        END IF;
        -- Then the job finishes that end the batch (the service puts a
        -- batch's finishes last: src/coalesce.rs), each on the lone path
        -- while it is plain, once everything before them was applied.
        -- First the batch's accounts in id order, then the jobs the rest
        -- of the batch finishes, in id order, as engine_apply_full locks
        -- them: a lone finish locks only its own account and job, and in
        -- batch order two batches could wait on each other crosswise.
        IF done = lean AND done < batch AND p_ops[done + 1].op = 'finish_job'
           AND engine_lone_applies('finish_job') THEN
            PERFORM 1 FROM accounts WHERE id = ANY (ARRAY(SELECT b.account FROM unnest(p_ops) b))
            ORDER BY id FOR NO KEY UPDATE;
            PERFORM 1 FROM generation_jobs g
            WHERE g.id = ANY (ARRAY(SELECT j.job FROM unnest(p_ops[done + 1:]) j
                                    WHERE j.op = 'finish_job'))
              AND g.account_id = ANY (ARRAY(SELECT b.account FROM unnest(p_ops) b))
            ORDER BY g.id FOR UPDATE;
            WHILE done < batch AND p_ops[done + 1].op = 'finish_job' LOOP
                o := p_ops[done + 1];
                object := engine_lean_one_of(o);
                EXIT WHEN object IS NULL;
                done := done + 1;
                op_position := done; outcome := engine_plain_outcome('finish_job');
                detail := NULL;
                RETURN NEXT;
            END LOOP;
            IF done = batch THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    RETURN QUERY
    SELECT CASE WHEN f.op_position = 0 THEN 0 ELSE f.op_position + done END,
           f.outcome, f.detail, f.object
    FROM engine_apply_full(p_ops[done + 1:]) f;
END;
$$;
