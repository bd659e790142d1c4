-- A threshold top-up rule fires only against consumption (docs/topups.md):
-- accounts.topup_unconsumed holds the tokens the account's threshold rule
-- added (granted, or requested and not expired) that nothing has used
-- since. Every commit lowers it by the tokens it uses, and a credit that
-- is not the rule's own by its amount (never below 0); a new or re-armed
-- rule sets it to 0; the rule fires only while it is 0
-- (src/engine/sql/10_record.sql: engine_topup_unconsumed,
-- engine_topup_due). A release, an expiry or a lapse uses nothing, so it
-- never lets the rule fire again.
--
-- Existing accounts start at 0: what their rules added before this
-- migration is not counted against them.
ALTER TABLE public.accounts ADD COLUMN topup_unconsumed bigint NOT NULL DEFAULT 0;

COMMENT ON COLUMN public.accounts.topup_unconsumed IS
    'Tokens the threshold top-up rule added that nothing has used since; the rule fires only at 0.';

-- The account's row rules: the counts, the new one included, are never
-- negative (as 2026-12-05-000001 made them otherwise).
CREATE OR REPLACE FUNCTION public.accounts_rules(r public.accounts) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (LEAST(r.available, r.reserved, r.used, r.credited, r.active_reservations,
                        r.max_active_reservations, r.low_balance_threshold, r.grant_expired,
                        r.topup_threshold, r.topup_unconsumed) >= 0)
            THEN 'accounts_counts_nonnegative'
        WHEN NOT (char_length(r.name) BETWEEN 1 AND 200) THEN 'accounts_name_check'
        WHEN NOT (r.status IN ('active', 'suspended')) THEN 'accounts_status_check'
        WHEN NOT (r.credited + r.adjusted - r.grant_expired = r.available + r.reserved + r.used)
            THEN 'accounts_books_identity'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('accounts', broken);
END;
$$;
