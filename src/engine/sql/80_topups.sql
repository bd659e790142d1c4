-- Automatic top-ups (docs/topups.md): an account's rules credit it, or ask the customer's billing
-- to, when its balance falls below a threshold or once per period. A threshold rule is decided in
-- the crossing movement's own transaction under the account's row lock (engine_record calls
-- engine_topup_evaluate), so concurrent crossings are decided in turn and fire once.

-- The period of a schedule rule that holds `p_at`: [start, end), local midnights in `p_zone`;
-- weekly from ISO day `p_anchor` (1 = Monday), monthly from day `p_anchor` (1 … 28).
CREATE FUNCTION engine_topup_period(p_period text, p_anchor integer, p_zone text,
    p_at timestamptz, OUT period_start timestamptz, OUT period_end timestamptz)
LANGUAGE sql STABLE AS $$
    WITH l AS (
        SELECT (p_at AT TIME ZONE p_zone)::date AS d
    ), s AS (
        SELECT CASE p_period
            WHEN 'daily' THEN l.d
            WHEN 'weekly' THEN l.d - ((extract(isodow FROM l.d)::integer - p_anchor + 7) % 7)
            ELSE (make_date(extract(year FROM l.d)::integer, extract(month FROM l.d)::integer,
                            p_anchor)
                  - CASE WHEN extract(day FROM l.d) >= p_anchor THEN interval '0'
                         ELSE interval '1 month' END)::date
        END AS start
        FROM l
    )
    SELECT s.start::timestamp AT TIME ZONE p_zone,
           (s.start + CASE p_period WHEN 'daily' THEN interval '1 day'
                                    WHEN 'weekly' THEN interval '7 days'
                                    ELSE interval '1 month' END) AT TIME ZONE p_zone
    FROM s
$$;

