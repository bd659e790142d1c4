-- The rule functions of the five tables a movement or a job writes
-- (accounts, reservations, ledger_entries, credit_grants, generation_jobs)
-- take the row itself, and each table's one CHECK passes it whole:
-- CHECK (public.accounts_rules(accounts)), where it passed each column the
-- rules read (row_rules, 2026-12-04-000001).
--
-- Why: PostgreSQL 15 reads a table's CHECK constraints from their stored
-- node text at every statement that writes the table (ExecRelCheck:
-- stringToNode). A column reference is about 130 characters of that text,
-- and a reserve or a commit writes four of these tables: 11 + 4 + 5 + 12
-- columns read back at every statement, about 5 % of the instructions of a
-- lone reserve → commit (BENCHMARKS.md, 2026-12-04, later). A whole-row
-- reference is one.
--
-- The rules are the same, written once, in the function of each table (the
-- old functions, of one argument per column, are dropped): the same
-- conditions in the same order, refused with SQLSTATE 23514
-- (check_violation) naming the rule, as before (tests/api/row_rules.rs
-- compares them with the constraints row_rules replaced). events keeps its
-- function of one column (one column reference costs no more than a row's).

CREATE FUNCTION public.accounts_rules(r public.accounts) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (LEAST(r.available, r.reserved, r.used, r.credited, r.active_reservations,
                        r.max_active_reservations, r.low_balance_threshold, r.grant_expired,
                        r.topup_threshold) >= 0) THEN 'accounts_counts_nonnegative'
        WHEN NOT (char_length(r.name) BETWEEN 1 AND 200) THEN 'accounts_name_check'
        WHEN NOT (r.status IN ('active', 'suspended')) THEN 'accounts_status_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('accounts', broken);
END;
$$;

CREATE FUNCTION public.reservations_rules(r public.reservations) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (r.amount > 0) THEN 'reservations_amount_check'
        WHEN NOT (r.committed_amount >= 0 AND r.committed_amount <= r.amount)
            THEN 'reservations_check'
        WHEN NOT (r.state = 'committed' OR r.committed_amount = 0)
            THEN 'reservations_only_commit_spends'
        WHEN NOT ((r.state = 'held') = (r.resolved_at IS NULL))
            THEN 'reservations_resolved_at_set'
        WHEN NOT (r.state IN ('held', 'committed', 'released', 'expired'))
            THEN 'reservations_state_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('reservations', broken);
END;
$$;

CREATE FUNCTION public.ledger_entries_rules(r public.ledger_entries) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT ((r.kind = 'adjustment' AND r.amount <> 0)
                  OR (r.kind <> 'adjustment' AND r.amount > 0)) THEN 'ledger_amount_sign'
        WHEN NOT (r.available_after >= 0) THEN 'ledger_entries_available_after_check'
        WHEN NOT (r.kind IN ('credit', 'adjustment', 'reserve', 'commit', 'release', 'expire',
                             'grant_expire')) THEN 'ledger_entries_kind_check'
        WHEN NOT (r.reserved_after >= 0) THEN 'ledger_entries_reserved_after_check'
        WHEN NOT (r.used_after >= 0) THEN 'ledger_entries_used_after_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('ledger_entries', broken);
END;
$$;

CREATE FUNCTION public.credit_grants_rules(r public.credit_grants) RETURNS boolean
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

CREATE FUNCTION public.generation_jobs_rules(r public.generation_jobs) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (r.attempts >= 0) THEN 'generation_jobs_attempts_check'
        WHEN NOT (r.cost > 0) THEN 'generation_jobs_cost_check'
        WHEN NOT ((r.status IN ('succeeded', 'failed')) = (r.finished_at IS NOT NULL))
            THEN 'generation_jobs_finished'
        WHEN NOT (char_length(r.kind) BETWEEN 1 AND 64) THEN 'generation_jobs_kind_check'
        WHEN NOT (octet_length(r.request_hash) = 32) THEN 'generation_jobs_request_hash_check'
        WHEN NOT (r.status <> 'running' OR r.lease_expires_at IS NOT NULL)
            THEN 'generation_jobs_running_leased'
        WHEN NOT (r.status IN ('queued', 'running', 'succeeded', 'failed'))
            THEN 'generation_jobs_status_check'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('generation_jobs', broken);
END;
$$;

ALTER TABLE accounts
    DROP CONSTRAINT accounts_rules,
    ADD CONSTRAINT accounts_rules CHECK (public.accounts_rules(accounts)) NOT VALID;
ALTER TABLE accounts VALIDATE CONSTRAINT accounts_rules;

ALTER TABLE reservations
    DROP CONSTRAINT reservations_rules,
    ADD CONSTRAINT reservations_rules CHECK (public.reservations_rules(reservations)) NOT VALID;
ALTER TABLE reservations VALIDATE CONSTRAINT reservations_rules;

ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_rules,
    ADD CONSTRAINT ledger_entries_rules
        CHECK (public.ledger_entries_rules(ledger_entries)) NOT VALID;
ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_rules;

ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_rules,
    ADD CONSTRAINT credit_grants_rules CHECK (public.credit_grants_rules(credit_grants)) NOT VALID;
ALTER TABLE credit_grants VALIDATE CONSTRAINT credit_grants_rules;

ALTER TABLE generation_jobs
    DROP CONSTRAINT generation_jobs_rules,
    ADD CONSTRAINT generation_jobs_rules
        CHECK (public.generation_jobs_rules(generation_jobs)) NOT VALID;
ALTER TABLE generation_jobs VALIDATE CONSTRAINT generation_jobs_rules;

-- The functions of one argument per column, no longer called.
DROP FUNCTION public.accounts_rules(text, text, bigint, bigint, bigint, bigint, integer, integer,
    bigint, bigint, bigint);
DROP FUNCTION public.reservations_rules(bigint, text, bigint, timestamptz);
DROP FUNCTION public.ledger_entries_rules(text, bigint, bigint, bigint, bigint);
DROP FUNCTION public.credit_grants_rules(text, bigint, bigint, bigint, bigint, bigint, bigint,
    bigint, smallint, boolean, timestamptz, timestamptz);
DROP FUNCTION public.generation_jobs_rules(bytea, text, bigint, text, integer, timestamptz,
    timestamptz);
