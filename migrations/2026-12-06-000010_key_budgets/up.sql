-- Key budgets (docs/api.md, "Key budgets"): a kiosk key may carry a
-- spending limit, `budget_tokens` per `budget_period` (day, week — from
-- Monday —, month, or total: never resets) in `budget_time_zone`. What
-- counts is what the key's reservations hold or used in the period: a
-- reserve adds its amount, a release, an expiry or the rest of a partial
-- commit gives the unspent part back. The engine decides the refusal
-- (key_budget_exhausted) in the transaction and the path of the balance
-- check, under the account's row lock (a kiosk key spends on its account
-- only), and writes the count in its one write path.
ALTER TABLE public.api_keys
    ADD COLUMN budget_tokens bigint,
    ADD COLUMN budget_period text,
    ADD COLUMN budget_time_zone text NOT NULL DEFAULT 'UTC',
    -- key.budget_low is sent once a period when this percentage is used.
    ADD COLUMN budget_low_percent smallint NOT NULL DEFAULT 80,
    -- The tokens the period starting at budget_period_start holds or used
    -- (a count of another period is 0 for this one).
    ADD COLUMN budget_spent bigint NOT NULL DEFAULT 0,
    ADD COLUMN budget_period_start timestamptz,
    -- The budget events sent in that period: low, then exhausted.
    ADD COLUMN budget_notified text,
    ADD CONSTRAINT api_keys_budget CHECK (
        (budget_tokens IS NULL) = (budget_period IS NULL)
        AND (budget_tokens IS NULL OR (scope = 'kiosk' AND budget_tokens BETWEEN 1 AND 1000000000
                                       AND budget_period IN ('day', 'week', 'month', 'total')))
        AND budget_low_percent BETWEEN 1 AND 100
        AND budget_spent >= 0
        AND (budget_notified IS NULL OR budget_notified IN ('low', 'exhausted')));

-- A reservation made against a key's budget: the key and the period it
-- counts in (NULL: none), so that what it gives back goes to that count,
-- and only while the key still counts that period.
ALTER TABLE public.reservations
    ADD COLUMN budget_key_id uuid,
    ADD COLUMN budget_period_start timestamptz;

-- The budget events.
CREATE OR REPLACE FUNCTION public.events_rules(p_type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_type IN ('account.balance_low', 'account.balance_recovered',
            'account.balance_depleted', 'credit.created', 'adjustment.created',
            'reservation.expired', 'grant.expired', 'grant.expiring', 'topup.granted',
            'topup.requested', 'topup.request_expired', 'topup.cap_reached', 'job.succeeded',
            'job.failed', 'invariant.violated', 'endpoint.disabled', 'key.budget_low',
            'key.budget_exhausted')) THEN 'events_type_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('events', broken);
END;
$$;
