-- One CHECK for the non-negative counts of accounts and of credit_grants,
-- where each count had its own. The rule is the same (every count is at
-- least 0); what changes is its price. PostgreSQL 15 reads each CHECK
-- constraint of a table from its stored text, plans it and sets it up
-- again at every statement that writes the table: accounts had 11,
-- credit_grants 12, and a reserve or a commit writes both. Nine counts of
-- accounts and six of credit_grants become one LEAST(…) >= 0 each (the
-- columns are NOT NULL, so LEAST sees every one of them); the other
-- constraints (names, states, the grant's books, priority, expiry) stay as
-- they were. Adding the constraint checks the rows there are.
ALTER TABLE accounts
    DROP CONSTRAINT accounts_available_check,
    DROP CONSTRAINT accounts_reserved_check,
    DROP CONSTRAINT accounts_used_check,
    DROP CONSTRAINT accounts_credited_check,
    DROP CONSTRAINT accounts_active_reservations_check,
    DROP CONSTRAINT accounts_max_active_reservations_check,
    DROP CONSTRAINT accounts_low_balance_threshold_check,
    DROP CONSTRAINT accounts_grant_expired_check,
    DROP CONSTRAINT accounts_topup_threshold_check,
    ADD CONSTRAINT accounts_counts_nonnegative CHECK (
        LEAST(available, reserved, used, credited, active_reservations, max_active_reservations,
              low_balance_threshold, grant_expired, topup_threshold) >= 0);

ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_remaining_check,
    DROP CONSTRAINT credit_grants_reserved_check,
    DROP CONSTRAINT credit_grants_consumed_check,
    DROP CONSTRAINT credit_grants_debited_check,
    DROP CONSTRAINT credit_grants_opening_reserved_check,
    DROP CONSTRAINT credit_grants_expired_check,
    ADD CONSTRAINT credit_grants_counts_nonnegative CHECK (
        LEAST(remaining, reserved, consumed, debited, opening_reserved, expired) >= 0);
