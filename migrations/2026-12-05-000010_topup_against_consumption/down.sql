-- The account's row rules as 2026-12-05-000001 made them, then the column.
CREATE OR REPLACE FUNCTION public.accounts_rules(r public.accounts) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (LEAST(r.available, r.reserved, r.used, r.credited, r.active_reservations,
                        r.max_active_reservations, r.low_balance_threshold, r.grant_expired,
                        r.topup_threshold) >= 0) THEN 'accounts_counts_nonnegative'
        WHEN NOT (char_length(r.name) BETWEEN 1 AND 200) THEN 'accounts_name_check'
        WHEN NOT (r.status IN ('active', 'suspended')) THEN 'accounts_status_check'
        WHEN NOT (r.credited + r.adjusted - r.grant_expired = r.available + r.reserved + r.used)
            THEN 'accounts_books_identity'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('accounts', broken);
END;
$$;

ALTER TABLE public.accounts DROP COLUMN topup_unconsumed;
