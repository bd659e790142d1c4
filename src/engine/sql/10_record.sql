-- The arithmetic of every movement, and the one place ledger entries and
-- the events of a movement are written.

-- The time of this transaction's movements: one stamp per transaction,
-- not per statement (issue 35). The first call in a transaction takes
-- clock_timestamp() and keeps it (a transaction-local setting); every
-- later call in the same transaction answers the same instant, so every
-- entry, event and settlement a transaction writes carries one time, and
-- no instant falls between two entries of one transaction. Writers call it
-- after taking their accounts' row locks, so an account's entries still
-- carry times in the order they were written.
-- (PL/pgSQL: an SQL function that cannot be inlined is planned again at
-- every call, and every operation asks.)
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

-- What a movement of `kind` and `amount` does to each balance. A
-- grant_expire takes tokens out of the account for good (grant_expired):
-- from `available` when a grant lapses holding them, from `reserved` when
-- they are the rest of a reservation (`p_reservation` set) going back to a
-- grant that has lapsed.
--
--   kind          available  reserved  used  credited  adjusted  grant_expired
--   credit        +a                          +a
--   adjustment    +a                                    +a
--   reserve       -a         +a
--   commit                   -a        +a
--   release       +a         -a
--   expire        +a         -a
--   grant_expire  -a (none)  -a (set)                             +a
--
-- (a: `p_amount`; (none)/(set): `p_reservation` NULL or set.) One value,
-- for the write path's loop over a batch's movements (engine_record) and
-- the batch's own picture of an account (engine_moved); inlined where a
-- statement calls it. An unknown kind moves nothing (and the ledger's row
-- rules refuse its entry).
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

-- What a movement of `kind` and `amount` does to the grant it names
-- (engine_movement.grant_id). A credit or a positive adjustment moves
-- nothing: its grant is made holding its tokens. A negative adjustment
-- takes remaining tokens for good (debited). A grant_expire takes them for
-- good too (expired): from remaining when the grant lapses, from reserved
-- when a reservation's rest goes back to it after it lapsed.
--
--   kind          remaining      reserved   consumed  debited        expired
--   credit
--   adjustment    min(a, 0)                           -min(a, 0)
--   reserve       -a             +a
--   commit                       -a         +a
--   release       +a             -a
--   expire        +a             -a
--   grant_expire  -a (none)      -a (set)                            +a
--
-- (From the account's, `p_account` = engine_deltas of the movement: a
-- grant's reserved, consumed and expired move as the account's reserved,
-- used and grant_expired; its remaining as available, but for a credit
-- and an adjustment. One value; an unknown kind moves nothing. It takes
-- the account's deltas rather than computing them again: inlined, each
-- call of engine_deltas is its whole expression.)
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

