-- The lean path's batch statement: what kiosks send most — reserves and
-- jobs, commits (of all or part of what is held) and releases, a few
-- together — applied as a set, in ONE statement for the whole batch
-- (engine_apply in `70_apply.sql` calls engine_lean_batch with the batch's
-- leading operations of these kinds; it takes the row locks of all the
-- batch's accounts first, in id order). A batch of one or two reserves,
-- job creations, commits or releases takes the lone path instead
-- (engine_lean_one, `66_lone.sql`, once per operation): this statement's
-- plan is started whole for every batch, which a batch of three or more
-- pays once and one or two operations would pay for little.
--
-- It decides only the plain case, where the answer is the success and no
-- event is due: the key verifies and may spend here, the account is active
-- and keeps at least one token and a free reservation slot after the
-- batch's reserves so far, the request_id is new (in the database and in
-- the batch), no grant of the account is due to lapse, a settlement is of
-- a held, unexpired reservation of the account (once in the batch) and
-- returns nothing to a lapsed grant, and no movement crosses the
-- low-balance threshold or a top-up rule's line (80_topups.sql), or empties
-- the account. The operations are checked in batch order as if one by one,
-- each after the ones before it
-- (the balances and reservation counts of the account carried forward);
-- the batch's plain prefix — everything before its first operation that
-- is not plain — is applied, and engine_apply hands that first operation
-- and everything after it to the full machinery (engine_apply_full),
-- which then decides them as if one by one after the ones applied here.
-- The answers are the ones the full machinery would have given, operation
-- by operation: the differential test compares the service with the model
-- on every step both ways, and tests/api/lean.rs compares the two paths on
-- the same batches.
--
-- Two things are decided more cautiously than one by one would, which
-- only ever sends an operation to the full machinery, never changes an
-- answer: a reserve after a settlement that returned tokens to the same
-- account in the batch (the draw order would change) is not plain, and
-- the reservation slots freed by settlements earlier in the batch are not
-- counted.
--
-- The rules are not written again here: the key's validity and when its
-- use is written (engine_key_may: engine_valid_key and
-- engine_spend_authority; engine_key_use_stale, engine_touch_keys), the
-- draw order (engine_grant_pools, engine_draws), a settlement's split over
-- its draws (engine_split_draws), what a movement does to the account
-- and to its grant (engine_deltas, engine_grant_deltas), the low-balance
-- state (engine_is_low) and a grant's lapse (engine_grant_lapse_due) are the
-- functions the full machinery calls, inlined; what makes a case plain
-- (engine_spend_plain, engine_settle_plain, engine_request_taken,
-- engine_lapsing_grants, engine_lapsed_draws) is written once in
-- `66_lone.sql`, for this statement and the lone path. What this
-- statement adds is only the arithmetic of a batch's running balances
-- (and the cautions below).
--
-- Why one statement: PostgreSQL's cost of a statement is mostly fixed —
-- executor start-up of its plan, and for every table it writes the
-- parsing and preparing of that table's CHECK constraints — so N
-- operations in one statement cost little more than one (BENCHMARKS.md,
-- "Where the time goes").

-- The batch's leading lean operations `p_ops` (engine_request, as
-- engine_apply's; job, hash, kind and params are read only for a
-- create_job). `p_lock` is the whole batch: the rows of all its accounts
-- are locked here first, in id order (in this function, so that the lock's
-- statement keeps its one generic plan: planned anew for every batch, as a
-- custom plan, it cost a planning per batch). Returns one row per
-- operation applied, from the first, in order:
-- its position, outcome (created, committed, released) and the object the
-- API shows (the reservation, or the job as engine_job_view shows it). No
-- row for an operation means it and every one after it were not applied:
-- nothing of them was written.
CREATE FUNCTION engine_lean_batch(p_lock engine_request[], p_ops engine_request[])
RETURNS TABLE (op_position integer, outcome text, object jsonb)
-- Every table access here is a look-up by key of a few rows: the one
-- generic plan, made once per session for every batch size, must not
-- scan a whole table because the statistics say it is small (they were
-- taken when it was) or a batch of ten operations is assumed.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    at timestamptz;
    applied record;
    stale uuid[] := '{}';
