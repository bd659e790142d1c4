-- The rule functions of one argument per column, as row_rules made them,
-- and each table's CHECK passing the columns.

CREATE FUNCTION public.accounts_rules(p_name text, p_status text, p_available bigint,
    p_reserved bigint, p_used bigint, p_credited bigint, p_active_reservations integer,
    p_max_active_reservations integer, p_low_balance_threshold bigint, p_grant_expired bigint,
    p_topup_threshold bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (LEAST(p_available, p_reserved, p_used, p_credited, p_active_reservations,
                        p_max_active_reservations, p_low_balance_threshold, p_grant_expired,
                        p_topup_threshold) >= 0) THEN 'accounts_counts_nonnegative'
        WHEN NOT (char_length(p_name) BETWEEN 1 AND 200) THEN 'accounts_name_check'
        WHEN NOT (p_status IN ('active', 'suspended')) THEN 'accounts_status_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('accounts', broken);
END;
$$;

CREATE FUNCTION public.reservations_rules(p_amount bigint, p_state text,
    p_committed_amount bigint, p_resolved_at timestamptz) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_amount > 0) THEN 'reservations_amount_check'
        WHEN NOT (p_committed_amount >= 0 AND p_committed_amount <= p_amount)
            THEN 'reservations_check'
        WHEN NOT (p_state = 'committed' OR p_committed_amount = 0)
            THEN 'reservations_only_commit_spends'
        WHEN NOT ((p_state = 'held') = (p_resolved_at IS NULL))
            THEN 'reservations_resolved_at_set'
        WHEN NOT (p_state IN ('held', 'committed', 'released', 'expired'))
            THEN 'reservations_state_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('reservations', broken);
END;
$$;

CREATE FUNCTION public.ledger_entries_rules(p_kind text, p_amount bigint,
    p_available_after bigint, p_reserved_after bigint, p_used_after bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT ((p_kind = 'adjustment' AND p_amount <> 0)
                  OR (p_kind <> 'adjustment' AND p_amount > 0)) THEN 'ledger_amount_sign'
        WHEN NOT (p_available_after >= 0) THEN 'ledger_entries_available_after_check'
        WHEN NOT (p_kind IN ('credit', 'adjustment', 'reserve', 'commit', 'release', 'expire',
                             'grant_expire')) THEN 'ledger_entries_kind_check'
        WHEN NOT (p_reserved_after >= 0) THEN 'ledger_entries_reserved_after_check'
        WHEN NOT (p_used_after >= 0) THEN 'ledger_entries_used_after_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('ledger_entries', broken);
END;
$$;

CREATE FUNCTION public.credit_grants_rules(p_source text, p_amount bigint, p_remaining bigint,
    p_reserved bigint, p_consumed bigint, p_debited bigint, p_expired bigint,
    p_opening_reserved bigint, p_priority smallint, p_drawable boolean,
    p_expires_at timestamptz, p_expired_at timestamptz) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_amount > 0) THEN 'credit_grants_amount_check'
        WHEN NOT (p_remaining + p_reserved + p_consumed + p_debited + p_expired = p_amount)
            THEN 'credit_grants_books'
        WHEN NOT (LEAST(p_remaining, p_reserved, p_consumed, p_debited, p_opening_reserved,
                        p_expired) >= 0) THEN 'credit_grants_counts_nonnegative'
        WHEN NOT (p_drawable = (p_remaining > 0)) THEN 'credit_grants_drawable'
        WHEN NOT (p_expired_at IS NULL OR p_expires_at IS NOT NULL)
            THEN 'credit_grants_lapse_after_expiry'
        WHEN NOT (p_priority BETWEEN 0 AND 100) THEN 'credit_grants_priority_check'
        WHEN NOT (p_source IN ('credit', 'adjustment', 'upgrade')) THEN 'credit_grants_source_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('credit_grants', broken);
END;
$$;

CREATE FUNCTION public.generation_jobs_rules(p_request_hash bytea, p_kind text, p_cost bigint,
    p_status text, p_attempts integer, p_finished_at timestamptz,
    p_lease_expires_at timestamptz) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (p_attempts >= 0) THEN 'generation_jobs_attempts_check'
        WHEN NOT (p_cost > 0) THEN 'generation_jobs_cost_check'
        WHEN NOT ((p_status IN ('succeeded', 'failed')) = (p_finished_at IS NOT NULL))
            THEN 'generation_jobs_finished'
        WHEN NOT (char_length(p_kind) BETWEEN 1 AND 64) THEN 'generation_jobs_kind_check'
        WHEN NOT (octet_length(p_request_hash) = 32) THEN 'generation_jobs_request_hash_check'
        WHEN NOT (p_status <> 'running' OR p_lease_expires_at IS NOT NULL)
            THEN 'generation_jobs_running_leased'
        WHEN NOT (p_status IN ('queued', 'running', 'succeeded', 'failed'))
            THEN 'generation_jobs_status_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('generation_jobs', broken);
END;
$$;

ALTER TABLE accounts
    DROP CONSTRAINT accounts_rules,
    ADD CONSTRAINT accounts_rules CHECK (public.accounts_rules(name, status, available, reserved,
        used, credited, active_reservations, max_active_reservations, low_balance_threshold,
        grant_expired, topup_threshold)) NOT VALID;
ALTER TABLE accounts VALIDATE CONSTRAINT accounts_rules;

ALTER TABLE reservations
    DROP CONSTRAINT reservations_rules,
    ADD CONSTRAINT reservations_rules CHECK (public.reservations_rules(amount, state,
        committed_amount, resolved_at)) NOT VALID;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_rules;

ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_rules,
    ADD CONSTRAINT ledger_entries_rules CHECK (public.ledger_entries_rules(kind, amount,
        available_after, reserved_after, used_after)) NOT VALID;
ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_rules;

ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_rules,
    ADD CONSTRAINT credit_grants_rules CHECK (public.credit_grants_rules(source, amount,
        remaining, reserved, consumed, debited, expired, opening_reserved, priority, drawable,
        expires_at, expired_at)) NOT VALID;
ALTER TABLE credit_grants VALIDATE CONSTRAINT credit_grants_rules;

ALTER TABLE generation_jobs
    DROP CONSTRAINT generation_jobs_rules,
    ADD CONSTRAINT generation_jobs_rules CHECK (public.generation_jobs_rules(request_hash, kind,
        cost, status, attempts, finished_at, lease_expires_at)) NOT VALID;
ALTER TABLE generation_jobs VALIDATE CONSTRAINT generation_jobs_rules;

DROP FUNCTION public.accounts_rules(public.accounts);
DROP FUNCTION public.reservations_rules(public.reservations);
DROP FUNCTION public.ledger_entries_rules(public.ledger_entries);
DROP FUNCTION public.credit_grants_rules(public.credit_grants);
DROP FUNCTION public.generation_jobs_rules(public.generation_jobs);
