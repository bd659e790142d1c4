-- When a reservation may leave `held` (commit, partial commit, release,
-- expire) or be extended, and the settle arithmetic.
--
-- Settle items are decided set-based, each against its own reservation
-- (row-locked in id order; the caller holds the accounts' locks and names
-- each reservation at most once). For each item, in this order:
--   not_found {what: reservation}  no such reservation on this account;
--   owned_by_job                   the reservation belongs to a job and the
--                                  item is not that job's (the API may not
--                                  touch a job's reservation);
--   replayed {state} / not_held {state}
--                                  the reservation is no longer held: the
--                                  same resolution again is replayed (a
--                                  commit of the same amount, a release),
--                                  anything else is not_held;
--   amount_exceeds_held {held, amount}
--                                  a commit of more than is held;
--   not_due                        an expiry before expires_at;
--   not_held {state: expired, resolved: true}
--                                  a commit, release or extend of a
--                                  reservation past its expiry expires it
--                                  (reason expired_on_access): expiry
--                                  dominates;
--   committed / released / expired / extended / extended_capped
--                                  what was asked (extended_capped: an
--                                  extension capped at the earliest expiry
--                                  of the grants it drew from, see
--                                  engine_extension_expiry). A commit spends its
--                                  amount (commit_all: all held) and gives
--                                  the rest back to available in the same
--                                  transaction: `commit` entries, then
--                                  the `release` of the rest, one entry
--                                  per grant (engine_split_draws); the
--                                  rest going back to a grant that has
--                                  lapsed expires at once instead
--                                  (`grant_expire`). An extension
--                                  sets expires_at to now + ttl (a job's
--                                  never earlier than it was), but never
--                                  past the earliest expiry of the grants
--                                  its tokens came from (grant expiry
--                                  dominates extension).
-- `resolved` is true when the item moved the reservation out of `held`;
-- `at` is the time of the ledger entries of this call.
-- How a settlement moves the grants a reservation drew from (`p_draws`,
-- in draw order) when it spends `p_committed` of its `p_held` tokens: the
-- commit consumes the draws in draw order (draw i consumes
-- clamp(committed - the draws before i, 0, its amount)) and the rest of
-- each draw goes back to its grant. One row per entry, in no particular
-- order; `n` is the entry order (every commit part, then every return
-- part; increasing, not consecutive). A reservation without draws
-- (none should exist: reservations are made with their draws, and the
-- upgrade to grants gave each held one its draw; the invariant checks
-- report an account whose grants disagree with its balances) settles as
-- one draw of no grant, so its tokens still move.
CREATE FUNCTION engine_split_draws(p_draws jsonb, p_held bigint, p_committed bigint)
RETURNS TABLE (n bigint, part text, grant_id uuid, amount bigint)
LANGUAGE sql IMMUTABLE AS $$
    -- Draw k (of c) consumes clamp(committed - the draws before it, 0, its
    -- amount); its commit part is entry k, its return part entry c + k.
    -- (One window and a two-row VALUES per draw: inlined into the callers'
    -- statements, whose plans are started at every call.)
    SELECT CASE p.part WHEN 'commit' THEN d.k ELSE d.c + d.k END, p.part, d.grant_id, p.amount
    FROM (SELECT x.k, GREATEST(jsonb_array_length(p_draws), 1) AS c,
                 (x.draw->>'grant_id')::uuid AS grant_id, (x.draw->>'amount')::bigint AS amount,
                 GREATEST(LEAST(p_committed - (sum((x.draw->>'amount')::bigint) OVER (ORDER BY x.k)
                                               - (x.draw->>'amount')::bigint),
                                (x.draw->>'amount')::bigint), 0)::bigint AS consumed
          FROM jsonb_array_elements(
                   CASE WHEN jsonb_array_length(p_draws) > 0 THEN p_draws
                        ELSE jsonb_build_array(jsonb_build_object('grant_id', NULL, 'amount', p_held))
                   END) WITH ORDINALITY AS x (draw, k)) d
    CROSS JOIN LATERAL (VALUES ('commit', d.consumed), ('return', d.amount - d.consumed))
        AS p (part, amount)
    WHERE p.amount > 0
$$;

