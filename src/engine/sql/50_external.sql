-- The booking (credit or adjustment, on any account) that holds `p_external_ref`, of kind `p_kind`
-- first (a reference booked as both before the namespace was one, which the migration
-- external_ref_namespace reports, replays as its own kind); no row when it is free. Ask under
-- the reference's lock (engine_external).
CREATE FUNCTION engine_external_booking(p_external_ref text, p_kind text)
RETURNS TABLE (kind text, id uuid, account_id uuid, amount bigint, said text, booking jsonb)
LANGUAGE sql STABLE AS $$
    SELECT x.kind, x.id, x.account_id, x.amount, x.said, x.booking
    FROM (SELECT 'credit' AS kind, c.id, c.account_id, c.amount, c.note AS said,
                 to_jsonb(c) AS booking
          FROM credits c WHERE c.external_ref = p_external_ref
          UNION ALL
          SELECT 'adjustment', a.id, a.account_id, a.amount, a.reason, to_jsonb(a)
          FROM adjustments a WHERE a.external_ref = p_external_ref) x
    ORDER BY x.kind = p_kind DESC
    LIMIT 1
$$;

-- Tokens from outside: a credit (top-up) or a signed adjustment, by `p_kind`, idempotent on its
-- external_ref, one namespace across all accounts and both kinds. Outcomes, in this order:
--   not_found {what: account}   no such account;
--   replayed                    the reference was booked before with the same kind, account,
--                               amount, note (credit) or reason (adjustment), and the same grant
--                               priority, expiry and price;
--   idempotency_key_reused {existing: {kind, id, account_id, entry_id}}
--                               booked before with anything else (the other kind or another
--                               account included): names that booking and its last entry;
--   expiry_passed {expires_at}  `p_expires_at` is not in the future;
--   insufficient_tokens {available, reserved}
--                               an adjustment would drive available below zero;
--   created                     the row, its ledger entries (engine_record) and audit event
--                               (credit.created / adjustment.created; `p_request_id` is the HTTP
--                               request's id). A positive amount makes a grant (same id, named by
--                               its entry) of `p_priority`, lapsing at `p_expires_at` (NULL:
--                               never). A negative one is a spending decision: grants lapsed by
--                               now leave first, then it draws from the grants in draw order, as
--                               a reservation does, one entry per grant.
-- The object is the booking as the API shows it (engine_external_json), with the balances of its
-- last entry (the account's after the movement; a replay answers the same) and the grant made.
-- `p_priority` is set exactly for a positive amount; `p_expires_at` and the price (`p_amount_paid`
-- in minor units of `p_currency`, both or neither; NULL: unpriced) only for one. `p_topup_rule`:
-- the rule of a top-up the engine makes itself (NULL for the API's credits); the grant, and so
-- its entry (engine_entry_json), carries it, or else the rule of the top-up request the credit
-- answers (engine_topup_answer). `p_rolled_over_from`: the lapsed grant a rollover's credit
-- carries (engine_lapse_grants).
CREATE FUNCTION engine_external(
    p_kind text, p_account uuid, p_id uuid, p_amount bigint, p_external_ref text, p_note text,
    p_reason text, p_actor text, p_request_id text, p_priority integer, p_expires_at timestamptz,
    p_amount_paid bigint, p_currency text, p_topup_rule uuid, p_api_key uuid,
    p_rolled_over_from uuid,
    OUT outcome text, OUT detail jsonb, OUT object jsonb
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    account accounts;
    earlier record;
    made jsonb;
    entry ledger_entries;
    written integer;
    made_grant credit_grants;
    at timestamptz;
    rule uuid := p_topup_rule;
BEGIN
    IF (p_priority IS NOT NULL) <> (p_amount > 0)
       OR ((p_expires_at IS NOT NULL OR p_amount_paid IS NOT NULL) AND p_amount <= 0) THEN
        RAISE EXCEPTION 'engine_external: a priority is given exactly with a positive amount, an expiry and a price only with one'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO account FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    at := engine_now();
    IF p_amount < 0 THEN
        IF (engine_lapse_grants(ARRAY[p_account], at)).tokens > 0 THEN
            SELECT * INTO account FROM accounts WHERE id = p_account;
        END IF;
    END IF;
    -- The reference's own lock (transaction-scoped, on its hash), after the account's row lock
    -- as every caller does: requests naming one external_ref, of either kind and on any
    -- accounts, are decided in turn; different references never wait (save a hash collision).
    PERFORM pg_advisory_xact_lock(hashtextextended('token_billing.external_ref:' || p_external_ref, 0));
    FOR attempt IN 1 .. 2 LOOP
        SELECT * INTO earlier FROM engine_external_booking(p_external_ref, p_kind);
        IF FOUND THEN
            SELECT * INTO made_grant FROM credit_grants g WHERE g.id = earlier.id;
            -- Its last entry: a negative adjustment wrote one per grant.
            SELECT * INTO entry FROM ledger_entries
            WHERE external_ref = p_external_ref AND kind = earlier.kind
            ORDER BY id DESC LIMIT 1;
            IF earlier.kind = p_kind AND earlier.account_id = p_account AND earlier.amount = p_amount
               AND earlier.said IS NOT DISTINCT FROM
                   (CASE p_kind WHEN 'credit' THEN p_note ELSE p_reason END)
               AND made_grant.priority IS NOT DISTINCT FROM p_priority
               AND made_grant.expires_at IS NOT DISTINCT FROM p_expires_at
               AND made_grant.amount_paid IS NOT DISTINCT FROM p_amount_paid
               AND made_grant.currency IS NOT DISTINCT FROM p_currency THEN
                outcome := 'replayed';
                object := engine_external_json(p_kind, earlier.booking, to_jsonb(entry),
                    CASE WHEN made_grant.id IS NOT NULL THEN to_jsonb(made_grant) END);
            ELSE
                outcome := 'idempotency_key_reused';
                detail := jsonb_build_object('existing', jsonb_build_object(
                    'kind', earlier.kind, 'id', earlier.id, 'account_id', earlier.account_id,
                    'entry_id', entry.id));
            END IF;
            RETURN;
        END IF;
        -- After the replay check: a retry of a credit that landed replays even past its expiry.
        IF engine_grant_lapsed(p_expires_at, at) THEN
            outcome := 'expiry_passed';
            detail := jsonb_build_object('expires_at', p_expires_at);
            RETURN;
        END IF;
        IF p_amount < 0 AND engine_spend_refusal('active', account.available, -p_amount, 0, 0)
                            = 'insufficient_tokens' THEN
            outcome := 'insufficient_tokens';
            detail := jsonb_build_object('available', account.available, 'reserved', account.reserved);
            RETURN;
        END IF;
        -- A booking made meanwhile all the same (ON CONFLICT) is read back on the second pass.
        IF p_kind = 'credit' THEN
            INSERT INTO credits (id, account_id, amount, external_ref, note, actor)
            VALUES (p_id, p_account, p_amount, p_external_ref, p_note, p_actor)
            ON CONFLICT (external_ref) DO NOTHING
            RETURNING to_jsonb(credits) INTO made;
        ELSE
            INSERT INTO adjustments (id, account_id, amount, reason, external_ref, actor)
            VALUES (p_id, p_account, p_amount, p_reason, p_external_ref, p_actor)
            ON CONFLICT (external_ref) DO NOTHING
            RETURNING to_jsonb(adjustments) INTO made;
        END IF;
        EXIT WHEN made IS NOT NULL;
    END LOOP;
    IF made IS NULL THEN
        RAISE EXCEPTION 'engine_external: external_ref % neither found nor inserted', p_external_ref;
    END IF;
    IF p_kind = 'credit' AND rule IS NULL THEN
        -- Before the entry is recorded, so engine_record judges the line without the request.
        rule := engine_topup_answer(p_account, p_external_ref, p_id, at);
    END IF;
    IF p_kind = 'credit' AND p_rolled_over_from IS NULL
       AND NOT EXISTS (SELECT 1 FROM topup_rules r WHERE r.id = rule AND r.trigger = 'threshold') THEN
        -- A credit not the threshold rule's own (the API's, a schedule's) was paid for elsewhere:
        -- it counts as used against what the rule added. A rollover's carries tokens already there.
        PERFORM engine_topup_consumption(p_account, p_amount, 0);
    END IF;
    IF p_amount > 0 THEN
        INSERT INTO credit_grants (id, account_id, source, amount, remaining, priority, external_ref,
            created_at, expires_at, drawable, topup_rule_id, amount_paid, currency,
            rolled_over_from)
        VALUES (p_id, p_account, p_kind, p_amount, p_amount, p_priority, p_external_ref, at,
            p_expires_at, true, rule, p_amount_paid, p_currency, p_rolled_over_from)
        RETURNING * INTO made_grant;
        written := engine_record(ARRAY[ROW(p_account, p_kind, p_amount, 0, NULL, NULL,
            p_external_ref, CASE p_kind WHEN 'adjustment' THEN p_reason END, p_actor, at,
            p_id, p_api_key)::engine_movement]);
    ELSE
        written := engine_record(ARRAY(
            SELECT ROW(p_account, p_kind, -d.amount, 0, NULL, NULL, p_external_ref, p_reason,
                       p_actor, at, d.grant_id, p_api_key)::engine_movement
            -- The intervals as a column, not as engine_draws' argument: a call whose argument
            -- holds a sub-select is not inlined.
            FROM (SELECT ARRAY(SELECT g::engine_pool FROM engine_grant_pools(p_account) g)
                      AS pools) p
            CROSS JOIN LATERAL engine_draws(p.pools, p_account, 0, -p_amount) d
            ORDER BY d.lo));
    END IF;
    -- Its last entry (a removal writes one per grant): the account's latest, under its lock.
    SELECT * INTO entry FROM ledger_entries WHERE account_id = p_account ORDER BY id DESC LIMIT 1;
    INSERT INTO audit_events (actor, action, target, before, after, request_id)
    VALUES (p_actor, p_kind || '.created', 'account:' || p_account, NULL,
        jsonb_build_object(p_kind || '_id', p_id, 'amount', p_amount, 'external_ref', p_external_ref)
            || CASE p_kind WHEN 'credit' THEN jsonb_build_object('note', p_note)
                           ELSE jsonb_build_object('reason', p_reason) END
            || jsonb_build_object('available', entry.available_after,
                   'reserved', entry.reserved_after, 'used', entry.used_after),
        p_request_id);
    outcome := 'created';
    object := engine_external_json(p_kind, made, to_jsonb(entry),
        CASE WHEN made_grant.id IS NOT NULL THEN to_jsonb(made_grant) END);
END;
$$;