BEGIN
    PERFORM 1 FROM accounts WHERE id = ANY (ARRAY(SELECT l.account FROM unnest(p_lock) l))
    ORDER BY id FOR NO KEY UPDATE;
    -- The transaction's stamp is taken after its accounts' locks (as every
    -- writer takes it, engine_now): a batch that waited for a lock never
    -- writes an entry stamped before the transactions it waited for
    -- committed — an instant they closed (a restore target, a closed
    -- period) stays closed.
    at := engine_now();
    -- This statement's snapshot is taken after those locks: it sees
    -- every reservation and grant committed before them. Reservations
    -- change only under their account's lock, so what it reads of them
    -- stays true until the end of the transaction.
    FOR applied IN
    WITH o AS MATERIALIZED (
        SELECT u.n::integer AS n, u.op, u.account, u.actor, u.key_id, u.key_hash,
               u.authorized, u.request, u.amount, u.requested_ttl, u.ttl, u.new_id,
               CASE WHEN u.op = 'create_job' THEN u.job END AS job, u.reservation,
               CASE WHEN u.op = 'create_job' THEN u.hash END AS hash,
               CASE WHEN u.op = 'create_job' THEN u.kind END AS kind,
               CASE WHEN u.op = 'create_job' THEN u.params END AS params,
               u.op IN ('reserve', 'create_job') AS spends
        FROM unnest(p_ops) WITH ORDINALITY
             AS u (op, account, actor, key_id, key_hash, authorized, request, amount,
                   requested_ttl, ttl, new_id, job, reservation, hash, kind, params,
                   external_ref, note, reason, http_request_id, lease_token, status, result,
                   error, priority, expires_at, n)
    ), steps AS MATERIALIZED (
        -- Each operation with its account, its reservation and its key,
        -- and the account as the batch's earlier operations leave it.
        -- (Only the columns the statement reads further on: every node
        -- that passes a row on builds its row type, column by column, at
        -- every batch.)
        SELECT o.n, o.op, o.account, o.actor, o.request, o.amount, o.requested_ttl, o.ttl,
               o.new_id, o.job, o.reservation, o.hash, o.kind, o.params, o.spends,
               a.id AS a_id, a.status, a.available AS a_available,
               a.reserved AS a_reserved, a.used AS a_used,
               a.active_reservations, a.max_active_reservations, a.low_balance_threshold,
               a.balance_low, a.topup_threshold, a.topup_armed,
               r.id AS r_id, r.amount AS r_amount, r.draws AS r_draws, r.state AS r_state,
               r.expires_at AS r_expires_at, r.job_id AS r_job,
               engine_settle_committed(o.op, o.amount, r.amount) AS committed,
               v.may, v.valid_key, v.last_used_at,
               -- Tokens the batch's reserves on this account take, this one
               -- included; its reserves so far; whether a settlement before
               -- this operation returned tokens to it (one window: each
               -- window of a plan costs its start-up at every batch).
               (sum(CASE WHEN o.spends THEN o.amount ELSE 0 END) OVER upto)::bigint AS spent,
               count(*) FILTER (WHERE o.spends) OVER upto AS reserves,
               count(*) FILTER (WHERE NOT o.spends AND (o.op = 'release'
                                                        OR (o.op = 'commit' AND o.amount < r.amount)))
                   OVER upto
               > CASE WHEN NOT o.spends AND (o.op = 'release'
                                             OR (o.op = 'commit' AND o.amount < r.amount))
                      THEN 1 ELSE 0 END AS returned_before,
               t.taken IS NOT NULL AS taken,
               -- The same request_id (of its kind) or reservation earlier in
               -- the batch on this account: a replay.
               EXISTS (SELECT 1 FROM o e
                       WHERE e.n < o.n AND e.account = o.account AND e.spends = o.spends
                         AND CASE WHEN o.spends THEN e.op = o.op AND e.request = o.request
                                  ELSE e.reservation = o.reservation END) AS repeated
        -- (Each look-up a LATERAL probe of one row by its key: a join
        -- here is planned, once for every batch size, as a scan of the
        -- whole table.)
        FROM o
        LEFT JOIN LATERAL (SELECT a.id, a.status, a.available, a.reserved, a.used,
                                  a.active_reservations, a.max_active_reservations,
                                  a.low_balance_threshold, a.balance_low, a.topup_threshold,
                                  a.topup_armed
                           FROM accounts a WHERE a.id = o.account LIMIT 1) a ON true
        -- The reservation a settlement names, of its account only.
        LEFT JOIN LATERAL (SELECT r.id, r.amount, r.draws, r.state, r.expires_at, r.job_id
                           FROM reservations r
                           WHERE NOT o.spends AND r.id = o.reservation
                             AND r.account_id = o.account LIMIT 1) r ON true
        CROSS JOIN LATERAL engine_key_may(o.authorized, o.key_id, o.key_hash, o.account) v
        -- Whether the request_id is taken (a replay).
        LEFT JOIN LATERAL engine_request_taken(o.op, o.account, o.request) t ON true
        WINDOW upto AS (PARTITION BY o.account ORDER BY o.n)
    ), checked AS MATERIALIZED (
        SELECT s.n, s.op, s.account, s.actor, s.request, s.amount, s.requested_ttl, s.ttl,
               s.new_id, s.job, s.reservation, s.hash, s.kind, s.params, s.spends,
               s.a_available, s.a_reserved, s.a_used, s.r_amount, s.r_draws, s.r_job,
               s.committed, s.spent,
               CASE WHEN engine_key_use_stale(s.last_used_at) THEN s.valid_key END AS stale_key,
               -- (The rules of a plain spend and settlement: 66_lone.sql.)
               s.a_id IS NOT NULL AND s.may AND NOT s.repeated AND CASE WHEN s.spends THEN
                   engine_spend_plain(s.status, s.a_available - s.spent,
                                      s.active_reservations + s.reserves,
                                      s.max_active_reservations, s.low_balance_threshold,
                                      s.balance_low, s.topup_threshold, s.topup_armed)
                   AND NOT s.returned_before AND NOT s.taken
                   AND NOT EXISTS (SELECT 1 FROM engine_lapsing_grants(s.account, at))
               ELSE
                   s.r_id IS NOT NULL
                   AND engine_settle_plain(s.op, s.amount, s.committed, s.r_amount, s.r_state,
                                           s.r_job, s.r_expires_at, s.low_balance_threshold,
                                           s.topup_threshold)
                   AND NOT EXISTS (SELECT 1 FROM engine_lapsed_draws(s.r_draws, at))
               END AS plain
        FROM steps s
    ), go AS MATERIALIZED (
        -- The plain prefix.
        SELECT c.* FROM checked c
        WHERE c.n < COALESCE((SELECT min(x.n) FROM checked x WHERE x.plain IS NOT TRUE),
                             2147483647)
    ), draws AS MATERIALIZED (
        -- A reserve takes the account's drawable tokens [spent - amount,
        -- spent): after what the batch's earlier reserves took.
        SELECT g.n, p.grant_id, p.lo, p.amount
        FROM go g CROSS JOIN LATERAL engine_draws(g.account, g.spent - g.amount, g.spent) p
        WHERE g.spends
    ), moves AS MATERIALIZED (
        SELECT m.*, d.available AS d_available, d.reserved AS d_reserved, d.used AS d_used
        FROM (SELECT d.n, d.lo AS k, g.account, 'reserve' AS kind, d.grant_id, d.amount,
                     g.new_id AS reservation, g.job
              FROM draws d JOIN go g ON g.n = d.n
              UNION ALL
              SELECT g.n, x.n, g.account, CASE x.part WHEN 'commit' THEN 'commit' ELSE 'release' END,
                     x.grant_id, x.amount, g.reservation, g.r_job
              FROM go g CROSS JOIN LATERAL engine_split_draws(g.r_draws, g.r_amount, g.committed) x
              WHERE NOT g.spends) m
        CROSS JOIN LATERAL engine_deltas(m.kind, m.amount, m.reservation) d
    ), grants AS (
        UPDATE credit_grants g
        SET remaining = g.remaining + t.remaining, reserved = g.reserved + t.reserved,
            consumed = g.consumed + t.consumed,
            drawable = g.remaining + t.remaining > 0
        FROM (SELECT m.grant_id, sum(x.remaining)::bigint AS remaining,
                     sum(x.reserved)::bigint AS reserved, sum(x.consumed)::bigint AS consumed
              FROM moves m
              CROSS JOIN LATERAL engine_grant_deltas(m.kind, m.amount, m.reservation) x
              WHERE m.grant_id IS NOT NULL
              GROUP BY m.grant_id) t
        WHERE g.id = t.grant_id AND g.id = ANY (ARRAY(SELECT grant_id FROM moves))
        RETURNING g.id
    ), made AS (
        INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds,
            state, expires_at, job_id, draws)
        SELECT g.new_id, g.account, g.request, g.amount, g.requested_ttl, 'held',
               now() + make_interval(secs => g.ttl), g.job,
               (SELECT jsonb_agg(jsonb_build_object('grant_id', d.grant_id, 'amount', d.amount)
                                 ORDER BY d.lo) FROM draws d WHERE d.n = g.n)
        FROM go g WHERE g.spends
        RETURNING *
    ), jobs AS (
        INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
            reservation_id)
        SELECT g.job, g.account, g.request, g.hash, g.kind, g.params, g.amount, g.new_id
        FROM go g WHERE g.op = 'create_job'
        RETURNING *
    ), settled AS (
        -- The reservation's row lock is taken here, under the account's.
        UPDATE reservations r
        SET state = CASE WHEN g.op = 'release' THEN 'released' ELSE 'committed' END,
            committed_amount = g.committed, resolved_at = now()
        FROM go g
        WHERE NOT g.spends AND r.id = g.reservation
          AND r.id = ANY (ARRAY(SELECT x.reservation FROM go x WHERE NOT x.spends))
        RETURNING g.n, to_jsonb(r) AS answer
    ), moved AS (
        UPDATE accounts x
        SET available = x.available + s.available, reserved = x.reserved + s.reserved,
            used = x.used + s.used,
            active_reservations = x.active_reservations + s.opened - s.closed,
            version = x.version + s.entries,
            balance_low = engine_is_low(x.available + s.available, x.low_balance_threshold),
            updated_at = now()
        FROM (SELECT g.account, COALESCE(sum(m.available), 0)::bigint AS available,
                     COALESCE(sum(m.reserved), 0)::bigint AS reserved,
                     COALESCE(sum(m.used), 0)::bigint AS used,
                     COALESCE(sum(m.entries), 0)::bigint AS entries,
                     count(*) FILTER (WHERE g.spends) AS opened,
                     count(*) FILTER (WHERE NOT g.spends) AS closed
              FROM go g
              CROSS JOIN LATERAL (SELECT sum(v.d_available) AS available,
                                         sum(v.d_reserved) AS reserved, sum(v.d_used) AS used,
                                         count(*) AS entries
                                  FROM moves v WHERE v.n = g.n) m
              GROUP BY g.account) s
        WHERE x.id = s.account AND x.id = ANY (ARRAY(SELECT account FROM go))
        RETURNING x.id
    ), entries AS (
        -- Each entry with the account's balances after it: the balances
        -- before the batch (this statement's snapshot) and every movement
        -- of the batch on the account up to it.
        INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
            used_after, reservation_id, job_id, external_ref, reason, actor, created_at, grant_id)
        SELECT m.account, m.kind, m.amount,
               g.a_available + (sum(m.d_available) OVER w)::bigint,
               g.a_reserved + (sum(m.d_reserved) OVER w)::bigint,
               g.a_used + (sum(m.d_used) OVER w)::bigint,
               m.reservation, m.job, NULL, NULL, g.actor, at, m.grant_id
        FROM moves m JOIN go g ON g.n = m.n
        WINDOW w AS (PARTITION BY m.account ORDER BY m.n, m.k)
        ORDER BY m.n, m.k
        RETURNING 1
    )
    -- (Every part of a WITH that writes runs once, read or not.)
    SELECT g.n AS n,
           engine_plain_outcome(g.op) AS outcome,
           CASE g.op
               WHEN 'reserve' THEN (SELECT to_jsonb(h) FROM made h WHERE h.id = g.new_id)
               WHEN 'create_job' THEN (SELECT engine_job_view(j, h.state, h.expires_at, h.draws)
                                       FROM jobs j JOIN made h ON h.id = j.reservation_id
                                       WHERE j.id = g.job)
               ELSE (SELECT s.answer FROM settled s WHERE s.n = g.n)
           END AS answer,
           g.stale_key
    FROM go g
    ORDER BY g.n
    LOOP
        op_position := applied.n; outcome := applied.outcome; object := applied.answer;
        RETURN NEXT;
        IF applied.stale_key IS NOT NULL THEN
            stale := stale || applied.stale_key;
        END IF;
    END LOOP;
    -- A verified key whose last use is stale has it written, as
    -- engine_verify_keys does: a key row another transaction holds is
    -- skipped, never waited for. (Once a minute per key: a statement of
    -- its own, not a part of every batch's.)
    IF cardinality(stale) > 0 THEN
        PERFORM engine_touch_keys(stale);
    END IF;
END;
$$;