-- Grant expiry dominates extension, written once: the expiry an extension
-- gives a reservation that asks for `p_asked` when the earliest expiry of
-- the grants it drew from is `p_cap` (NULL: none of them expires) and it
-- expires at `p_current` now. Within the cap it gets what it asks; beyond
-- it, it gets the cap — or keeps `p_current` when that is later (the hold
-- it had when its grant lapsed: the generation in progress may still be
-- charged within it, docs/grants.md), and never more than it asked.
CREATE FUNCTION engine_extension_expiry(p_asked timestamptz, p_cap timestamptz,
    p_current timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_cap IS NULL OR p_asked <= p_cap THEN p_asked
                ELSE LEAST(p_asked, GREATEST(p_cap, p_current)) END
$$;

CREATE FUNCTION engine_settle(p_items engine_settle_item[])
RETURNS TABLE (pos integer, outcome text, detail jsonb, reservation reservations, resolved boolean,
               at timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    moves engine_movement[] := '{}';
    settled_at timestamptz := engine_now();
    committed bigint;
    d record;
    m record;
BEGIN
    -- The reservations' row locks first, in id order (two batches never
    -- deadlock); the decision then reads each locked row by its primary
    -- key, one probe per item. (Joining the items with the locked rows in
    -- one statement was planned as a nested loop over both: quadratic in
    -- the batch.)
    PERFORM 1 FROM reservations r
    WHERE r.id = ANY (ARRAY(SELECT i.reservation FROM unnest(p_items) i))
    ORDER BY r.id
    FOR UPDATE;
    FOR d IN
        WITH decided AS (
            SELECT i.*, l.found, (l.found).amount AS held,
                   CASE
                       WHEN l.found IS NULL OR (l.found).account_id <> i.account THEN 'not_found'
                       WHEN (l.found).job_id IS DISTINCT FROM i.job THEN 'owned_by_job'
                       WHEN (l.found).state <> 'held' THEN
                           CASE WHEN (i.action IN ('commit', 'commit_all')
                                      AND (l.found).state = 'committed'
                                      AND (l.found).committed_amount
                                          = COALESCE(i.amount, (l.found).amount))
                                     OR (i.action = 'release' AND (l.found).state = 'released')
                                THEN 'replayed' ELSE 'not_held' END
                       WHEN i.action = 'commit' AND i.amount > (l.found).amount
                           THEN 'amount_exceeds_held'
                       WHEN i.action = 'expire' AND (l.found).expires_at > now() THEN 'not_due'
                       WHEN i.action <> 'expire' AND (l.found).expires_at <= now()
                           THEN 'expired_on_access'
                       ELSE i.action
                   END AS verdict,
                   -- An extension: the expiry it asks for (a job's never
                   -- earlier than it was), and the cap: the earliest
                   -- expiry of the grants it drew from (NULL: none
                   -- expires). Only for an extension (by the grants'
                   -- primary key, one probe per draw).
                   CASE WHEN i.action = 'extend' THEN
                       CASE WHEN i.job IS NULL THEN now() + make_interval(secs => i.ttl)
                            ELSE GREATEST((l.found).expires_at, now() + make_interval(secs => i.ttl))
                       END
                   END AS asked,
                   CASE WHEN i.action = 'extend' THEN
                       (SELECT min(g.expires_at)
                        FROM jsonb_array_elements((l.found).draws) x
                        CROSS JOIN LATERAL (SELECT g.expires_at FROM credit_grants g
                                            WHERE g.id = (x->>'grant_id')::uuid LIMIT 1) g
                        WHERE (x->>'amount')::bigint > 0)
                   END AS cap
            FROM unnest(p_items) i
            LEFT JOIN LATERAL (SELECT r AS found FROM reservations r
                               WHERE r.id = i.reservation LIMIT 1) l ON true
        ), judged AS (
            SELECT d.*, d.verdict IN ('commit', 'commit_all', 'release', 'extend', 'expire',
                                      'expired_on_access') AS changes,
                   -- Grant expiry dominates extension: an extension never
                   -- carries drawn tokens past their grant's expiry
                   -- (engine_extension_expiry, the one rule); one that
                   -- gets less than it asked is capped.
                   d.verdict = 'extend'
                   AND engine_extension_expiry(d.asked, d.cap, (d.found).expires_at) < d.asked
                       AS capped
            FROM decided d
        ), applied AS (
            UPDATE reservations r
            SET state = CASE d.verdict WHEN 'commit' THEN 'committed' WHEN 'commit_all' THEN 'committed'
                                       WHEN 'release' THEN 'released' WHEN 'extend' THEN 'held'
                                       ELSE 'expired' END,
                committed_amount = CASE WHEN d.verdict IN ('commit', 'commit_all')
                                        THEN COALESCE(d.amount, r.amount) ELSE 0 END,
                resolved_at = CASE WHEN d.verdict = 'extend' THEN NULL ELSE now() END,
                expires_at = CASE
                    WHEN d.verdict <> 'extend' THEN r.expires_at
                    ELSE engine_extension_expiry(d.asked, d.cap, r.expires_at) END
            FROM judged d
            WHERE r.id = d.reservation AND d.changes
            RETURNING d.pos, d.action, d.account, d.reservation, d.amount, d.reason, d.actor,
                      d.verdict, d.held, d.found, d.capped, r AS changed
        )
        -- The items that changed their reservation (as it is now), and
        -- the others: no join of the two (see the locks above).
        SELECT a.* FROM applied a
        UNION ALL
        SELECT d.pos, d.action, d.account, d.reservation, d.amount, d.reason, d.actor, d.verdict,
               d.held, d.found, d.capped, NULL::reservations
        FROM judged d
        WHERE NOT d.changes
        ORDER BY pos
    LOOP
        pos := d.pos;
        at := settled_at;
        detail := NULL;
        resolved := (d.changed).id IS NOT NULL AND d.verdict <> 'extend';
        reservation := CASE WHEN (d.changed).id IS NOT NULL THEN d.changed ELSE d.found END;
        CASE d.verdict
            WHEN 'not_found' THEN
                outcome := 'not_found'; detail := '{"what": "reservation"}';
            WHEN 'owned_by_job', 'not_due' THEN
                outcome := d.verdict;
            WHEN 'replayed', 'not_held' THEN
                outcome := d.verdict; detail := jsonb_build_object('state', (d.found).state);
            WHEN 'amount_exceeds_held' THEN
                outcome := d.verdict; detail := jsonb_build_object('held', d.held, 'amount', d.amount);
            WHEN 'extend' THEN
                outcome := CASE WHEN d.capped THEN 'extended_capped' ELSE 'extended' END;
            ELSE
                -- A resolution: commit, commit_all, release, expire, or an
                -- expiry on access.
                outcome := CASE d.verdict WHEN 'commit_all' THEN 'committed'
                                          WHEN 'commit' THEN 'committed'
                                          WHEN 'release' THEN 'released'
                                          WHEN 'expire' THEN 'expired'
                                          ELSE 'not_held' END;
                IF d.verdict = 'expired_on_access' THEN
                    detail := jsonb_build_object('state', 'expired', 'resolved', true);
                END IF;
                committed := (d.changed).committed_amount;
                -- The commit entries first (one per grant the commit
                -- consumes), then the returns of the rest (one per grant
                -- it goes back to), so a replay of the entries passes
                -- through both balances; the held count drops on the last
                -- entry.
                -- A return to a grant that has lapsed by now expires at
                -- once (grant_expire, reason grant_expired): it leaves
                -- reserved and the account, and is never made available.
                -- Appended one at a time (`moves || ARRAY(...)` copies the
                -- whole array on every item: quadratic in the batch).
                FOR m IN
                    SELECT ROW(d.account,
                               CASE WHEN x.part = 'commit' THEN 'commit'
                                    WHEN g.expires_at <= settled_at THEN 'grant_expire'
                                    WHEN d.verdict IN ('expire', 'expired_on_access') THEN 'expire'
                                    ELSE 'release' END,
                               x.amount, CASE WHEN x.n = max(x.n) OVER () THEN -1 ELSE 0 END,
                               d.reservation, (d.changed).job_id, NULL,
                               CASE WHEN x.part = 'return' AND g.expires_at <= settled_at
                                    THEN 'grant_expired'
                                    WHEN x.part = 'return' AND d.verdict = 'expired_on_access'
                                    THEN 'expired_on_access' ELSE d.reason END,
                               d.actor, settled_at, x.grant_id)::engine_movement AS move
                    FROM engine_split_draws((d.changed).draws, d.held, committed) x
                    LEFT JOIN credit_grants g ON g.id = x.grant_id
                    ORDER BY x.n
                LOOP
                    moves := moves || m.move;
                END LOOP;
        END CASE;
        RETURN NEXT;
    END LOOP;
    IF cardinality(moves) > 0 THEN
        PERFORM engine_record(moves);
    END IF;
END;
$$;
