-- Priced grants (docs/finance.md, "Money"): a grant may carry what was paid
-- for it, `amount_paid` in minor units of `currency` (ISO 4217: three
-- capital letters), both or neither. NULL: unpriced — the revenue report
-- shows its tokens as unpriced and never guesses a value; 0: promotional.
-- A price is written with its grant and never changed. Every existing grant
-- stays unpriced.
--
-- A top-up rule of method `fixed` may carry the price of each grant it
-- makes (its `tokens` for `amount_paid`).
--
-- The grant's rule lives in its row rule function (one CHECK per table, as
-- row_rules made them), under the name credit_grants_price, between the
-- rules before and after it by name.
ALTER TABLE public.credit_grants
    ADD COLUMN amount_paid bigint,
    ADD COLUMN currency text;

ALTER TABLE public.topup_rules
    ADD COLUMN amount_paid bigint,
    ADD COLUMN currency text,
    ADD CONSTRAINT topup_rules_price CHECK (
        (amount_paid IS NULL) = (currency IS NULL)
        AND (amount_paid IS NULL OR (amount_paid >= 0 AND currency ~ '^[A-Z]{3}$'
                                     AND method = 'fixed' AND mode = 'grant')));

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
        WHEN NOT ((r.amount_paid IS NULL) = (r.currency IS NULL)
                  AND (r.amount_paid IS NULL
                       OR (r.amount_paid >= 0 AND r.currency ~ '^[A-Z]{3}$')))
            THEN 'credit_grants_price'
        WHEN NOT (r.priority BETWEEN 0 AND 100) THEN 'credit_grants_priority_check'
        WHEN NOT (r.source IN ('credit', 'adjustment', 'upgrade')) THEN 'credit_grants_source_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('credit_grants', broken);
END;
$$;

-- The revenue report values the entries that take a priced grant's tokens
-- for good (commit, grant_expire, a removal) in the grant's entry order.
CREATE INDEX ledger_entries_grant_order_idx ON public.ledger_entries (grant_id, id)
    WHERE grant_id IS NOT NULL;
DROP INDEX public.ledger_entries_grant_idx;
