-- engine_apply, the one entry point of every money operation, and its helpers.

-- Whether operation `o` lacks a field its kind needs, carries one it may not, or names an unknown
-- kind: the boundary's contract, written once (each branch lists what its kind needs; every other
-- field is NULL). engine_apply then refuses the whole batch, writing nothing. (A branch per kind:
-- only the one used is compiled in a transaction, tests/api/operation_fields.rs.)
-- Every kind needs account, actor and `authorized`: true when the service vouches for the caller
-- (the ADMIN_API_KEY admin, an admin request, a worker, the reaper); false when the operation
-- carries the caller's key_id and key_hash (SHA-256 of its secret), verified by engine_apply.
-- Credits, adjustments, expiries, job finishes and a job's settlements are always authorized. A
-- settlement (commit … expire) may name the acting `job` (its worker or the reaper, never the API)
-- and a ledger `reason`; http_request_id is the audit event's request id.
CREATE FUNCTION engine_op_incomplete(o engine_request) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF (o.account IS NULL OR o.actor IS NULL OR o.authorized IS NULL
        OR ((o.expires_at IS NOT NULL OR o.amount_paid IS NOT NULL OR o.currency IS NOT NULL)
            AND NOT (o.op IN ('credit', 'adjust') AND o.amount > 0))
        OR (o.amount_paid IS NULL) <> (o.currency IS NULL)
        OR (o.authorized = false AND (o.op IN ('credit', 'adjust', 'finish_job', 'expire')
                                      OR o.key_id IS NULL OR o.key_hash IS NULL
                                      OR (o.job IS NOT NULL AND o.op <> 'create_job'))))
       IS NOT FALSE THEN
        RETURN true;
    END IF;
    CASE o.op
        WHEN 'reserve' THEN  -- new_id: the reservation; requested_ttl as sent (NULL: none)
            RETURN o.request IS NULL OR o.amount IS NULL OR o.ttl IS NULL OR o.new_id IS NULL;
        WHEN 'commit_all' THEN  -- (the WHENs are tried in order: the commonest first)
            RETURN o.reservation IS NULL OR o.amount IS NOT NULL;
        WHEN 'commit' THEN  -- amount: exactly this many
            RETURN o.reservation IS NULL OR o.amount IS NULL;
        WHEN 'create_job' THEN  -- amount: the job's cost
            RETURN o.request IS NULL OR o.amount IS NULL OR o.ttl IS NULL OR o.new_id IS NULL
                OR o.job IS NULL OR o.hash IS NULL OR o.kind IS NULL OR o.params IS NULL;
        WHEN 'release', 'expire' THEN  -- expire: the reaper's, past the expiry
            RETURN o.reservation IS NULL;
        WHEN 'extend' THEN
            RETURN o.reservation IS NULL OR o.ttl IS NULL;
        WHEN 'credit' THEN
            -- priority: its grant's; note, expires_at (NULL: never) and the price (amount_paid and
            -- currency, both or neither) may be NULL.
            RETURN o.new_id IS NULL OR o.amount IS NULL OR o.external_ref IS NULL
                OR o.priority IS NULL;
        WHEN 'adjust' THEN  -- priority: its grant's, exactly when amount > 0
            RETURN o.new_id IS NULL OR o.amount IS NULL OR o.external_ref IS NULL
                OR o.reason IS NULL OR (o.priority IS NOT NULL) <> (o.amount > 0);
        WHEN 'finish_job' THEN  -- account: the job's; error, reason (a release's): may be NULL
            RETURN o.job IS NULL OR o.lease_token IS NULL
                OR NOT COALESCE(o.status = 'succeeded' AND o.result IS NOT NULL
                                OR o.status = 'failed' AND o.result IS NULL, false);
        ELSE
            RETURN true;
    END CASE;
END;
$$;

