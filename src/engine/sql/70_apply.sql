-- The one entry point: every money operation of the API, the workers and
-- the tests goes through engine_apply, alone or coalesced with concurrent
-- ones (a single request is a batch of one).

-- Whether an operation lacks a field its kind needs, carries one it may
-- not, or names an unknown kind (the fields each kind sets are listed at
-- engine_apply), written once: engine_apply refuses a batch holding such
-- an operation, and then nothing at all is written.
CREATE FUNCTION engine_op_incomplete(o engine_request) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT o.account IS NULL OR o.actor IS NULL OR NOT CASE o.op
        WHEN 'reserve' THEN o.request IS NOT NULL AND o.amount IS NOT NULL AND o.ttl IS NOT NULL
                            AND o.new_id IS NOT NULL
        WHEN 'create_job' THEN o.request IS NOT NULL AND o.amount IS NOT NULL AND o.ttl IS NOT NULL
                            AND o.new_id IS NOT NULL AND o.job IS NOT NULL AND o.hash IS NOT NULL
                            AND o.kind IS NOT NULL AND o.params IS NOT NULL
        WHEN 'commit' THEN o.reservation IS NOT NULL AND o.amount IS NOT NULL
        WHEN 'commit_all' THEN o.reservation IS NOT NULL AND o.amount IS NULL
        WHEN 'release' THEN o.reservation IS NOT NULL
        WHEN 'extend' THEN o.reservation IS NOT NULL AND o.ttl IS NOT NULL
        WHEN 'credit' THEN o.new_id IS NOT NULL AND o.amount IS NOT NULL
                           AND o.external_ref IS NOT NULL AND o.priority IS NOT NULL
        WHEN 'adjust' THEN o.new_id IS NOT NULL AND o.amount IS NOT NULL
                           AND o.external_ref IS NOT NULL AND o.reason IS NOT NULL
                           AND (o.priority IS NOT NULL) = (o.amount > 0)
        WHEN 'finish_job' THEN o.job IS NOT NULL AND o.lease_token IS NOT NULL
                           AND (o.status = 'succeeded' AND o.result IS NOT NULL
                                OR o.status = 'failed' AND o.result IS NULL)
        ELSE false END
       OR (o.expires_at IS NOT NULL AND NOT (o.op IN ('credit', 'adjust') AND o.amount > 0))
       OR o.authorized IS NULL
       -- Credits, adjustments and job finishes are the service's own
       -- (authorised); a spending operation's key is verified here.
       OR (o.authorized = false AND (o.op IN ('credit', 'adjust', 'finish_job')
                                     OR o.key_id IS NULL OR o.key_hash IS NULL))
$$;

-- A batch of operations on any accounts, in one statement (one
-- transaction, one WAL flush): each operation decided and written by the
-- same functions, whatever the batch's size or caller.
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
-- the same statement (engine_key_refusal). Credits, adjustments and job
-- finishes are always authorised by the caller; http_request_id is the
-- audit event's request id. A missing field is an error (the whole batch
-- fails, nothing is written), never a default.
--
-- The batch's accounts are locked in id order first, then the jobs it
-- finishes in id order (a replica's heartbeat takes job rows in id order
-- too, without account locks, so the two never wait on each other
-- crosswise); two batches never deadlock. Then each operation, in array
-- order, is decided and written by its function — engine_spend (reserve,
-- create_job), engine_settle (commit, commit_all, release, extend),
-- engine_external (credit, adjust), engine_finish_job (finish_job) — each
-- seeing what the ones before it wrote, and every movement goes through
-- the one write path, engine_record. Returns one row per operation: its
-- position (1-based), outcome, detail and object (JSON); and, when the
-- batch left a tally (engine_tally: tokens of lapsed grants expired, or
-- tokens top-up rules credited), a row at position 0, outcome tallies,
-- detail {grant_expired, topup_credited}, for the caller's metrics.
CREATE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    batch integer := COALESCE(cardinality(p_ops), 0);
    o engine_request;
    k record;
    r record;
    stale uuid[] := '{}';