-- The low-balance rule: an account is low when a threshold is set (> 0)
-- and its available tokens are below it.
CREATE FUNCTION engine_is_low(p_available bigint, p_threshold bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_threshold > 0 AND p_available < p_threshold
$$;

-- A transaction's tallies for its callers' metrics (transaction-local
-- settings `token_billing.<name>`): what was added up so far, adding to
-- it, and taking it (read and back to 0; the callers count it once the
-- transaction commits). The tallies: grant_expired (tokens that left by a
-- grant's lapse: token_billing_tokens_total{movement="grant_expired"}) and
-- topup_credited (tokens top-up rules credited: movement="credited").
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

-- A threshold top-up rule fires only against consumption: the tokens it
-- added (granted, or requested and not expired) that nothing has used
-- since, accounts.topup_unconsumed, must be 0 before it fires again
-- (engine_topup_due). This is that count after `p_less` tokens stop
-- counting (used by commits, credited by something else than the rule,
-- or the tokens of a request that expired unanswered; NULL: all, as a new
-- or re-armed rule does) and the rule adds `p_more`. Never below 0. A
-- release, an expiry or a lapse uses nothing, so it never lowers the
-- count: tokens that came back, or lapsed, never make the rule fire
-- again. So the tokens a rule adds in any period are at most the tokens
-- used (or credited otherwise) in it, plus one firing.
CREATE FUNCTION engine_topup_unconsumed(p_before bigint, p_less bigint, p_more bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT GREATEST(p_before - COALESCE(p_less, p_before), 0) + p_more
$$;

-- Whether an account's top-up state must change (80_topups.sql): its
-- threshold rule is armed, `available` went below the line and nothing
-- the rule added is unused (`p_unconsumed` 0, engine_topup_unconsumed): it
-- fires; or it is not armed and `available` is back at or above the line:
-- it re-arms. `p_line` is accounts.topup_threshold (0: no live threshold
-- rule, never due). engine_record calls engine_topup_evaluate for every
-- account its movements make this true.
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

-- The one place an event is written one at a time (the movements' writer,
-- engine_record, inserts its rows into the same table in the same shape).
CREATE FUNCTION engine_emit_event(p_type text, p_account uuid, p_data jsonb, p_at timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO events (type, account_id, data, created_at) VALUES (p_type, p_account, p_data, p_at)
$$;

-- The one write path: every movement of every operation, whatever the
-- batch or the caller, is written here. Applies movements (of any
-- accounts) in array order: each account's balances move by the
-- sum of its movements (one UPDATE per account), each movement becomes a
-- ledger entry carrying the balances after it (running sums in array
-- order), and the movement's events are written next to it:
-- credit.created, adjustment.created (once per movement, with its last
-- entry when it spans several grants), grant.expired (once per
-- grant_expire entry: the grant and the tokens it took),
-- reservation.expired (once per expired reservation, with its last return
-- entry: `expire`, or `grant_expire` when it went to a lapsed grant), and
-- the
-- crossings — account.balance_low / account.balance_recovered when the
-- low-balance state (engine_is_low) changes from the one last reported
-- (accounts.balance_low), account.balance_depleted when available reaches
-- 0. Before them, the operations' own rows: the reservations made
-- (`p_made`) and changed (`p_changed`: state, committed_amount,
-- resolved_at, expires_at) and the jobs made (`p_jobs`), as the deciding
-- functions built them (engine_apply). Then each account whose threshold
-- top-up rule the movements made due fires or re-arms it
-- (engine_topup_due, engine_topup_evaluate). The caller holds the
-- accounts' row locks. Returns the number of entries written (the
-- account's latest entries are this call's, under its lock).
--
-- One plain statement per table that has rows to write: the reservations
-- made, those changed, the accounts (one row each), the grants, the
-- entries, then the events — only when one of the batch's accounts can
-- have one (a threshold set, a credit, adjustment or expiry, a balance
-- reaching 0). The arithmetic (each account's and grant's totals, each
-- entry's balances after it) is a loop in this function's variables: a
-- statement starts every plan node it names, rows or none, and one
-- statement of running sums cost more (docs/decisions/0001-one-engine.md).
CREATE FUNCTION engine_record(p_moves engine_movement[], p_made engine_reservation[] DEFAULT '{}',
    p_changed engine_reservation[] DEFAULT '{}', p_jobs engine_job[] DEFAULT '{}',
    p_budgets engine_budget_move[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    watched accounts[];
    lapsed bigint;
    topups uuid[];
    topped uuid;
    before accounts[];
    ids uuid[];
    -- Per account (as `ids`): balances as the movements leave them, and
    -- what they add.
    av bigint[]; rs bigint[]; us bigint[]; cr bigint[]; ad bigint[]; ge bigint[];
    moved bigint[]; active integer[]; watch boolean[];
    -- Per movement: the balances after it.
    av_after bigint[] := '{}'; rs_after bigint[] := '{}'; us_after bigint[] := '{}';
    -- Per grant (as `gids`): what the movements add.
    gids uuid[] := '{}';
    g_rem bigint[] := '{}'; g_res bigint[] := '{}'; g_con bigint[] := '{}';
    g_deb bigint[] := '{}'; g_exp bigint[] := '{}';
    m engine_movement;
    d engine_balances;
    g engine_grant_balances;
    j integer;
    k integer;
    spender api_keys;
    b accounts;
    notice text;
BEGIN
    -- The operations' own rows first, each table only when it has some.
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
    -- The keys' budget counts (only a key with a budget has any), one
    -- statement per table: the reservations made against a budget carry
    -- the key and the period they count in; each key's count takes the
    -- batch's reserves in their period (a count of an earlier period
    -- starts again from 0), and what its settled reservations give back
    -- only while the key still counts their period. A count reaching
    -- budget_low_percent of the budget sends key.budget_low, the budget
    -- key.budget_exhausted, each once a period.
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
            -- Each notice once a period, in order (a batch may cross both).
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
    IF cardinality(p_moves) = 0 THEN
        RETURN 0; -- (an extension: the reservation's row alone)
    END IF;
    -- The accounts as they are (the caller holds their row locks), and
    -- each one's balances as the movements leave it, in array order: each
    -- movement's entry carries the balances after it. The grants' totals
    -- likewise: arithmetic alone, in this function's variables (a
    -- statement starts every plan node it names; an assignment starts no
    -- plan), then one plain statement per table.
    SELECT array_agg(a.id), array_agg(a), array_agg(a.available), array_agg(a.reserved),
           array_agg(a.used)
    INTO ids, before, av, rs, us
    FROM accounts a WHERE a.id = ANY (ARRAY(SELECT m.account FROM unnest(p_moves) m));
    cr := array_fill(0::bigint, ARRAY[cardinality(ids)]);
    ad := cr; ge := cr; moved := cr;
    active := array_fill(0, ARRAY[cardinality(ids)]);
    watch := array_fill(false, ARRAY[cardinality(ids)]);
    FOR i IN 1 .. cardinality(p_moves) LOOP
        m := p_moves[i];
        j := array_position(ids, m.account);
        d := engine_deltas(m.kind, m.amount, m.reservation);
        av[j] := av[j] + d.available;
        rs[j] := rs[j] + d.reserved;
        us[j] := us[j] + d.used;
        cr[j] := cr[j] + d.credited;
        ad[j] := ad[j] + d.adjusted;
        ge[j] := ge[j] + d.grant_expired;
        active[j] := active[j] + m.active_delta;
        moved[j] := moved[j] + 1;
        av_after[i] := av[j]; rs_after[i] := rs[j]; us_after[i] := us[j];
        -- An account with an event to test (engine_record's events below).
        IF m.kind IN ('credit', 'adjustment', 'expire', 'grant_expire') OR av[j] = 0 THEN
            watch[j] := true;
        END IF;
        IF m.kind = 'grant_expire' THEN
            lapsed := COALESCE(lapsed, 0) + m.amount;
        END IF;
        IF m.grant_id IS NOT NULL THEN
            k := array_position(gids, m.grant_id);
            IF k IS NULL THEN
                gids := gids || m.grant_id;
                k := cardinality(gids);
                g_rem[k] := 0; g_res[k] := 0; g_con[k] := 0; g_deb[k] := 0; g_exp[k] := 0;
            END IF;
            g := engine_grant_deltas(m.kind, m.amount, d);
            g_rem[k] := g_rem[k] + g.remaining;
            g_res[k] := g_res[k] + g.reserved;
            g_con[k] := g_con[k] + g.consumed;
            g_deb[k] := g_deb[k] + g.debited;
            g_exp[k] := g_exp[k] + g.expired;
        END IF;
    END LOOP;
    UPDATE accounts a
    SET available = av[array_position(ids, a.id)],
        reserved = rs[array_position(ids, a.id)],
        used = us[array_position(ids, a.id)],
        credited = a.credited + cr[array_position(ids, a.id)],
        adjusted = a.adjusted + ad[array_position(ids, a.id)],
        grant_expired = a.grant_expired + ge[array_position(ids, a.id)],
        active_reservations = a.active_reservations + active[array_position(ids, a.id)],
        topup_unconsumed = engine_topup_unconsumed(a.topup_unconsumed,
                                                   us[array_position(ids, a.id)] - a.used, 0),
        version = a.version + moved[array_position(ids, a.id)],
        balance_low = engine_is_low(av[array_position(ids, a.id)], a.low_balance_threshold),
        updated_at = now()
    WHERE a.id = ANY (ids);
    IF cardinality(gids) > 0 THEN
        -- The grants' CHECKs guard that none is overdrawn.
        UPDATE credit_grants g
        SET remaining = g.remaining + g_rem[array_position(gids, g.id)],
            reserved = g.reserved + g_res[array_position(gids, g.id)],
            consumed = g.consumed + g_con[array_position(gids, g.id)],
            debited = g.debited + g_deb[array_position(gids, g.id)],
            expired = g.expired + g_exp[array_position(gids, g.id)],
            -- Changes (and costs index writes) only when the grant empties
            -- or fills again: every other grant update is HOT.
            drawable = g.remaining + g_rem[array_position(gids, g.id)] > 0
        WHERE g.id = ANY (gids);
    END IF;
    -- Entries get their ids in array order: an account's k-th entry (by
    -- id) is its k-th movement.
    INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
        used_after, reservation_id, job_id, external_ref, reason, actor, created_at, grant_id,
        api_key_id)
    SELECT e.account, e.kind, e.amount, e.av, e.rs, e.us, e.reservation, e.job, e.external_ref,
           e.reason, e.actor, e.at, e.grant_id, e.api_key
    FROM unnest(p_moves, av_after, rs_after, us_after)
         AS e (account, kind, amount, active_delta, reservation, job, external_ref, reason,
               actor, at, grant_id, api_key, av, rs, us);
    FOR j IN 1 .. cardinality(ids) LOOP
        b := before[j];
        IF watch[j] OR b.low_balance_threshold > 0 THEN
            watched := watched || b;
        END IF;
        -- Accounts whose threshold top-up rule must fire or re-arm. (Two
        -- tests: the rule's is compiled only where a rule is set.)
        IF b.topup_threshold > 0 THEN
            IF engine_topup_due(av[j], b.topup_threshold, b.topup_armed,
                                engine_topup_unconsumed(b.topup_unconsumed, us[j] - b.used, 0)) THEN
                topups := topups || ids[j];
            END IF;
        END IF;
    END LOOP;

    -- Tokens that left by a grant's lapse, added up for the caller's
    -- metrics (the tally grant_expired) for the rest of the transaction.
    IF lapsed IS NOT NULL THEN
        PERFORM engine_tally_add('grant_expired', lapsed);
    END IF;

    IF watched IS NOT NULL THEN
        WITH marked AS (
            -- Each entry of a watched account with the account as it was
            -- before the batch (b). The low-balance state before a
            -- movement is the one last reported (accounts.balance_low) for
            -- the account's first movement, and follows from the balance
            -- before it for the others.
            SELECT e AS entry, e.id, e.account_id, e.kind, e.available_after, e.created_at,
                   d.available AS d_available, b.low_balance_threshold AS threshold,
                   b.credited + (sum(d.credited) OVER w)::bigint AS credited_after,
                   b.adjusted + (sum(d.adjusted) OVER w)::bigint AS adjusted_after,
                   engine_is_low(e.available_after, b.low_balance_threshold) AS low,
                   CASE WHEN row_number() OVER w = 1 THEN b.balance_low
                        ELSE engine_is_low(e.available_after - d.available, b.low_balance_threshold)
                   END AS low_before,
                   -- A movement spanning several grants writes one entry
                   -- per grant (all in this call); its event (credit,
                   -- adjustment, expiry) comes once, with its last entry.
                   e.id = max(e.id) OVER (PARTITION BY e.account_id, e.kind, e.reservation_id,
                                                       e.external_ref) AS closes,
                   -- A reservation's expiry: its reservation.expired comes
                   -- with its last return, whether that went back
                   -- (`expire`) or expired with a lapsed grant
                   -- (`grant_expire`).
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
            -- Every grant_expire entry: the grant, and the tokens it took.
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

    -- A threshold rule fires (or re-arms) after the movement that crossed
    -- its line, in its transaction: its top-up's entries and events come
    -- after this movement's.
    IF topups IS NOT NULL THEN
        FOREACH topped IN ARRAY topups LOOP
            PERFORM engine_topup_evaluate(topped, engine_now());
        END LOOP;
    END IF;

    RETURN cardinality(p_moves);
END;
$$;

-- After a change of the account's threshold (no movement): the
-- low-balance state is brought up to date, with its event (no entry: none
-- moved it) when it changed and a threshold is set. Switching the
-- threshold off (0) forgets the state without an event.
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