-- A duration as the API shows it (ISO 8601), in its largest whole unit.
CREATE FUNCTION engine_duration_text(p_seconds bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_seconds IS NULL THEN NULL
                WHEN p_seconds % 86400 = 0 THEN 'P' || p_seconds / 86400 || 'D'
                WHEN p_seconds % 3600 = 0 THEN 'PT' || p_seconds / 3600 || 'H'
                WHEN p_seconds % 60 = 0 THEN 'PT' || p_seconds / 60 || 'M'
                ELSE 'PT' || p_seconds || 'S' END
$$;

-- A firing as the API and the events show it. A request is a firing whose outcome is
-- `requested`; its firing_id is the external_ref the customer's credit names.
CREATE FUNCTION engine_topup_firing_json(p_firing jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('firing_id', p_firing->'id', 'rule_id', p_firing->'rule_id',
        'account_id', p_firing->'account_id', 'outcome', p_firing->'outcome',
        'tokens', p_firing->'tokens',
        'period_start', engine_time_of(p_firing->'period_start'),
        'cap_period', p_firing->'cap_period',
        'state', p_firing->'state', 'expires_at', engine_time_of(p_firing->'expires_at'),
        'credit_id', p_firing->'credit_id',
        'created_at', engine_time_of(p_firing->'created_at'),
        'resolved_at', engine_time_of(p_firing->'resolved_at'))
$$;

-- What a rule is doing, as the API and the console show it: disabled (never fires), scheduled
-- (a schedule rule, firing once per period), or for a threshold rule:
--   request_open         its request waits for the customer;
--   armed                fires at the next movement that leaves `available` below its line;
--   waiting_for_use      below its line, but what it added is not used yet (unconsumed_tokens):
--                        fires once that much is used (or credited otherwise);
--   cap_reached          below its line, stopped by a cap until the balance is back at the line;
--   waiting_for_balance  below its line after a firing that did not lift it: re-arms when the
--                        balance is back at the line.
CREATE FUNCTION engine_topup_status(p_rule jsonb, a accounts) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT (p_rule->>'enabled')::boolean OR p_rule->>'deleted_at' IS NOT NULL
            THEN 'disabled'
        WHEN p_rule->>'trigger' = 'schedule' THEN 'scheduled'
        WHEN EXISTS (SELECT 1 FROM topup_firings f
                     WHERE f.rule_id = (p_rule->>'id')::uuid AND f.state = 'open')
            THEN 'request_open'
        WHEN a.topup_armed AND a.topup_unconsumed > 0
             AND a.available < (p_rule->>'threshold_tokens')::bigint THEN 'waiting_for_use'
        WHEN a.topup_armed OR a.available >= (p_rule->>'threshold_tokens')::bigint THEN 'armed'
        WHEN (SELECT f.outcome FROM topup_firings f WHERE f.rule_id = (p_rule->>'id')::uuid
              ORDER BY f.created_at DESC, f.id DESC LIMIT 1) = 'cap_reached' THEN 'cap_reached'
        ELSE 'waiting_for_balance'
    END
$$;

-- A rule as the API and the events show it, with its status and its last firing.
CREATE FUNCTION engine_topup_rule_json(p_rule jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('rule_id', p_rule->'id', 'account_id', p_rule->'account_id',
        'trigger', p_rule->'trigger', 'threshold_tokens', p_rule->'threshold_tokens',
        'period', p_rule->'period', 'anchor_day', p_rule->'anchor_day',
        'time_zone', p_rule->'time_zone',
        'method', p_rule->'method', 'tokens', p_rule->'tokens',
        'target_tokens', p_rule->'target_tokens',
        'mode', p_rule->'mode',
        'request_ttl', engine_duration_text((p_rule->>'request_ttl_seconds')::bigint),
        'priority', CASE WHEN p_rule->>'mode' = 'grant' THEN p_rule->'priority' END,
        'expires_after', engine_duration_text((p_rule->>'expires_after_seconds')::bigint),
        'expires_at_period_end', p_rule->'expires_at_period_end',
        'rollover', CASE WHEN p_rule->>'rollover_max_tokens' IS NOT NULL THEN jsonb_build_object(
            'max_tokens', p_rule->'rollover_max_tokens', 'expires_after',
            engine_duration_text((p_rule->>'rollover_expires_after_seconds')::bigint)) END,
        'max_tokens_per_day', p_rule->'max_tokens_per_day',
        'max_tokens_per_month', p_rule->'max_tokens_per_month',
        'amount_paid', p_rule->'amount_paid', 'currency', p_rule->'currency',
        'enabled', p_rule->'enabled',
        'armed', CASE WHEN p_rule->>'trigger' = 'threshold' THEN a.topup_armed END,
        'unconsumed_tokens', CASE WHEN p_rule->>'trigger' = 'threshold'
                                  THEN a.topup_unconsumed END,
        'status', engine_topup_status(p_rule, a),
        'created_at', engine_time_of(p_rule->'created_at'),
        'updated_at', engine_time_of(p_rule->'updated_at'),
        'last_firing', (SELECT engine_topup_firing_json(to_jsonb(f)) FROM topup_firings f
                        WHERE f.rule_id = (p_rule->>'id')::uuid
                        ORDER BY f.created_at DESC, f.id DESC LIMIT 1))
    FROM accounts a WHERE a.id = (p_rule->>'account_id')::uuid
$$;

-- Arms or disarms the account's threshold rule: the only writer of accounts.topup_armed.
CREATE FUNCTION engine_topup_arm(p_account uuid, p_armed boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET topup_armed = p_armed
    WHERE id = p_account AND topup_armed IS DISTINCT FROM p_armed;
END;
$$;

-- Moves accounts.topup_unconsumed (engine_topup_unconsumed), its only writer outside
-- engine_record's movements: a firing adds its tokens, an expired request takes its own back, a
-- credit not the rule's own takes its amount, a new or re-armed rule takes all (`p_less` NULL).
CREATE FUNCTION engine_topup_consumption(p_account uuid, p_less bigint, p_more bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts
    SET topup_unconsumed = engine_topup_unconsumed(topup_unconsumed, p_less, p_more)
    WHERE id = p_account
      AND topup_unconsumed <> engine_topup_unconsumed(topup_unconsumed, p_less, p_more);
END;
$$;

-- A top-up request expiring at `p_expires_at` has expired at `p_at`.
CREATE FUNCTION engine_topup_request_expired(p_expires_at timestamptz, p_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at <= p_at
$$;

-- The account's live (not deleted, enabled) threshold rule: none or one. Two columns, not SETOF
-- topup_rules: a function typed by a table's rows keeps the table's migration from being
-- reverted (tests/api/grants.rs).
CREATE FUNCTION engine_topup_threshold_rule(p_account uuid)
RETURNS TABLE (id uuid, threshold_tokens bigint)
LANGUAGE sql STABLE AS $$
    SELECT r.id, r.threshold_tokens FROM topup_rules r
    WHERE r.account_id = p_account AND r.trigger = 'threshold' AND r.deleted_at IS NULL
      AND r.enabled
$$;

-- Brings the account's line, accounts.topup_threshold, up to date and answers it: the live
-- threshold rule's threshold less the tokens of its open request (so "available plus what is
-- requested" is compared with the threshold); 0 without such a rule, which also disarms. On the
-- account row because every spend reads it anyway. The caller holds the account's row lock.
CREATE FUNCTION engine_topup_line(p_account uuid) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    line bigint;
BEGIN
    SELECT GREATEST(r.threshold_tokens
                    - COALESCE((SELECT sum(f.tokens) FROM topup_firings f
                                WHERE f.rule_id = r.id AND f.state = 'open'), 0), 0)::bigint
    INTO line
    FROM engine_topup_threshold_rule(p_account) r;
    line := COALESCE(line, 0);
    UPDATE accounts SET topup_threshold = line
    WHERE id = p_account AND topup_threshold <> line;
    IF line = 0 THEN
        PERFORM engine_topup_arm(p_account, false);
    END IF;
    RETURN line;
END;
$$;

-- The threshold rule's decision after a movement (engine_record) or a rule change
-- (engine_topup_rule_changed): at or above the line it re-arms; below it, a due rule
-- (engine_topup_due) disarms and fires. The caller holds the account's row lock.
CREATE FUNCTION engine_topup_evaluate(p_account uuid, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    line bigint := engine_topup_line(p_account);
    account accounts;
    rule uuid;
BEGIN
    IF line = 0 THEN
        RETURN;
    END IF;
    SELECT * INTO account FROM accounts WHERE id = p_account;
    IF account.available >= line THEN
        PERFORM engine_topup_arm(p_account, true);
        RETURN;
    END IF;
    IF engine_topup_due(account.available, line, account.topup_armed,
                        account.topup_unconsumed) THEN
        PERFORM engine_topup_arm(p_account, false);
        SELECT r.id INTO rule FROM engine_topup_threshold_rule(p_account) r;
        -- A crossing while the rule's request is still open (it asked for too little) keeps
        -- the rule armed, so the next movement, still below, asks again.
        IF engine_topup_fire(rule, p_at, NULL, NULL) = 'skipped'
           AND EXISTS (SELECT 1 FROM topup_firings f WHERE f.rule_id = rule AND f.state = 'open') THEN
            PERFORM engine_topup_arm(p_account, true);
        ELSE
            -- A request just opened lowers the line: at or above the new line, re-arm at once
            -- (never left due for a later movement to skip past).
            line := engine_topup_line(p_account);
            IF line > 0 AND (SELECT a.available FROM accounts a WHERE a.id = p_account) >= line THEN
                PERFORM engine_topup_arm(p_account, true);
            END IF;
        END IF;
    END IF;
END;
$$;

-- One firing of a rule at `p_at` (it decides the day and month for the caps; a schedule rule's
-- firing also names its period). The amount: `tokens` (method fixed), or what brings `available`
-- up to `target_tokens` (held reservations not counted: they are spent or come back).
-- Answers the outcome, decided in this order:
--   skipped      nothing to add, or a request of the rule is still open (no second one);
--   cap_reached  the amount would pass max_tokens_per_day or max_tokens_per_month (the rule's
--                granted and requested tokens in that day or month, expired requests not
--                counted): nothing added; `topup.cap_reached` once per cap period (then skipped);
--   granted      (mode grant) a credit through engine_external, external_ref `topup:<firing_id>`,
--                its grant naming the rule, with the rule's priority and expiry; `topup.granted`;
--   requested    (mode request) an open request expiring after request_ttl; `topup.requested`;
--                the account's line counts it from now on.
-- A schedule's firing is recorded whatever the outcome (its period is done). The caller holds
-- the account's row lock.
CREATE FUNCTION engine_topup_fire(p_rule uuid, p_at timestamptz, p_period_start timestamptz,
    p_period_end timestamptz) RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    rule topup_rules;
    account accounts;
    open_tokens bigint;
    amount bigint;
    day_start timestamptz;
    month_start timestamptz;
    day_used bigint;
    month_used bigint;
    per text;
    cap_key text;
    cap_max bigint;
    firing uuid := gen_random_uuid();
    expires timestamptz;
    made record;
    fired text := 'skipped';
    at timestamptz := engine_now();
BEGIN
    SELECT * INTO rule FROM topup_rules WHERE id = p_rule;
    SELECT * INTO account FROM accounts WHERE id = rule.account_id;
    SELECT COALESCE(sum(f.tokens), 0)::bigint INTO open_tokens FROM topup_firings f
    WHERE f.rule_id = rule.id AND f.state = 'open';
    amount := CASE rule.method WHEN 'fixed' THEN rule.tokens
                  ELSE GREATEST(rule.target_tokens - account.available, 0) END;
    expires := CASE WHEN rule.expires_at_period_end THEN p_period_end
                    WHEN rule.expires_after_seconds IS NOT NULL
                        THEN at + make_interval(secs => rule.expires_after_seconds) END;
    IF open_tokens = 0 AND amount > 0 AND (expires IS NULL OR expires > at) THEN
        day_start := date_trunc('day', p_at AT TIME ZONE rule.time_zone) AT TIME ZONE rule.time_zone;
        month_start := date_trunc('month', p_at AT TIME ZONE rule.time_zone)
                       AT TIME ZONE rule.time_zone;
        SELECT COALESCE(sum(f.tokens) FILTER (WHERE f.created_at >= day_start), 0)::bigint,
               COALESCE(sum(f.tokens), 0)::bigint
        INTO day_used, month_used
        FROM topup_firings f
        WHERE f.rule_id = rule.id AND f.outcome IN ('granted', 'requested')
          AND f.state IS DISTINCT FROM 'expired'
          AND f.created_at >= LEAST(day_start, month_start);
        IF rule.max_tokens_per_day IS NOT NULL AND day_used + amount > rule.max_tokens_per_day THEN
            per := 'day';
            cap_key := 'day:' || to_char(p_at AT TIME ZONE rule.time_zone, 'YYYY-MM-DD');
            cap_max := rule.max_tokens_per_day;
        ELSIF rule.max_tokens_per_month IS NOT NULL
              AND month_used + amount > rule.max_tokens_per_month THEN
            per := 'month';
            cap_key := 'month:' || to_char(p_at AT TIME ZONE rule.time_zone, 'YYYY-MM');
            cap_max := rule.max_tokens_per_month;
        END IF;
        IF per IS NOT NULL THEN
            INSERT INTO topup_firings (id, rule_id, account_id, outcome, period_start, cap_period,
                tokens, created_at)
            VALUES (firing, rule.id, rule.account_id, 'cap_reached', p_period_start, cap_key,
                amount, p_at)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                fired := 'cap_reached';
                PERFORM engine_emit_event('topup.cap_reached', rule.account_id,
                    engine_event_account(account) || jsonb_build_object(
                        'rule', engine_topup_rule_json(to_jsonb(rule)),
                        'cap', jsonb_build_object('per', per, 'period', cap_key,
                            'max_tokens', cap_max,
                            'used_tokens', CASE per WHEN 'day' THEN day_used ELSE month_used END,
                            'tokens', amount)),
                    at);
            END IF;
        ELSIF rule.mode = 'grant' THEN
            INSERT INTO topup_firings (id, rule_id, account_id, outcome, period_start, tokens,
                credit_id, created_at)
            VALUES (firing, rule.id, rule.account_id, 'granted', p_period_start, amount, firing,
                p_at);
            SELECT * INTO made FROM engine_external('credit', rule.account_id, firing, amount,
                'topup:' || firing, 'automatic top-up', NULL, 'topup-rule:' || rule.id, NULL,
                rule.priority, expires, rule.amount_paid, rule.currency, rule.id, NULL, NULL);
            IF made.outcome <> 'created' THEN
                RAISE EXCEPTION 'engine_topup_fire: the top-up credit of rule % was %',
                    rule.id, made.outcome;
            END IF;
            fired := 'granted';
            IF rule.trigger = 'threshold' THEN
                PERFORM engine_topup_consumption(rule.account_id, 0, amount);
            END IF;
            -- Callers (a batch's engine_tallies row, the reaper, a rule's change) count the
            -- tally topup_credited in token_billing_tokens_total{movement="credited"}.
            PERFORM engine_tally_add('topup_credited', amount);
            PERFORM engine_emit_event('topup.granted', rule.account_id,
                (SELECT engine_event_account(a) FROM accounts a WHERE a.id = rule.account_id)
                || jsonb_build_object(
                    'rule', engine_topup_rule_json(to_jsonb(rule)),
                    'firing', (SELECT engine_topup_firing_json(to_jsonb(f)) FROM topup_firings f
                               WHERE f.id = firing),
                    'credit', made.object->'credit'),
                at);
        ELSE
            INSERT INTO topup_firings (id, rule_id, account_id, outcome, period_start, tokens,
                state, expires_at, created_at)
            VALUES (firing, rule.id, rule.account_id, 'requested', p_period_start, amount, 'open',
                p_at + make_interval(secs => rule.request_ttl_seconds), p_at);
            fired := 'requested';
            IF rule.trigger = 'threshold' THEN
                PERFORM engine_topup_consumption(rule.account_id, 0, amount);
            END IF;
            PERFORM engine_emit_event('topup.requested', rule.account_id,
                engine_event_account(account) || jsonb_build_object(
                    'rule', engine_topup_rule_json(to_jsonb(rule)),
                    'request', (SELECT engine_topup_firing_json(to_jsonb(f)) FROM topup_firings f
                                WHERE f.id = firing)),
                at);
            PERFORM engine_topup_line(rule.account_id);
        END IF;
    END IF;
    IF fired = 'skipped' AND p_period_start IS NOT NULL THEN
        INSERT INTO topup_firings (id, rule_id, account_id, outcome, period_start, tokens,
            created_at)
        VALUES (firing, rule.id, rule.account_id, 'skipped', p_period_start, 0, p_at);
    END IF;
    RETURN fired;
END;
$$;

-- Called by engine_external before a credit's entry is recorded: a credit whose external_ref
-- names one of the account's top-up requests fulfils it if open (the line stops counting it; an
-- expired one stays expired) and is the rule's either way. Answers the rule (NULL: no request).
CREATE FUNCTION engine_topup_answer(p_account uuid, p_external_ref text, p_credit uuid,
    p_at timestamptz) RETURNS uuid
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    request topup_firings;
BEGIN
    IF p_external_ref !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        RETURN NULL;
    END IF;
    SELECT * INTO request FROM topup_firings f
    WHERE f.id = p_external_ref::uuid AND f.account_id = p_account AND f.outcome = 'requested';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF request.state = 'open' THEN
        UPDATE topup_firings SET state = 'fulfilled', credit_id = p_credit, resolved_at = p_at
        WHERE id = request.id;
        PERFORM engine_topup_line(p_account);
    END IF;
    RETURN request.rule_id;
END;
$$;

-- After a rule was created, changed or deleted (the caller holds the account's row lock): brings
-- the line up to date and judges it. `p_rearm` (a new rule, one enabled again, a new threshold)
-- arms the rule and counts nothing it added before as unused, so an account below tops up now.
CREATE FUNCTION engine_topup_rule_changed(p_account uuid, p_rearm boolean) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    IF p_rearm THEN
        PERFORM engine_topup_arm(p_account, true);
        PERFORM engine_topup_consumption(p_account, NULL, 0);
    END IF;
    PERFORM engine_topup_evaluate(p_account, engine_now());
END;
$$;

-- Fires each schedule rule whose period at `p_now` (the service's clock) has not fired yet, at
-- most `p_limit`; the reaper calls it until fewer come back. Answers how many it looked at.
-- One firing row per rule and period (a unique key), whichever replica or restart gets there
-- first; after downtime only the current period fires. A rule that cannot fire (e.g. a time zone
-- the server's tzdata no longer knows) is logged (WARNING) and tried again in an hour, in its own
-- subtransaction: it never stops the others nor the reaper's later steps.
CREATE FUNCTION engine_topup_schedule(p_now timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidate record;
    rule topup_rules;
    period record;
    looked integer := 0;
BEGIN
    FOR candidate IN
        SELECT r.id, r.account_id FROM topup_rules r
        WHERE r.trigger = 'schedule' AND r.enabled AND r.deleted_at IS NULL
          AND (r.next_period_at IS NULL OR r.next_period_at <= p_now)
        ORDER BY r.account_id, r.id
        LIMIT p_limit
    LOOP
        looked := looked + 1;
        PERFORM 1 FROM accounts WHERE id = candidate.account_id FOR NO KEY UPDATE;
        -- Read again under the lock: another replica may have fired it.
        SELECT * INTO rule FROM topup_rules r
        WHERE r.id = candidate.id AND r.enabled AND r.deleted_at IS NULL;
        CONTINUE WHEN NOT FOUND;
        BEGIN
            SELECT * INTO period FROM engine_topup_period(rule.period, rule.anchor_day,
                rule.time_zone, p_now);
            IF NOT EXISTS (SELECT 1 FROM topup_firings f
                           WHERE f.rule_id = rule.id AND f.period_start = period.period_start) THEN
                PERFORM engine_topup_fire(rule.id, p_now, period.period_start, period.period_end);
            END IF;
            UPDATE topup_rules SET next_period_at = period.period_end WHERE id = rule.id;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'top-up rule % could not fire for its period: %', rule.id, SQLERRM;
            UPDATE topup_rules SET next_period_at = p_now + interval '1 hour' WHERE id = rule.id;
        END;
    END LOOP;
    RETURN looked;
END;
$$;

-- Expires the open requests past their expiry at `p_now` (at most `p_limit`; answers how many):
-- the line and the rule's unused tokens no longer count them, and a live rule is re-armed, so
-- the next movement below the line asks again, within the caps. `topup.request_expired` says
-- `next`: `ask_again` (the rule is live) or `none` (deleted or disabled).
CREATE FUNCTION engine_topup_expire_requests(p_now timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    candidate record;
    request topup_firings;
    line bigint;
    expired integer := 0;
BEGIN
    FOR candidate IN
        SELECT f.id, f.account_id FROM topup_firings f
        WHERE f.state = 'open' AND engine_topup_request_expired(f.expires_at, p_now)
        ORDER BY f.account_id, f.id
        LIMIT p_limit
    LOOP
        PERFORM 1 FROM accounts WHERE id = candidate.account_id FOR NO KEY UPDATE;
        UPDATE topup_firings SET state = 'expired', resolved_at = p_now
        WHERE id = candidate.id AND state = 'open'
        RETURNING * INTO request;
        CONTINUE WHEN NOT FOUND;
        expired := expired + 1;
        PERFORM engine_topup_consumption(candidate.account_id, request.tokens, 0);
        line := engine_topup_line(candidate.account_id);
        IF line > 0 THEN
            PERFORM engine_topup_arm(candidate.account_id, true);
        END IF;
        PERFORM engine_emit_event('topup.request_expired', a.id,
            engine_event_account(a) || jsonb_build_object(
                'rule', (SELECT engine_topup_rule_json(to_jsonb(r)) FROM topup_rules r
                         WHERE r.id = request.rule_id),
                'request', engine_topup_firing_json(to_jsonb(request)),
                'next', CASE WHEN line > 0 THEN 'ask_again' ELSE 'none' END),
            engine_now())
        FROM accounts a WHERE a.id = candidate.account_id;
    END LOOP;
    RETURN expired;
END;
$$;