BEGIN
    IF batch = 0 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. batch LOOP
        IF engine_op_incomplete(p_ops[i]) IS NOT FALSE THEN
            RAISE EXCEPTION 'engine_apply: operation % (%) lacks a required field or names an unknown operation',
                i, COALESCE(p_ops[i].op, 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    PERFORM 1 FROM accounts WHERE id = ANY (ARRAY(SELECT u.account FROM unnest(p_ops) u))
    ORDER BY id FOR NO KEY UPDATE;
    PERFORM 1 FROM generation_jobs g
    WHERE g.id = ANY (ARRAY(SELECT u.job FROM unnest(p_ops) u WHERE u.op = 'finish_job'))
      AND g.account_id = ANY (ARRAY(SELECT u.account FROM unnest(p_ops) u))
    ORDER BY g.id FOR UPDATE;
    FOR i IN 1 .. batch LOOP
        o := p_ops[i];
        op_position := i; detail := NULL; object := NULL;
        IF NOT o.authorized THEN
            -- A spending operation whose key does not verify, or may not
            -- spend on this account, is answered here and goes no further.
            SELECT * INTO k FROM engine_key_refusal(o.authorized, o.key_id, o.key_hash, o.account);
            IF k.valid_key IS NOT NULL AND engine_key_use_stale(k.last_used_at)
               AND NOT k.valid_key = ANY (stale) THEN
                stale := stale || k.valid_key;
            END IF;
            IF k.refusal IS NOT NULL THEN
                outcome := k.refusal;
                detail := CASE WHEN k.refusal = 'not_found' THEN '{"what": "account"}'::jsonb END;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        CASE
            WHEN o.op IN ('reserve', 'create_job') THEN
                SELECT * INTO r FROM engine_spend(o);
                outcome := r.outcome; detail := r.detail; object := r.object;
            WHEN o.op IN ('commit', 'commit_all', 'release', 'extend') THEN
                SELECT * INTO r FROM engine_settle(o.op, o.account, o.reservation, o.amount,
                                                   o.ttl, NULL, NULL, o.actor);
                outcome := r.outcome; detail := r.detail;
                object := CASE WHEN (r.reservation).id IS NOT NULL THEN to_jsonb(r.reservation) END;
            WHEN o.op IN ('credit', 'adjust') THEN
                SELECT * INTO r FROM engine_external(
                    CASE o.op WHEN 'credit' THEN 'credit' ELSE 'adjustment' END, o.account,
                    o.new_id, o.amount, o.external_ref, o.note, o.reason, o.actor,
                    o.http_request_id, o.priority, o.expires_at, NULL);
                outcome := r.outcome; detail := r.detail; object := r.object;
            ELSE
                -- A job of another account than the one named is refused
                -- unread (only the named account is locked).
                IF NOT EXISTS (SELECT 1 FROM generation_jobs g
                               WHERE g.id = o.job AND g.account_id = o.account) THEN
                    outcome := 'not_found'; detail := '{"what": "job"}';
                ELSE
                    SELECT * INTO r FROM engine_finish_job(o.job, o.lease_token, NULL, o.status,
                        o.result, o.error, o.reason, o.actor);
                    outcome := r.outcome;
                    object := jsonb_build_object('job', to_jsonb(r.job) - 'request_hash',
                        'reservation', to_jsonb(r.reservation), 'resolved', r.resolved);
                END IF;
        END CASE;
        RETURN NEXT;
    END LOOP;
    IF cardinality(stale) > 0 THEN
        PERFORM engine_touch_keys(stale);
    END IF;
    -- (engine_tally's test, inline: most batches leave no tally.)
    IF COALESCE(current_setting('token_billing.grant_expired', true), '') NOT IN ('', '0')
       OR COALESCE(current_setting('token_billing.topup_credited', true), '') NOT IN ('', '0') THEN
        op_position := 0; outcome := 'tallies'; object := NULL;
        detail := jsonb_build_object('grant_expired', engine_tally_take('grant_expired'),
                                     'topup_credited', engine_tally_take('topup_credited'));
        RETURN NEXT;
    END IF;
END;
$$;
