-- The arithmetic of every movement, and the one place its ledger entries and events are written.

-- The one time of all this transaction's entries, events and settlements: the first call keeps
-- clock_timestamp() in the transaction-local setting token_billing.at. Writers call it after
-- taking their accounts' row locks, so an account's entries carry times in write order.
-- PL/pgSQL, not SQL: an SQL function that cannot be inlined is planned at every call.
CREATE FUNCTION engine_now() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    stamp text := current_setting('token_billing.at', true);
BEGIN
    IF stamp IS NULL OR stamp = '' THEN
        stamp := set_config('token_billing.at', clock_timestamp()::text, true);
    END IF;
    RETURN stamp::timestamptz;
END;
$$;

-- What a movement does to an account's balances (a: p_amount; none/set: p_reservation NULL or
-- not). A grant_expire takes tokens out for good: from available when a grant lapses holding
-- them, from reserved when a reservation's rest goes back to a lapsed grant.
--   kind          available  reserved  used  credited  adjusted  grant_expired
--   credit        +a                          +a
--   adjustment    +a                                    +a
--   reserve       -a         +a
--   commit                   -a        +a
--   release       +a         -a
--   expire        +a         -a
--   grant_expire  -a (none)  -a (set)                             +a
-- Used by engine_record and engine_moved. An unknown kind moves nothing (row rules refuse it).
CREATE FUNCTION engine_deltas(p_kind text, p_amount bigint, p_reservation uuid)
RETURNS engine_balances
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(CASE WHEN p_kind IN ('credit', 'adjustment', 'release', 'expire') THEN p_amount
                    WHEN p_kind = 'reserve' OR (p_kind = 'grant_expire' AND p_reservation IS NULL)
                        THEN -p_amount
                    ELSE 0 END,
               CASE WHEN p_kind = 'reserve' THEN p_amount
                    WHEN p_kind IN ('commit', 'release', 'expire')
                         OR (p_kind = 'grant_expire' AND p_reservation IS NOT NULL) THEN -p_amount
                    ELSE 0 END,
               CASE WHEN p_kind = 'commit' THEN p_amount ELSE 0 END,
               CASE WHEN p_kind = 'credit' THEN p_amount ELSE 0 END,
               CASE WHEN p_kind = 'adjustment' THEN p_amount ELSE 0 END,
               CASE WHEN p_kind = 'grant_expire' THEN p_amount ELSE 0 END)::engine_balances
$$;

-- What a movement does to the grant it names (engine_movement.grant_id), given the account's
-- deltas p_account (passed in: inlined, each engine_deltas call is its whole expression). The
-- grant's reserved, consumed, expired move as the account's reserved, used, grant_expired; its
-- remaining as available, except: a credit or positive adjustment moves nothing (its grant is
-- made holding its tokens); a negative one takes -a from remaining for good (debited).
CREATE FUNCTION engine_grant_deltas(p_kind text, p_amount bigint, p_account engine_balances)
RETURNS engine_grant_balances
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(CASE WHEN p_kind = 'credit' THEN 0
                    WHEN p_kind = 'adjustment' THEN LEAST(p_amount, 0)
                    ELSE p_account.available END,
               p_account.reserved, p_account.used,
               CASE WHEN p_kind = 'adjustment' THEN -LEAST(p_amount, 0) ELSE 0 END,
               p_account.grant_expired)::engine_grant_balances
$$;

-- The account `a` after a movement of deltas `d` (engine_deltas) that changes its held count by
-- `p_active`: engine_record's and engine_moved's arithmetic, written once.
CREATE FUNCTION engine_account_moved(a engine_account, d engine_balances, p_active integer)
RETURNS engine_account
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(a.id, a.status, a.available + d.available, a.reserved + d.reserved,
               a.used + d.used, a.credited + d.credited, a.adjusted + d.adjusted,
               a.grant_expired + d.grant_expired, a.active_reservations + p_active,
               a.max_active_reservations, a.low_balance_threshold, a.balance_low,
               a.topup_threshold, a.topup_armed, a.topup_unconsumed)::engine_account
$$;

