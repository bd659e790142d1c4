-- Rollover (docs/topups.md, "Rollover"): a schedule rule in mode grant
-- whose grants expire may carry, when one of its grants lapses holding
-- unused tokens, min(unused, rollover_max_tokens) forward into a new grant
-- lapsing rollover_expires_after_seconds after the lapse (NULL: never).
-- The lapse writes grant_expire for all it held; the carried part is a
-- credit (src/engine/sql/25_grants.sql, engine_lapse_grants).
ALTER TABLE public.topup_rules
    ADD COLUMN rollover_max_tokens bigint,
    ADD COLUMN rollover_expires_after_seconds bigint,
    ADD CONSTRAINT topup_rules_rollover CHECK (
        (rollover_max_tokens IS NOT NULL OR rollover_expires_after_seconds IS NULL)
        AND (rollover_max_tokens IS NULL
             OR (rollover_max_tokens BETWEEN 1 AND 1000000000 AND trigger = 'schedule'
                 AND mode = 'grant'
                 AND (expires_at_period_end OR expires_after_seconds IS NOT NULL)))
        AND (rollover_expires_after_seconds IS NULL
             OR rollover_expires_after_seconds BETWEEN 60 AND 315360000));

-- The carried grant names the grant it came from: at most one per lapsed
-- grant (this index, whichever replica writes the lapse), and it is never
-- carried again.
ALTER TABLE public.credit_grants ADD COLUMN rolled_over_from uuid;
CREATE UNIQUE INDEX credit_grants_rolled_over_from ON public.credit_grants
    (account_id, rolled_over_from) WHERE rolled_over_from IS NOT NULL;

-- The rollover's event.
CREATE OR REPLACE FUNCTION public.events_rules(p_type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_type IN ('account.balance_low', 'account.balance_recovered',
            'account.balance_depleted', 'credit.created', 'adjustment.created',
            'reservation.expired', 'grant.expired', 'grant.expiring', 'grant.rolled_over',
            'topup.granted', 'topup.requested', 'topup.request_expired', 'topup.cap_reached',
            'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled',
            'key.budget_low', 'key.budget_exhausted')) THEN 'events_type_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('events', broken);
END;
$$;
