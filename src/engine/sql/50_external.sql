-- Tokens from outside: credits (top-ups) and signed adjustments, one rule
-- for both. Each is idempotent on its external_ref, which is unique across
-- all accounts (credits and adjustments each). For `p_kind` credit or
-- adjustment, in this order:
--   not_found {what: account}      no such account;
--   replayed / idempotency_key_reused
--                                  the external_ref was used before: the same
--                                  account, amount and note (credit) or
--                                  reason (adjustment) is a replay, anything
--                                  else (another account's included) a reuse;
--   insufficient_tokens {available, reserved}
--                                  an adjustment would drive available
--                                  below zero;
--   created                        the credit or adjustment row, its ledger
--                                  entry (engine_record) and its audit event
--                                  (credit.created / adjustment.created;
--                                  `p_request_id` is the HTTP request's id).
-- The object is {credit|adjustment, entry}.
CREATE FUNCTION engine_external(
    p_kind text, p_account uuid, p_id uuid, p_amount bigint, p_external_ref text, p_note text,
    p_reason text, p_actor text, p_request_id text,
    OUT outcome text, OUT detail jsonb, OUT object jsonb
)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    account accounts;
    earlier record;
    made jsonb;
    entry ledger_entries;
BEGIN
    SELECT * INTO account FROM accounts WHERE id = p_account FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found'; detail := '{"what": "account"}';
        RETURN;
    END IF;
    FOR attempt IN 1 .. 2 LOOP
        IF p_kind = 'credit' THEN
            SELECT c.account_id, c.amount, c.note AS said, to_jsonb(c) AS row INTO earlier
            FROM credits c WHERE c.external_ref = p_external_ref;
        ELSE
            SELECT a.account_id, a.amount, a.reason AS said, to_jsonb(a) AS row INTO earlier
            FROM adjustments a WHERE a.external_ref = p_external_ref;
        END IF;
        IF FOUND THEN
            IF earlier.account_id = p_account AND earlier.amount = p_amount
               AND earlier.said IS NOT DISTINCT FROM
                   (CASE p_kind WHEN 'credit' THEN p_note ELSE p_reason END) THEN
                SELECT * INTO entry FROM ledger_entries
                WHERE external_ref = p_external_ref AND kind = p_kind;
                outcome := 'replayed';
                object := jsonb_build_object(p_kind, earlier.row, 'entry', to_jsonb(entry));
            ELSE
                outcome := 'idempotency_key_reused';
            END IF;
            RETURN;
        END IF;
        IF account.available + p_amount < 0 THEN
            outcome := 'insufficient_tokens';
            detail := jsonb_build_object('available', account.available, 'reserved', account.reserved);
            RETURN;
        END IF;
        -- Another account's transaction may take the same external_ref
        -- meanwhile (our lock covers only this account): then it is read
        -- back and compared, as above.
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
    SELECT * INTO entry FROM engine_record(ARRAY[ROW(p_account, p_kind, p_amount, 0, NULL, NULL,
        p_external_ref, CASE p_kind WHEN 'adjustment' THEN p_reason END, p_actor,
        clock_timestamp())::engine_movement]);
    INSERT INTO audit_events (actor, action, target, before, after, request_id)
    VALUES (p_actor, p_kind || '.created', 'account:' || p_account, NULL,
        jsonb_build_object(p_kind || '_id', p_id, 'amount', p_amount, 'external_ref', p_external_ref)
            || CASE p_kind WHEN 'credit' THEN jsonb_build_object('note', p_note)
                           ELSE jsonb_build_object('reason', p_reason) END
            || jsonb_build_object('available', entry.available_after,
                   'reserved', entry.reserved_after, 'used', entry.used_after),
        p_request_id);
    outcome := 'created';
    object := jsonb_build_object(p_kind, made, 'entry', to_jsonb(entry));
END;
$$;