-- A grant's deltas `a` and then `b` (engine_grant_deltas), as one.
CREATE FUNCTION engine_grant_moved(a engine_grant_balances, b engine_grant_balances)
RETURNS engine_grant_balances
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(a.remaining + b.remaining, a.reserved + b.reserved, a.consumed + b.consumed,
               a.debited + b.debited, a.expired + b.expired)::engine_grant_balances
$$;

-- The low-balance rule: an account is low when a threshold is set (> 0) and available is below it.
CREATE FUNCTION engine_is_low(p_available bigint, p_threshold bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_threshold > 0 AND p_available < p_threshold
$$;

-- A transaction's tallies for the callers' metrics, in transaction-local settings
-- token_billing.<name>; engine_tally_take reads and resets one (counted once the transaction
-- commits). grant_expired: tokens gone with a grant's lapse (token_billing_tokens_total
-- {movement="grant_expired"}); topup_credited: tokens top-up rules credited (movement="credited").
CREATE FUNCTION engine_tally(p_name text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(NULLIF(current_setting('token_billing.' || p_name, true), ''), '0')::bigint
$$;

CREATE FUNCTION engine_tally_add(p_name text, p_amount bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('token_billing.' || p_name, (engine_tally(p_name) + p_amount)::text, true);
END;
$$;

CREATE FUNCTION engine_tally_take(p_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    taken bigint := engine_tally(p_name);
BEGIN
    IF taken <> 0 THEN
        PERFORM set_config('token_billing.' || p_name, '0', true);
    END IF;
    RETURN taken;
END;
$$;

-- accounts.topup_unconsumed: the tokens a threshold top-up rule added (granted, or requested and
-- not expired) that nothing used since; the rule fires again only at 0 (engine_topup_due). This
-- is the count after p_less tokens stop counting (used by commits, credited otherwise, or of a
-- request that expired unanswered; NULL: all, for a new or re-armed rule) and the rule adds
-- p_more; never below 0. Releases, expiries and lapses use nothing and never lower it, so a
-- rule adds in any period at most the tokens used (or credited otherwise) in it, plus one firing.
CREATE FUNCTION engine_topup_unconsumed(p_before bigint, p_less bigint, p_more bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT GREATEST(p_before - COALESCE(p_less, p_before), 0) + p_more
$$;

-- Whether an account's threshold top-up rule must fire (armed, below the line, p_unconsumed 0)
-- or re-arm (not armed, at or above it). p_line: accounts.topup_threshold (0: no live rule).
-- engine_record calls engine_topup_evaluate (80_topups.sql) for each account made due.
CREATE FUNCTION engine_topup_due(p_available bigint, p_line bigint, p_armed boolean,
    p_unconsumed bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_line > 0 AND CASE WHEN p_available < p_line THEN p_armed AND p_unconsumed = 0
                               ELSE NOT p_armed END
$$;

-- The common part of an account's events: its id and balances.
CREATE FUNCTION engine_event_balances(p_account uuid, p_available bigint, p_reserved bigint,
    p_used bigint, p_credited bigint, p_adjusted bigint, p_threshold bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('account_id', p_account,
        'balances', jsonb_build_object('available', p_available, 'reserved', p_reserved,
            'used', p_used, 'credited', p_credited, 'adjusted', p_adjusted),
        'low_balance_threshold', p_threshold)
$$;

-- The same, of an account row as it is.
CREATE FUNCTION engine_event_account(p_account accounts) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT engine_event_balances(p_account.id, p_account.available, p_account.reserved,
        p_account.used, p_account.credited, p_account.adjusted, p_account.low_balance_threshold)
$$;

-- Writes one event (engine_record inserts its events in bulk, in the same shape).
CREATE FUNCTION engine_emit_event(p_type text, p_account uuid, p_data jsonb, p_at timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO events (type, account_id, data, created_at) VALUES (p_type, p_account, p_data, p_at)
$$;

-- The one write path: every movement of every operation is written here. The caller holds the
-- accounts' row locks; `p_before`: the accounts as it read them under those locks, when nothing
-- wrote them since (engine_apply's engine_lock_accounts; every account moved must be in it),
-- or NULL: read here. It writes, in order:
-- 1. the operations' own rows as engine_apply built them: jobs made (p_jobs), reservations made
--    (p_made) and changed (p_changed: state, committed_amount, resolved_at, expires_at), and
--    the keys' budget counts (p_budgets);
-- 2. the movements, in array order: each account and grant moves by the sum of its movements
--    (one UPDATE per table), and each movement becomes a ledger entry with the balances after it;
-- 3. the events: credit.created and adjustment.created (once per movement), grant.expired (per
--    grant_expire entry), reservation.expired (with its last return entry), account.balance_low
--    / account.balance_recovered when engine_is_low differs from the state last reported
--    (accounts.balance_low), account.balance_depleted when available reaches 0;
-- 4. engine_topup_evaluate for each account whose threshold rule is now due (engine_topup_due).
-- Returns the number of entries written. The arithmetic is a loop over variables, then one
-- plain statement per table with rows: a statement starts every plan node it names, rows or
-- none, and one statement of running sums cost more (docs/decisions/0001-one-engine.md).
CREATE FUNCTION engine_record(p_moves engine_movement[], p_made engine_reservation[] DEFAULT '{}',
    p_changed engine_reservation[] DEFAULT '{}', p_jobs engine_job[] DEFAULT '{}',
    p_budgets engine_budget_move[] DEFAULT '{}', p_before engine_account[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    watched engine_account[];
    lapsed bigint;
    topups uuid[];
    topped uuid;
    -- (Arrays start NULL and grow by assignment: an initial value is an expression to set up.)
    ids uuid[];
    -- Per account (as `ids`): the account as the movements leave it, their number, and whether
    -- one may write an event (NULL: none).
    acct engine_account[];
    moved integer[];
    watch boolean[];
    -- Per movement: the balances after it.
    after engine_balances[];
    -- Per grant (as `gids`): what the movements add.
    gids uuid[];
    gmove engine_grant_balances[];
    m engine_movement;
    d engine_balances;
    g engine_grant_balances;
    j integer;
    k integer;
    spender api_keys;
    b engine_account;
    notice text;
BEGIN
    IF cardinality(p_jobs) > 0 THEN
        INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost,
            reservation_id)
        SELECT j.id, j.account_id, j.request_id, j.request_hash, j.kind, j.params, j.cost,
               j.reservation_id
        FROM unnest(p_jobs) j;
    END IF;
    IF cardinality(p_made) > 0 THEN
        INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds, state,
            committed_amount, expires_at, job_id, created_at, resolved_at, draws, budget_key_id,
            budget_period_start)
        SELECT r.id, r.account_id, r.request_id, r.amount, r.requested_ttl_seconds, r.state,
               r.committed_amount, r.expires_at, r.job_id, r.created_at, r.resolved_at, r.draws,
               r.budget_key_id, r.budget_period_start
        FROM unnest(p_made) r;
    END IF;
    IF cardinality(p_changed) > 0 THEN
        UPDATE reservations r
        SET state = c.state, committed_amount = c.committed_amount, resolved_at = c.resolved_at,
            expires_at = c.expires_at
        FROM unnest(p_changed) c
        WHERE r.id = c.id AND r.id = ANY (ARRAY(SELECT x.id FROM unnest(p_changed) x));
    END IF;
    -- Each key's budget_spent takes the batch's reserves in their period (one of an earlier period
    -- restarts from 0), and what its settled reservations give back while the key still counts
    -- their period. Reaching budget_low_percent of the budget sends key.budget_low, reaching the
    -- budget key.budget_exhausted, each once a period.
    IF cardinality(p_budgets) > 0 THEN
        FOR spender IN
            UPDATE api_keys x
            SET budget_spent = CASE WHEN d.start IS NULL OR x.budget_period_start = d.start
                                    THEN x.budget_spent ELSE 0 END
                               + d.taken
                               + COALESCE((SELECT sum(b.tokens) FROM unnest(p_budgets) b
                                           WHERE b.key_id = x.id AND b.tokens < 0
                                             AND b.period_start
                                                 = COALESCE(d.start, x.budget_period_start)), 0),
                budget_notified = CASE WHEN d.start IS NULL OR x.budget_period_start = d.start
                                       THEN x.budget_notified END,
                budget_period_start = COALESCE(d.start, x.budget_period_start)
            FROM (SELECT b.key_id, max(b.period_start) FILTER (WHERE b.tokens > 0) AS start,
                         COALESCE(sum(b.tokens) FILTER (WHERE b.tokens > 0), 0) AS taken
                  FROM unnest(p_budgets) b GROUP BY b.key_id) d
            WHERE x.id = d.key_id
            RETURNING x.*
        LOOP
            -- Low before exhausted: a batch may cross both.
            FOREACH notice IN ARRAY ARRAY['low', 'exhausted'] LOOP
                CONTINUE WHEN spender.budget_notified IS NOT DISTINCT FROM 'exhausted'
                    OR (notice = 'low' AND (spender.budget_notified IS NOT DISTINCT FROM 'low'
                        OR spender.budget_spent * 100
                           < spender.budget_tokens * spender.budget_low_percent))
                    OR (notice = 'exhausted' AND spender.budget_spent < spender.budget_tokens);
                spender.budget_notified := notice;
                PERFORM engine_emit_event(CASE notice WHEN 'low' THEN 'key.budget_low'
                                                      ELSE 'key.budget_exhausted' END,
                    spender.account_id,
                    jsonb_build_object('account_id', spender.account_id, 'key_id', spender.id,
                        'label', spender.label,
                        'budget', engine_key_budget_json(spender.budget_tokens,
                            spender.budget_period, spender.budget_time_zone,
                            spender.budget_low_percent, spender.budget_spent,
                            spender.budget_period_start, engine_now())),
                    engine_now());
                UPDATE api_keys SET budget_notified = notice WHERE id = spender.id;
            END LOOP;
        END LOOP;
    END IF;
    IF COALESCE(cardinality(p_moves), 0) = 0 THEN
        RETURN 0; -- (an extension: the reservation's row alone)
    END IF;
    IF p_before IS NULL THEN
        SELECT array_agg(ROW(a.id, a.status, a.available, a.reserved, a.used, a.credited,
                             a.adjusted, a.grant_expired, a.active_reservations,
                             a.max_active_reservations, a.low_balance_threshold, a.balance_low,
                             a.topup_threshold, a.topup_armed, a.topup_unconsumed)::engine_account)
        INTO p_before
        FROM accounts a WHERE a.id = ANY (ARRAY(SELECT m.account FROM unnest(p_moves) m));
    END IF;
    FOREACH b IN ARRAY p_before LOOP
        ids := ids || b.id;
    END LOOP;
    acct := p_before;
    FOR i IN 1 .. cardinality(p_moves) LOOP
        m := p_moves[i];
        j := array_position(ids, m.account);
        d := engine_deltas(m.kind, m.amount, m.reservation);
        acct[j] := engine_account_moved(acct[j], d, m.active_delta);
        moved[j] := COALESCE(moved[j], 0) + 1;
        after[i] := ROW((acct[j]).available, (acct[j]).reserved, (acct[j]).used, NULL, NULL,
                        NULL)::engine_balances;
        -- Events are tested only for watched accounts: these, and those with a threshold.
        IF m.kind IN ('credit', 'adjustment', 'expire', 'grant_expire') OR (acct[j]).available = 0
        THEN
            watch[j] := true;
            IF m.kind = 'grant_expire' THEN
                lapsed := COALESCE(lapsed, 0) + m.amount;
            END IF;
        END IF;
        IF m.grant_id IS NOT NULL THEN
            g := engine_grant_deltas(m.kind, m.amount, d);
            k := array_position(gids, m.grant_id);
            IF k IS NULL THEN
                gids := gids || m.grant_id;
                gmove := gmove || g;
            ELSE
                gmove[k] := engine_grant_moved(gmove[k], g);
            END IF;
        END IF;
    END LOOP;
    -- (The accounts as read under their locks, so each column is set to what acct holds.)
    UPDATE accounts a
    SET available = (acct[array_position(ids, a.id)]).available,
        reserved = (acct[array_position(ids, a.id)]).reserved,
        used = (acct[array_position(ids, a.id)]).used,
        credited = (acct[array_position(ids, a.id)]).credited,
        adjusted = (acct[array_position(ids, a.id)]).adjusted,
        grant_expired = (acct[array_position(ids, a.id)]).grant_expired,
        active_reservations = (acct[array_position(ids, a.id)]).active_reservations,
        topup_unconsumed = engine_topup_unconsumed(a.topup_unconsumed,
            (acct[array_position(ids, a.id)]).used - a.used, 0),
        version = a.version + moved[array_position(ids, a.id)],
        balance_low = engine_is_low((acct[array_position(ids, a.id)]).available,
                                    a.low_balance_threshold),
        updated_at = now()
    WHERE a.id = ANY (ids) AND moved[array_position(ids, a.id)] > 0;
    IF cardinality(gids) > 0 THEN
        -- The grants' CHECKs guard that none is overdrawn.
        UPDATE credit_grants g
        SET remaining = g.remaining + (gmove[array_position(gids, g.id)]).remaining,
            reserved = g.reserved + (gmove[array_position(gids, g.id)]).reserved,
            consumed = g.consumed + (gmove[array_position(gids, g.id)]).consumed,
            debited = g.debited + (gmove[array_position(gids, g.id)]).debited,
            expired = g.expired + (gmove[array_position(gids, g.id)]).expired,
            -- Changes only when the grant empties or refills, so other updates stay HOT.
            drawable = g.remaining + (gmove[array_position(gids, g.id)]).remaining > 0
        WHERE g.id = ANY (gids);
    END IF;
    -- Ids in array order: an account's k-th entry (by id) is its k-th movement.
    INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
        used_after, reservation_id, job_id, external_ref, reason, actor, created_at, grant_id,
        api_key_id)
    SELECT e.account, e.kind, e.amount, e.av, e.rs, e.us, e.reservation, e.job, e.external_ref,
           e.reason, e.actor, e.at, e.grant_id, e.api_key
    FROM unnest(p_moves, after)
         AS e (account, kind, amount, active_delta, reservation, job, external_ref, reason,
               actor, at, grant_id, api_key, av, rs, us, cr, ad, ge);
    FOR j IN 1 .. cardinality(ids) LOOP
        CONTINUE WHEN moved[j] IS NULL;
        b := p_before[j];
        IF watch[j] OR b.low_balance_threshold > 0 THEN
            watched := watched || b;
        END IF;
        -- Two IFs: engine_topup_due's test is compiled only where a rule is set.
        IF b.topup_threshold > 0 THEN
            IF engine_topup_due((acct[j]).available, b.topup_threshold, b.topup_armed,
                                engine_topup_unconsumed(b.topup_unconsumed,
                                                        (acct[j]).used - b.used, 0)) THEN
                topups := topups || ids[j];
            END IF;
        END IF;
    END LOOP;
    IF lapsed IS NOT NULL THEN
        PERFORM engine_tally_add('grant_expired', lapsed);
    END IF;
    IF watched IS NOT NULL THEN
        WITH marked AS (
            -- Each entry of a watched account, with the account as before the batch (b);
            -- low_before at its first entry is the state last reported (balance_low).
            SELECT e AS entry, e.id, e.account_id, e.kind, e.available_after, e.created_at,
                   d.available AS d_available, b.low_balance_threshold AS threshold,
                   b.credited + (sum(d.credited) OVER w)::bigint AS credited_after,
                   b.adjusted + (sum(d.adjusted) OVER w)::bigint AS adjusted_after,
                   engine_is_low(e.available_after, b.low_balance_threshold) AS low,
                   CASE WHEN row_number() OVER w = 1 THEN b.balance_low
                        ELSE engine_is_low(e.available_after - d.available, b.low_balance_threshold)
                   END AS low_before,
                   -- One entry per grant a movement spans: its event comes with the last.
                   e.id = max(e.id) OVER (PARTITION BY e.account_id, e.kind, e.reservation_id,
                                                       e.external_ref) AS closes,
                   -- The expired reservation's last return (expire or grant_expire).
                   (e.kind IN ('expire', 'grant_expire') AND e.reservation_id IS NOT NULL
                    AND e.id = max(e.id) FILTER (WHERE e.kind IN ('expire', 'grant_expire'))
                                        OVER (PARTITION BY e.account_id, e.reservation_id)
                    AND (SELECT r.state FROM reservations r WHERE r.id = e.reservation_id)
                        = 'expired') AS closes_expiry
            -- (An account's latest entries are this call's: its row lock.)
            FROM unnest(watched) b
            CROSS JOIN LATERAL (SELECT x.* FROM ledger_entries x WHERE x.account_id = b.id
                                ORDER BY x.id DESC LIMIT moved[array_position(ids, b.id)]) e
            CROSS JOIN LATERAL (SELECT (engine_deltas(e.kind, e.amount, e.reservation_id)).*) d
            WINDOW w AS (PARTITION BY e.account_id ORDER BY e.id)
        ), notable AS (
            -- The entries that write an event, with the event's common part.
            SELECT m.*,
                   engine_event_balances(m.account_id, (m.entry).available_after,
                       (m.entry).reserved_after, (m.entry).used_after, m.credited_after,
                       m.adjusted_after, m.threshold)
                       || jsonb_build_object('entry', engine_entry_json(to_jsonb(m.entry)))
                       AS account_json
            FROM marked m
            WHERE (m.kind IN ('credit', 'adjustment') AND m.closes)
               OR m.closes_expiry
               OR m.kind = 'grant_expire'
               OR (m.threshold > 0 AND m.low <> m.low_before)
               OR (m.available_after = 0 AND m.available_after - m.d_available > 0)
        )
        INSERT INTO events (type, account_id, data, created_at)
        SELECT ev.type, ev.account_id, ev.data, ev.created_at
        FROM (
            SELECT m.id, 1 AS step, m.kind || '.created' AS type, m.account_id,
                   m.account_json
                       || (SELECT engine_external_json(m.kind, b.booking, to_jsonb(m.entry),
                                      (SELECT to_jsonb(g) FROM credit_grants g WHERE g.id = b.id))
                           FROM engine_external_booking((m.entry).external_ref, m.kind) b)
                       AS data,
                   m.created_at
            FROM notable m WHERE m.kind IN ('credit', 'adjustment') AND m.closes
            UNION ALL
            SELECT m.id, 2, 'grant.expired', m.account_id,
                   m.account_json || jsonb_build_object('grant_id', (m.entry).grant_id,
                       'amount', (m.entry).amount,
                       'grant', (SELECT engine_grant_json(to_jsonb(g)) FROM credit_grants g
                                 WHERE g.id = (m.entry).grant_id)),
                   m.created_at
            FROM notable m WHERE m.kind = 'grant_expire'
            UNION ALL
            SELECT m.id, 3, 'reservation.expired', m.account_id,
                   m.account_json || jsonb_build_object('reservation',
                       (SELECT engine_reservation_json(to_jsonb(r)) FROM reservations r
                        WHERE r.id = (m.entry).reservation_id)),
                   m.created_at
            FROM notable m WHERE m.closes_expiry
            UNION ALL
            SELECT m.id, 4,
                   CASE WHEN m.low THEN 'account.balance_low' ELSE 'account.balance_recovered' END,
                   m.account_id, m.account_json, m.created_at
            FROM notable m WHERE m.threshold > 0 AND m.low <> m.low_before
            UNION ALL
            SELECT m.id, 5, 'account.balance_depleted', m.account_id, m.account_json, m.created_at
            FROM notable m WHERE m.available_after = 0 AND m.available_after - m.d_available > 0
        ) ev
        ORDER BY ev.id, ev.step;
    END IF;
    -- Last, so a top-up's entries and events follow those of the movement that crossed its line.
    IF topups IS NOT NULL THEN
        FOREACH topped IN ARRAY topups LOOP
            PERFORM engine_topup_evaluate(topped, engine_now());
        END LOOP;
    END IF;
    RETURN cardinality(p_moves);
END;
$$;

-- After a change of the account's threshold (no movement): brings accounts.balance_low up to
-- date, with its event (no entry) if it changed and a threshold is set; 0 forgets it silently.
CREATE FUNCTION engine_low_balance(p_account accounts)
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    low boolean := engine_is_low(p_account.available, p_account.low_balance_threshold);
BEGIN
    IF low = p_account.balance_low THEN
        RETURN;
    END IF;
    UPDATE accounts SET balance_low = low WHERE id = p_account.id;
    IF p_account.low_balance_threshold > 0 THEN
        PERFORM engine_emit_event(
            CASE WHEN low THEN 'account.balance_low' ELSE 'account.balance_recovered' END,
            p_account.id, engine_event_account(p_account) || '{"entry": null}', now());
    END IF;
END;
$$;
