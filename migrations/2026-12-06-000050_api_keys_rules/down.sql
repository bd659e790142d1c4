-- api_keys' five CHECK constraints, as they were before api_keys_rules.
ALTER TABLE public.api_keys
    DROP CONSTRAINT api_keys_rules,
    ADD CONSTRAINT api_keys_budget CHECK (
        (budget_tokens IS NULL) = (budget_period IS NULL)
        AND (budget_tokens IS NULL OR (scope = 'kiosk' AND budget_tokens BETWEEN 1 AND 1000000000
                                       AND budget_period IN ('day', 'week', 'month', 'total')))
        AND budget_low_percent BETWEEN 1 AND 100
        AND budget_spent >= 0
        AND (budget_notified IS NULL OR budget_notified IN ('low', 'exhausted'))),
    ADD CONSTRAINT api_keys_kiosk_bound_to_account CHECK ((scope = 'kiosk') = (account_id IS NOT NULL)),
    ADD CONSTRAINT api_keys_label_check CHECK (char_length(label) >= 1 AND char_length(label) <= 200),
    ADD CONSTRAINT api_keys_scope_check CHECK (scope IN ('admin', 'finance', 'kiosk')),
    ADD CONSTRAINT api_keys_secret_hash_check CHECK (octet_length(secret_hash) = 32);
DROP FUNCTION public.api_keys_rules(public.api_keys);
