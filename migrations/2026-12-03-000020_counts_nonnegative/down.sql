ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_counts_nonnegative,
    ADD CONSTRAINT credit_grants_remaining_check CHECK (remaining >= 0),
    ADD CONSTRAINT credit_grants_reserved_check CHECK (reserved >= 0),
    ADD CONSTRAINT credit_grants_consumed_check CHECK (consumed >= 0),
    ADD CONSTRAINT credit_grants_debited_check CHECK (debited >= 0),
    ADD CONSTRAINT credit_grants_opening_reserved_check CHECK (opening_reserved >= 0),
    ADD CONSTRAINT credit_grants_expired_check CHECK (expired >= 0);

ALTER TABLE accounts
    DROP CONSTRAINT accounts_counts_nonnegative,
    ADD CONSTRAINT accounts_available_check CHECK (available >= 0),
    ADD CONSTRAINT accounts_reserved_check CHECK (reserved >= 0),
    ADD CONSTRAINT accounts_used_check CHECK (used >= 0),
    ADD CONSTRAINT accounts_credited_check CHECK (credited >= 0),
    ADD CONSTRAINT accounts_active_reservations_check CHECK (active_reservations >= 0),
    ADD CONSTRAINT accounts_max_active_reservations_check CHECK (max_active_reservations >= 0),
    ADD CONSTRAINT accounts_low_balance_threshold_check CHECK (low_balance_threshold >= 0),
    ADD CONSTRAINT accounts_grant_expired_check CHECK (grant_expired >= 0),
    ADD CONSTRAINT accounts_topup_threshold_check CHECK (topup_threshold >= 0);
