-- Each table's constraints as they were before row_rules (the same rules,
-- each a CHECK of its own, under the same names).
ALTER TABLE events
    DROP CONSTRAINT events_rules,
    ADD CONSTRAINT events_type_check CHECK (type IN (
        'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
        'credit.created', 'adjustment.created', 'reservation.expired', 'grant.expired',
        'grant.expiring', 'topup.granted', 'topup.requested', 'topup.request_expired',
        'topup.cap_reached', 'job.succeeded', 'job.failed', 'invariant.violated',
        'endpoint.disabled'));

ALTER TABLE generation_jobs
    DROP CONSTRAINT generation_jobs_rules,
    ADD CONSTRAINT generation_jobs_request_hash_check CHECK (octet_length(request_hash) = 32),
    ADD CONSTRAINT generation_jobs_kind_check CHECK (char_length(kind) BETWEEN 1 AND 64),
    ADD CONSTRAINT generation_jobs_cost_check CHECK (cost > 0),
    ADD CONSTRAINT generation_jobs_status_check
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    ADD CONSTRAINT generation_jobs_attempts_check CHECK (attempts >= 0),
    ADD CONSTRAINT generation_jobs_finished
        CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    ADD CONSTRAINT generation_jobs_running_leased
        CHECK (status <> 'running' OR lease_expires_at IS NOT NULL);

ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_rules,
    ADD CONSTRAINT credit_grants_source_check CHECK (source IN ('credit', 'adjustment', 'upgrade')),
    ADD CONSTRAINT credit_grants_amount_check CHECK (amount > 0),
    ADD CONSTRAINT credit_grants_counts_nonnegative CHECK (
        LEAST(remaining, reserved, consumed, debited, opening_reserved, expired) >= 0),
    ADD CONSTRAINT credit_grants_books
        CHECK (remaining + reserved + consumed + debited + expired = amount),
    ADD CONSTRAINT credit_grants_drawable CHECK (drawable = (remaining > 0)),
    ADD CONSTRAINT credit_grants_priority_check CHECK (priority BETWEEN 0 AND 100),
    ADD CONSTRAINT credit_grants_lapse_after_expiry
        CHECK (expired_at IS NULL OR expires_at IS NOT NULL);

ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_rules,
    ADD CONSTRAINT ledger_entries_kind_check CHECK (kind IN ('credit', 'adjustment', 'reserve',
        'commit', 'release', 'expire', 'grant_expire')),
    ADD CONSTRAINT ledger_amount_sign CHECK (
        (kind = 'adjustment' AND amount <> 0) OR (kind <> 'adjustment' AND amount > 0)),
    ADD CONSTRAINT ledger_entries_available_after_check CHECK (available_after >= 0),
    ADD CONSTRAINT ledger_entries_reserved_after_check CHECK (reserved_after >= 0),
    ADD CONSTRAINT ledger_entries_used_after_check CHECK (used_after >= 0);

ALTER TABLE reservations
    DROP CONSTRAINT reservations_rules,
    ADD CONSTRAINT reservations_amount_check CHECK (amount > 0),
    ADD CONSTRAINT reservations_state_check
        CHECK (state IN ('held', 'committed', 'released', 'expired')),
    ADD CONSTRAINT reservations_check CHECK (committed_amount >= 0 AND committed_amount <= amount),
    ADD CONSTRAINT reservations_resolved_at_set CHECK ((state = 'held') = (resolved_at IS NULL)),
    ADD CONSTRAINT reservations_only_commit_spends
        CHECK (state = 'committed' OR committed_amount = 0);

ALTER TABLE accounts
    DROP CONSTRAINT accounts_rules,
    ADD CONSTRAINT accounts_name_check CHECK (char_length(name) BETWEEN 1 AND 200),
    ADD CONSTRAINT accounts_status_check CHECK (status IN ('active', 'suspended')),
    ADD CONSTRAINT accounts_counts_nonnegative CHECK (
        LEAST(available, reserved, used, credited, active_reservations, max_active_reservations,
              low_balance_threshold, grant_expired, topup_threshold) >= 0);

DROP FUNCTION public.events_rules(text);
DROP FUNCTION public.generation_jobs_rules(bytea, text, bigint, text, integer, timestamptz,
    timestamptz);
DROP FUNCTION public.credit_grants_rules(text, bigint, bigint, bigint, bigint, bigint, bigint,
    bigint, smallint, boolean, timestamptz, timestamptz);
DROP FUNCTION public.ledger_entries_rules(text, bigint, bigint, bigint, bigint);
DROP FUNCTION public.reservations_rules(bigint, text, bigint, timestamptz);
DROP FUNCTION public.accounts_rules(text, text, bigint, bigint, bigint, bigint, integer, integer,
    bigint, bigint, bigint);
DROP FUNCTION public.row_rule_broken(text, text);