-- What a batch of operations `p_ops` decides on, read once for the batch: the accounts `p_ids` that
-- exist, locked (FOR NO KEY UPDATE) in id order, so two batches never wait on each other crosswise,
-- and read once locked; the batch's stamp (engine_now), taken after the locks; then, in a statement
-- of its own (one begun before a lock's wait would not see what the batch before it wrote): if
-- `p_keyed`, the key each operation presents, in order (the valid key, engine_valid_key, or NULL
-- when not valid or the operation is authorized); if `p_spends`, for each account a reserve or a
-- job creation spends on, its drawable tokens in draw order (engine_grant_pools) and whether a
-- grant of it is due to lapse (engine_lapsing_grants; `lapsing` lists those accounts).
CREATE FUNCTION engine_lock_accounts(p_ids uuid[], p_ops engine_request[], p_keyed boolean,
    p_spends boolean, OUT ids uuid[],
    OUT accounts engine_account[], OUT at timestamptz, OUT keys engine_key[],
    OUT pools engine_pool[], OUT lapsing uuid[])
LANGUAGE plpgsql AS $$
BEGIN
    -- (In the sub-query's order: an aggregate's own ORDER BY sorts again.)
    SELECT COALESCE(array_agg(x.id), '{}'),
           COALESCE(array_agg(ROW(x.id, x.status, x.available, x.reserved, x.used, x.credited,
                                  x.adjusted, x.grant_expired, x.active_reservations,
                                  x.max_active_reservations, x.low_balance_threshold,
                                  x.balance_low, x.topup_threshold, x.topup_armed,
                                  x.topup_unconsumed)::engine_account), '{}')
    INTO ids, accounts
    FROM (SELECT * FROM public.accounts WHERE id = ANY (p_ids) ORDER BY id FOR NO KEY UPDATE) x;
    at := engine_now();
    IF p_keyed THEN
        keys := ARRAY(SELECT (SELECT v::engine_key FROM engine_valid_key(p.key_id, p.key_hash) v
                              WHERE NOT p.authorized LIMIT 1)
                      FROM unnest(p_ops) WITH ORDINALITY AS p ORDER BY p.ordinality);
    END IF;
    IF p_spends THEN
        WITH spending AS (SELECT DISTINCT u.account FROM unnest(p_ops) u
                          WHERE u.op IN ('reserve', 'create_job'))
        SELECT ARRAY(SELECT g::engine_pool
                     FROM spending s CROSS JOIN LATERAL engine_grant_pools(s.account) g),
               ARRAY(SELECT s.account FROM spending s
                     WHERE EXISTS (SELECT 1 FROM engine_lapsing_grants(s.account, at)))
        INTO pools, lapsing;
    END IF;
END;
$$;

-- The account `a` after the movements `p_moves` (engine_deltas, the arithmetic engine_record
-- writes): the batch's picture of an account whose movements are not written yet.
CREATE FUNCTION engine_moved(a engine_account, p_moves engine_movement[]) RETURNS engine_account
LANGUAGE plpgsql AS $$
DECLARE
    m engine_movement;
    d engine_balances;
BEGIN
    FOREACH m IN ARRAY p_moves LOOP
        d := engine_deltas(m.kind, m.amount, m.reservation);
        a := engine_account_moved(a, d, m.active_delta);
    END LOOP;
    RETURN a;
END;
$$;

-- The one entry point: a batch of operations `p_ops` on any accounts, in one transaction. Callers:
-- the coalescer (src/engine/mod.rs) for the API and the workers' finishes, with engine_tallies
-- after it; engine_heartbeat_jobs, engine_finish_job, engine_fixup, engine_expire_due. Returns one
-- row per operation: its position (1-based), outcome, detail and object (JSON).
-- Locks and reads: engine_lock_accounts; then the jobs the batch finishes, locked in id order (as a
-- heartbeat takes them). Each operation, in order, is decided by its kind's function (engine_spend,
-- engine_settle, engine_external, engine_finish_job; a key's refusal: engine_key_refusal) on its
-- account as the earlier operations left it (`accts`, engine_moved).
-- Pending writes: what engine_spend and engine_settle decide (`moves`, `made`, `changed`, `jobs`,
-- `budgets`) waits for one engine_record call (every account's row once, one statement per table).
-- They are flushed first when an operation must see them: a credit, adjustment or job finish (these
-- write at once); the same request_id or reservation again (`touched`); a reserve or job creation
-- on an account a pending movement gave tokens back to (`returned`: the draw order moved); a
-- grant's lapse. After any write engine_lock_accounts reads again (a top-up may have moved an
-- account); a flush also restarts `spent` (engine_spend's p_from: where the next reserve draws in
-- the pools read) and `returned`.
-- Plans: every statement run here or in its callees is planned once per session
-- (force_generic_plan) and reads a few rows by key, so enable_seqscan is off: a generic plan made
-- on a new database's small tables would scan them whole long after they grew.
CREATE FUNCTION engine_apply(p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, detail jsonb, object jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    batch integer := COALESCE(cardinality(p_ops), 0);
    o engine_request;
    ids uuid[];               -- the batch's accounts that exist, in id order
    accts engine_account[];   -- each as the batch has left it so far
    presented engine_key;
    -- (Arrays and flags start NULL, none and false: an initial value is an expression to set up.)
    last_op integer[];        -- each one's last operation in the batch (a batch of one: none)
    spent bigint[];           -- tokens the pending reserves drew from each
    returned boolean[];       -- whether a pending movement gave tokens back to it
    touched text[];           -- the request_ids and reservations pending
    moves engine_movement[];
    made engine_reservation[];
    changed engine_reservation[];
    jobs engine_job[];
    budgets engine_budget_move[] := '{}';  -- the keys' budget counts pending
    bm engine_budget_move;
    pending bigint;
    stale uuid[];
    op_moves engine_movement[];
    op_changed boolean;
    at timestamptz;
    a engine_account;
    j integer;
    r record;
    mark text;
    finishes boolean;
    keyed boolean;            -- whether an operation presents a key
    spends boolean;           -- whether one is a reserve or a job creation
    named uuid[];             -- the accounts the operations name
    locked record;
    -- engine_record's count: assigned, not PERFORMed, which skips the executor's start-up.
    written integer;
BEGIN
    IF batch = 0 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. batch LOOP
        o := p_ops[i];  -- in a variable: each read of p_ops[i] in the check would fetch it again
        IF engine_op_incomplete(o) IS NOT FALSE THEN
            RAISE EXCEPTION 'engine_apply: operation % (%) lacks a required field or names an unknown operation',
                i, COALESCE(o.op, 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        finishes := finishes OR o.op = 'finish_job';
        keyed := keyed OR NOT o.authorized;
        spends := spends OR o.op IN ('reserve', 'create_job');
        named := named || o.account;
    END LOOP;
    locked := engine_lock_accounts(named, p_ops, keyed, spends);
    ids := locked.ids;
    accts := locked.accounts;
    at := locked.at;
    IF finishes THEN
        PERFORM 1 FROM generation_jobs g
        WHERE g.id = ANY (ARRAY(SELECT u.job FROM unnest(p_ops) u WHERE u.op = 'finish_job'))
          AND g.account_id = ANY (ids)
        ORDER BY g.id FOR UPDATE;
    END IF;
    IF batch > 1 THEN
        FOR i IN 1 .. batch LOOP
            j := array_position(ids, p_ops[i].account);
            IF j IS NOT NULL THEN
                last_op[j] := i;
            END IF;
        END LOOP;
    END IF;
    FOR i IN 1 .. batch LOOP
        o := p_ops[i];
        j := array_position(ids, o.account);
        op_position := i;  -- (each branch sets outcome, detail and object)
        -- (A local CASE: a function taking the operation whole is not inlined, and costs a call.)
        mark := CASE WHEN o.op IN ('reserve', 'create_job') THEN o.op || ':' || o.request
                     ELSE o.reservation::text END;
        -- Flush first if needed; the inner IF is compiled only once writes are pending.
        IF cardinality(moves) > 0 OR cardinality(changed) > 0 THEN
            IF o.op IN ('credit', 'adjust', 'finish_job') OR mark = ANY (touched)
               OR (o.op IN ('reserve', 'create_job') AND returned[j]) THEN
                written := engine_record(moves, made, changed, jobs, budgets, locked.accounts);
                moves := '{}'; made := '{}'; changed := '{}'; jobs := '{}'; touched := '{}';
                budgets := '{}';
                spent := '{}';
                returned := '{}';
                locked := engine_lock_accounts(ids, p_ops, keyed, spends);
                accts := locked.accounts;
            END IF;
        END IF;
        IF o.op IN ('credit', 'adjust', 'finish_job') THEN
            IF o.op = 'finish_job' THEN
                -- Another account's job is refused unread (only the named account is locked).
                IF NOT EXISTS (SELECT 1 FROM generation_jobs g
                               WHERE g.id = o.job AND g.account_id = o.account) THEN
                    outcome := 'not_found'; detail := '{"what": "job"}'; object := NULL;
                ELSE
                    SELECT * INTO r FROM engine_finish_job(o.job, o.lease_token, NULL, o.status,
                        o.result, o.error, o.reason, o.actor);
                    outcome := r.outcome; detail := NULL;
                    object := jsonb_build_object('job', to_jsonb(r.job) - 'request_hash',
                        'reservation', to_jsonb(r.reservation), 'resolved', r.resolved);
                END IF;
            ELSE
                SELECT * INTO r FROM engine_external(
                    CASE o.op WHEN 'credit' THEN 'credit' ELSE 'adjustment' END, o.account,
                    o.new_id, o.amount, o.external_ref, o.note, o.reason, o.actor,
                    o.http_request_id, o.priority, o.expires_at, o.amount_paid, o.currency, NULL,
                    o.key_id, NULL);
                outcome := r.outcome; detail := r.detail; object := r.object;
            END IF;
            IF j IS NOT NULL THEN
                locked := engine_lock_accounts(ids, p_ops, keyed, spends);
                accts := locked.accounts;
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Refusal first; a valid key's stale use is written anyway, once (engine_touch_keys).
        presented := (locked.keys)[i];
        IF presented.key_id IS NOT NULL AND engine_key_use_stale(presented.last_used_at) THEN
            stale := stale || presented.key_id;
        END IF;
        outcome := engine_key_refusal(o.authorized, presented, o.account);
        IF outcome IS NOT NULL THEN
            detail := CASE outcome WHEN 'not_found' THEN '{"what": "account"}'::jsonb END;
            object := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        a := accts[j];
        IF o.op IN ('reserve', 'create_job') THEN
            -- What pending reserves took from this key's budget (a loop: most batches have none).
            pending := 0;
            FOREACH bm IN ARRAY budgets LOOP
                IF bm.key_id = o.key_id AND bm.tokens > 0 THEN
                    pending := pending + bm.tokens;
                END IF;
            END LOOP;
            LOOP
                r := engine_spend(o, a, COALESCE(spent[j], 0), at, presented, pending,
                                  locked.pools, o.account = ANY (locked.lapsing));
                EXIT WHEN r.lapsing IS NOT TRUE;
                -- A grant lapses: write the pending writes, then the lapse, and decide again.
                IF cardinality(moves) > 0 OR cardinality(changed) > 0 THEN
                    written := engine_record(moves, made, changed, jobs, budgets, locked.accounts);
                    moves := '{}'; made := '{}'; changed := '{}'; jobs := '{}'; touched := '{}';
                    budgets := '{}'; pending := 0;
                    spent := '{}';
                    returned := '{}';
                END IF;
                PERFORM engine_lapse_grants(ARRAY[o.account], at);
                locked := engine_lock_accounts(ids, p_ops, keyed, spends);
                accts := locked.accounts;
                a := accts[j];
            END LOOP;
            op_moves := r.moves;  -- (NULL unless created)
            op_changed := false;
            IF r.outcome = 'created' THEN
                made := made || r.made;
                IF (r.budget).key_id IS NOT NULL THEN
                    budgets := budgets || r.budget;
                END IF;
                IF o.op = 'create_job' THEN
                    jobs := jobs || r.job;
                END IF;
                spent[j] := COALESCE(spent[j], 0) + o.amount;
            END IF;
        ELSE
            r := engine_settle(o, at, presented);
            op_moves := r.moves;
            op_changed := (r.changed).id IS NOT NULL;
            IF op_changed THEN
                changed := changed || r.changed;
            END IF;
            IF (r.budget).key_id IS NOT NULL THEN
                budgets := budgets || r.budget;
            END IF;
        END IF;
        IF cardinality(op_moves) > 0 OR op_changed THEN
            moves := moves || op_moves;
            IF i < batch THEN
                touched := touched || mark;
                IF last_op[j] > i AND cardinality(op_moves) > 0 THEN
                    -- A later operation on this account (last_op) must see it moved.
                    accts[j] := engine_moved(a, op_moves);
                    returned[j] := returned[j] IS TRUE OR (accts[j]).available > a.available;
                END IF;
            END IF;
        END IF;
        outcome := r.outcome; detail := r.detail; object := r.object;
        RETURN NEXT;
    END LOOP;
    IF cardinality(moves) > 0 OR cardinality(changed) > 0 THEN
        written := engine_record(moves, made, changed, jobs, budgets, locked.accounts);
    END IF;
    IF cardinality(stale) > 0 THEN
        PERFORM engine_touch_keys(stale);
    END IF;
END;
$$;

-- The tallies the transaction left for the caller's metrics (engine_tally: tokens of lapsed grants
-- expired, tokens top-up rules credited), taken: one row {grant_expired, topup_credited}, or none.
-- The service asks for it after engine_apply, in the same statement.
CREATE FUNCTION engine_tallies() RETURNS SETOF jsonb
LANGUAGE plpgsql AS $$
BEGIN
    -- engine_tally's test, inline: most batches leave no tally.
    IF COALESCE(current_setting('token_billing.grant_expired', true), '') NOT IN ('', '0')
       OR COALESCE(current_setting('token_billing.topup_credited', true), '') NOT IN ('', '0') THEN
        RETURN NEXT jsonb_build_object('grant_expired', engine_tally_take('grant_expired'),
                                       'topup_credited', engine_tally_take('topup_credited'));
    END IF;
END;
$$;
