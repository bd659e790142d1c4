-- When a reservation may leave `held` (commit, partial commit, release,
-- expire) or be extended, and the settle arithmetic.
--
-- A settlement is decided against its reservation (row-locked under its
-- account's lock, which the caller holds). In this order:
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

-- Whether a reservation expiring at `p_expires_at` has expired at `p_at`,
-- written once: it can no longer be committed, released or extended, and
-- the reaper may expire it. Inlined where it is called (the reaper's scan
-- by expiry keeps its index).
CREATE FUNCTION engine_reservation_expired(p_expires_at timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at <= p_at
$$;

-- A commit of `p_amount` tokens of a reservation holding `p_held` asks for
-- more than is held (amount_exceeds_held), written once.
CREATE FUNCTION engine_commit_exceeds(p_amount bigint, p_held bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_amount > p_held
$$;

-- A settlement's verdict, written once: what `p_action` (commit of exactly
-- `p_amount`, commit_all, release, extend, expire) by the job `p_job` (NULL
-- for the API) may do to the reservation `p_found` (locked; its id NULL
-- when there is none) of `p_account` at `p_at` — in the order listed at
-- the top of this file: not_found, owned_by_job, replayed / not_held,
-- amount_exceeds_held, not_due, expired_on_access, or the action itself.
CREATE FUNCTION engine_settle_verdict(p_action text, p_account uuid, p_amount bigint,
    p_job uuid, p_found engine_reservation, p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_found.id IS NULL OR p_found.account_id <> p_account THEN 'not_found'
        WHEN p_found.job_id IS DISTINCT FROM p_job THEN 'owned_by_job'
        WHEN p_found.state <> 'held' THEN
            CASE WHEN (p_action IN ('commit', 'commit_all') AND p_found.state = 'committed'
                       AND p_found.committed_amount = COALESCE(p_amount, p_found.amount))
                      OR (p_action = 'release' AND p_found.state = 'released')
                 THEN 'replayed' ELSE 'not_held' END
        WHEN p_action = 'commit' AND engine_commit_exceeds(p_amount, p_found.amount)
            THEN 'amount_exceeds_held'
        WHEN p_action = 'expire' AND NOT engine_reservation_expired(p_found.expires_at, p_at)
            THEN 'not_due'
        WHEN p_action <> 'expire' AND engine_reservation_expired(p_found.expires_at, p_at)
            THEN 'expired_on_access'
        ELSE p_action
    END
$$;

-- One settlement (`o`: commit, commit_all, release, extend, expire) of
-- its reservation, decided at `p_at` (the batch's stamp), with the
-- presented key `p_key` (valid, and allowed to spend here: engine_apply
-- asked engine_key_refusal first; NULL when the service authorised it),
-- whose id its entries carry. The caller
-- (engine_apply) holds the account's row lock; the reservation's is taken
-- here. Nothing is written: the reservation as it becomes (`changed`) and
-- the movements (`moves`) go to the batch's one write (engine_record).
-- A resolution spends what is committed (commit: exactly the amount;
-- commit_all: all held) and gives the rest back in the same transaction:
-- the commit entries first (one per grant the commit consumes,
-- engine_split_draws), then the returns of the rest (one per grant it
-- goes back to), so a replay of the entries passes through both
-- balances; the held count drops on the last entry. A return to a grant
-- that has lapsed by then expires at once (grant_expire, reason
-- grant_expired): it leaves reserved and the account, and is never made
-- available. An extension sets expires_at to now + ttl (a job's never
-- earlier than it was), capped by engine_extension_expiry.
CREATE FUNCTION engine_settle(o engine_request, p_at timestamptz, p_key engine_key,
    OUT outcome text, OUT detail jsonb, OUT object jsonb, OUT changed engine_reservation,
    OUT moves engine_movement[], OUT budget engine_budget_move)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    existing engine_reservation;
    verdict text;
    asked timestamptz;
    cap timestamptz;
BEGIN
    -- The reservation, row-locked (all NULL when there is none).
    SELECT x.id, x.account_id, x.request_id, x.amount, x.requested_ttl_seconds, x.state,
           x.committed_amount, x.expires_at, x.job_id, x.created_at, x.resolved_at, x.draws,
           x.budget_key_id, x.budget_period_start
    INTO existing
    FROM reservations x WHERE x.id = o.reservation FOR UPDATE;
    verdict := engine_settle_verdict(o.op, o.account, o.amount, o.job, existing, now());
    -- (The object of a refusal or a replay is the reservation as it is;
    -- a settlement's is the reservation as it becomes.)
    CASE verdict
        WHEN 'not_found' THEN
            outcome := 'not_found'; detail := '{"what": "reservation"}';
            RETURN;
        WHEN 'owned_by_job', 'not_due' THEN
            outcome := verdict; object := to_jsonb(existing);
            RETURN;
        WHEN 'replayed', 'not_held', 'amount_exceeds_held' THEN
            outcome := verdict; object := to_jsonb(existing);
            detail := CASE verdict WHEN 'amount_exceeds_held'
                          THEN jsonb_build_object('held', existing.amount, 'amount', o.amount)
                          ELSE jsonb_build_object('state', existing.state) END;
            RETURN;
        WHEN 'extend' THEN
            -- The expiry it asks for, and the cap: the earliest expiry of
            -- the grants it drew from (NULL: none expires; by the grants'
            -- primary key). Grant expiry dominates extension.
            asked := CASE WHEN o.job IS NULL THEN now() + make_interval(secs => o.ttl)
                          ELSE GREATEST(existing.expires_at, now() + make_interval(secs => o.ttl)) END;
            SELECT min(g.expires_at) INTO cap
            FROM jsonb_array_elements(existing.draws) x
            CROSS JOIN LATERAL (SELECT g.expires_at FROM credit_grants g
                                WHERE g.id = (x->>'grant_id')::uuid LIMIT 1) g
            WHERE (x->>'amount')::bigint > 0;
            changed := existing;
            changed.expires_at := engine_extension_expiry(asked, cap, existing.expires_at);
            outcome := CASE WHEN changed.expires_at < asked THEN 'extended_capped' ELSE 'extended' END;
            object := to_jsonb(changed);
            RETURN;
        ELSE
            NULL;
    END CASE;
    -- A resolution: commit, commit_all, release, expire, or an expiry on
    -- access (expiry dominates).
    changed := existing;
    changed.state := CASE verdict WHEN 'commit' THEN 'committed' WHEN 'commit_all' THEN 'committed'
                                  WHEN 'release' THEN 'released' ELSE 'expired' END;
    changed.committed_amount := CASE verdict WHEN 'commit' THEN o.amount
                                             WHEN 'commit_all' THEN existing.amount ELSE 0 END;
    changed.resolved_at := now();
    outcome := changed.state;
    IF verdict = 'expired_on_access' THEN
        outcome := 'not_held'; detail := jsonb_build_object('state', 'expired', 'resolved', true);
    END IF;
    IF existing.budget_key_id IS NOT NULL AND changed.committed_amount < existing.amount THEN
        -- What it did not use goes back to its key's budget, in its period.
        budget := ROW(existing.budget_key_id, existing.budget_period_start, o.reservation,
                      changed.committed_amount - existing.amount)::engine_budget_move;
    END IF;
    object := to_jsonb(changed);
    moves := ARRAY(
        SELECT ROW(o.account,
                   CASE WHEN x.part = 'commit' THEN 'commit'
                        WHEN engine_grant_lapsed(g.expires_at, p_at) THEN 'grant_expire'
                        WHEN verdict IN ('expire', 'expired_on_access') THEN 'expire'
                        ELSE 'release' END,
                   x.amount, CASE WHEN x.n = max(x.n) OVER () THEN -1 ELSE 0 END,
                   o.reservation, existing.job_id, NULL,
                   CASE WHEN x.part = 'return' AND engine_grant_lapsed(g.expires_at, p_at)
                        THEN 'grant_expired'
                        WHEN x.part = 'return' AND verdict = 'expired_on_access'
                        THEN 'expired_on_access' ELSE o.reason END,
                   o.actor, p_at, x.grant_id, p_key.key_id)::engine_movement
        FROM engine_split_draws(existing.draws, existing.amount, changed.committed_amount) x
        LEFT JOIN LATERAL (SELECT g.expires_at FROM credit_grants g
                           WHERE g.id = x.grant_id LIMIT 1) g ON true
        ORDER BY x.n);
END;
$$;
