CREATE INDEX ledger_entries_grant_idx ON public.ledger_entries (grant_id) WHERE grant_id IS NOT NULL;
DROP INDEX public.ledger_entries_grant_order_idx;

CREATE OR REPLACE FUNCTION public.credit_grants_rules(r public.credit_grants) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (r.amount > 0) THEN 'credit_grants_amount_check'
        WHEN NOT (r.remaining + r.reserved + r.consumed + r.debited + r.expired = r.amount)
            THEN 'credit_grants_books'
        WHEN NOT (LEAST(r.remaining, r.reserved, r.consumed, r.debited, r.opening_reserved,
                        r.expired) >= 0) THEN 'credit_grants_counts_nonnegative'
        WHEN NOT (r.drawable = (r.remaining > 0)) THEN 'credit_grants_drawable'
        WHEN NOT (r.expired_at IS NULL OR r.expires_at IS NOT NULL)
            THEN 'credit_grants_lapse_after_expiry'
        WHEN NOT (r.priority BETWEEN 0 AND 100) THEN 'credit_grants_priority_check'
        WHEN NOT (r.source IN ('credit', 'adjustment', 'upgrade')) THEN 'credit_grants_source_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('credit_grants', broken);
END;
$$;

ALTER TABLE public.topup_rules DROP CONSTRAINT topup_rules_price,
    DROP COLUMN amount_paid, DROP COLUMN currency;
ALTER TABLE public.credit_grants DROP COLUMN amount_paid, DROP COLUMN currency;
