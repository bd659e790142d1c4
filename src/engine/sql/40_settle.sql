-- Settlements: when a reservation may leave `held` (commit, commit_all, release, expire) or be
-- extended, and how its tokens go back to its grants.

-- Grant expiry dominates extension, written once: a reservation expiring at `p_current` asks
-- for `p_asked`; the earliest expiry of its grants is `p_cap` (NULL: none expires). Within the
-- cap it gets what it asks; beyond, the cap, or `p_current` if later (the hold it had when its
-- grant lapsed: the generation in progress may still be charged within it, docs/grants.md), and
-- never more than it asked.
CREATE FUNCTION engine_extension_expiry(p_asked timestamptz, p_cap timestamptz,
    p_current timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_cap IS NULL OR p_asked <= p_cap THEN p_asked
                ELSE LEAST(p_asked, GREATEST(p_cap, p_current)) END
$$;

-- A reservation has expired at `p_at`, written once: it can no longer be committed, released or
-- extended, and the reaper may expire it. Inlined where called, so the reaper's scan by expiry
-- keeps its index.
CREATE FUNCTION engine_reservation_expired(p_expires_at timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at <= p_at
$$;

-- A commit of `p_amount` asks for more than `p_held` (amount_exceeds_held), written once.
CREATE FUNCTION engine_commit_exceeds(p_amount bigint, p_held bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_amount > p_held
$$;

-- A settlement's verdict, written once: what `p_action` (commit of exactly `p_amount`,
-- commit_all, release, extend, expire) by the job `p_job` (NULL: the API) may do at `p_at` to
-- `p_account`'s reservation `p_found` (locked; id NULL: none). The first that applies:
--   not_found            no such reservation on this account;
--   owned_by_job         its job is not `p_job` (the API may not touch a job's reservation);
--   replayed / not_held  it is no longer held: the same resolution again (a commit of the same
--                        amount, a release) is replayed, anything else not_held;
--   amount_exceeds_held  a commit of more than is held;
--   not_due              an expire before expires_at;
--   expired_on_access    a commit, release or extend past its expiry expires it (expiry
--                        dominates);
--   else the action itself.
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

-- One settlement (`o`) of its reservation, its entries stamped `p_at` (the batch's stamp) and
-- carrying the id of `p_key`, the presented key already passed by engine_key_refusal (NULL: the
-- service authorised it). The caller (engine_apply) holds the account's row lock; the
-- reservation's is taken here. Nothing is written: `changed` and `moves` go to the batch's one
-- write (engine_record). Outcomes: engine_settle_verdict's refusals and replayed;
-- expired_on_access answers not_held {state: expired, resolved: true} (resolved: this call moved
-- it out of held); else committed, released, expired, extended or extended_capped
-- (engine_extension_expiry capped it). The object is the reservation as it is (refusal, replay)
-- or as it becomes.
-- A resolution spends what is committed (commit_all: all held) and gives the rest back: the
-- commit entries first (one per grant it consumes, in draw order), then the returns, so a replay
-- of the entries passes through both balances; the held count drops on the last entry. A return to a grant
-- lapsed by `p_at` expires at once (grant_expire, reason grant_expired): it leaves reserved and
-- the account, never made available. An extension sets expires_at to now + ttl (a job's never
-- earlier), capped by engine_extension_expiry.
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
    draws jsonb;
    unspent bigint;
    drawn bigint;
    part bigint;
    gid uuid;
    lapsed boolean;
    returns engine_movement[];
BEGIN
    -- (All NULL when there is none.)
    SELECT x.id, x.account_id, x.request_id, x.amount, x.requested_ttl_seconds, x.state,
           x.committed_amount, x.expires_at, x.job_id, x.created_at, x.resolved_at, x.draws,
           x.budget_key_id, x.budget_period_start
    INTO existing
    FROM reservations x WHERE x.id = o.reservation FOR UPDATE;
    verdict := engine_settle_verdict(o.op, o.account, o.amount, o.job, existing, now());
    -- (IFs, not a CASE statement: each of its WHENs is an expression to set up.)
    IF verdict IN ('not_found', 'owned_by_job', 'not_due', 'replayed', 'not_held',
                   'amount_exceeds_held') THEN
        outcome := verdict;
        IF verdict = 'not_found' THEN
            detail := '{"what": "reservation"}';
        ELSE
            object := to_jsonb(existing);
            detail := CASE WHEN verdict = 'amount_exceeds_held'
                               THEN jsonb_build_object('held', existing.amount, 'amount', o.amount)
                           WHEN verdict IN ('replayed', 'not_held')
                               THEN jsonb_build_object('state', existing.state) END;
        END IF;
        RETURN;
    ELSIF verdict = 'extend' THEN
        -- The cap: the earliest expiry of the grants it drew from (NULL: none expires).
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
    END IF;
    -- A resolution (expired_on_access included).
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
    -- Draw k consumes what is committed and not consumed by the draws before it; the rest of it
    -- goes back to its grant. A reservation without draws (none should exist; the invariant
    -- checks report grants that disagree with balances) settles as one draw of no grant. (A loop
    -- of plain expressions, not a statement: a statement's plan is started for every settlement
    -- of a batch, an expression is set up once a transaction.)
    draws := CASE WHEN jsonb_array_length(existing.draws) > 0 THEN existing.draws
                  ELSE jsonb_build_array(jsonb_build_object('grant_id', NULL,
                                                            'amount', existing.amount)) END;
    unspent := changed.committed_amount;
    FOR k IN 0 .. jsonb_array_length(draws) - 1 LOOP
        gid := (draws->k->>'grant_id')::uuid;
        drawn := (draws->k->>'amount')::bigint;
        part := GREATEST(LEAST(unspent, drawn), 0);
        unspent := unspent - part;
        IF part > 0 THEN
            moves := moves || ROW(o.account, 'commit', part, 0, o.reservation, existing.job_id,
                NULL, o.reason, o.actor, p_at, gid, p_key.key_id)::engine_movement;
        END IF;
        IF drawn > part THEN
            lapsed := engine_grant_lapsed((SELECT g.expires_at FROM credit_grants g
                                           WHERE g.id = gid), p_at);
            returns := returns || ROW(o.account,
                CASE WHEN lapsed THEN 'grant_expire'
                     WHEN verdict IN ('expire', 'expired_on_access') THEN 'expire'
                     ELSE 'release' END,
                drawn - part, 0, o.reservation, existing.job_id, NULL,
                CASE WHEN lapsed THEN 'grant_expired'
                     WHEN verdict = 'expired_on_access' THEN 'expired_on_access'
                     ELSE o.reason END,
                o.actor, p_at, gid, p_key.key_id)::engine_movement;
        END IF;
    END LOOP;
    moves := moves || returns;
    IF cardinality(moves) > 0 THEN
        moves[cardinality(moves)].active_delta := -1;
    END IF;
END;
$$;
