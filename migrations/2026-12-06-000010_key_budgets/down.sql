CREATE OR REPLACE FUNCTION public.events_rules(p_type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_type IN ('account.balance_low', 'account.balance_recovered',
            'account.balance_depleted', 'credit.created', 'adjustment.created',
            'reservation.expired', 'grant.expired', 'grant.expiring', 'topup.granted',
            'topup.requested', 'topup.request_expired', 'topup.cap_reached', 'job.succeeded',
            'job.failed', 'invariant.violated', 'endpoint.disabled')) THEN 'events_type_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('events', broken);
END;
$$;
ALTER TABLE public.reservations DROP COLUMN budget_key_id, DROP COLUMN budget_period_start;
ALTER TABLE public.api_keys DROP CONSTRAINT api_keys_budget,
    DROP COLUMN budget_tokens, DROP COLUMN budget_period, DROP COLUMN budget_time_zone,
    DROP COLUMN budget_low_percent, DROP COLUMN budget_spent, DROP COLUMN budget_period_start,
    DROP COLUMN budget_notified;
