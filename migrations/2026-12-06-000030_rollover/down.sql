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
DROP INDEX public.credit_grants_rolled_over_from;
ALTER TABLE public.credit_grants DROP COLUMN rolled_over_from;
ALTER TABLE public.topup_rules DROP CONSTRAINT topup_rules_rollover,
    DROP COLUMN rollover_max_tokens, DROP COLUMN rollover_expires_after_seconds;
