-- api_keys' CHECK constraints become one row rule that takes the row
-- whole, as the five tables a movement writes did (row_rules_whole_row).
--
-- Why: since key budgets, a reserve with a budgeted key writes its key's
-- row (the budget's count), and PostgreSQL 15 reads a table's CHECK
-- constraints back from their stored node text at every statement that
-- writes the table (ExecRelCheck: stringToNode). api_keys had five, the
-- budget's alone over thirty column references: about 0.3 M of the 0.55 M
-- instructions a budget added to a lone reserve → commit
-- (bench/engine_instructions.sh, 2026-12-06).
--
-- The same conditions, in the order PostgreSQL checked them (by name),
-- refused with SQLSTATE 23514 (check_violation) naming the rule
-- (public.row_rule_broken), as before: tests/api/row_rules.rs compares
-- them with the constraints this migration's down.sql puts back.

CREATE FUNCTION public.api_keys_rules(r public.api_keys) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT ((r.budget_tokens IS NULL) = (r.budget_period IS NULL)
                  AND (r.budget_tokens IS NULL
                       OR (r.scope = 'kiosk' AND r.budget_tokens BETWEEN 1 AND 1000000000
                           AND r.budget_period IN ('day', 'week', 'month', 'total')))
                  AND r.budget_low_percent BETWEEN 1 AND 100
                  AND r.budget_spent >= 0
                  AND (r.budget_notified IS NULL OR r.budget_notified IN ('low', 'exhausted')))
            THEN 'api_keys_budget'
        WHEN NOT ((r.scope = 'kiosk') = (r.account_id IS NOT NULL))
            THEN 'api_keys_kiosk_bound_to_account'
        WHEN NOT (char_length(r.label) >= 1 AND char_length(r.label) <= 200)
            THEN 'api_keys_label_check'
        WHEN NOT (r.scope IN ('admin', 'finance', 'kiosk')) THEN 'api_keys_scope_check'
        WHEN NOT (octet_length(r.secret_hash) = 32) THEN 'api_keys_secret_hash_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('api_keys', broken);
END;
$$;

ALTER TABLE public.api_keys
    DROP CONSTRAINT api_keys_budget,
    DROP CONSTRAINT api_keys_kiosk_bound_to_account,
    DROP CONSTRAINT api_keys_label_check,
    DROP CONSTRAINT api_keys_scope_check,
    DROP CONSTRAINT api_keys_secret_hash_check,
    ADD CONSTRAINT api_keys_rules CHECK (public.api_keys_rules(api_keys)) NOT VALID;
ALTER TABLE public.api_keys VALIDATE CONSTRAINT api_keys_rules;
