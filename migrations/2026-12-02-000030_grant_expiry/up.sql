-- Grants that expire. A grant's `expires_at` (set by the credit or positive
-- adjustment that made it) is when it lapses: its remaining tokens leave the
-- account as a ledger entry of kind `grant_expire`, and tokens that go back
-- to it afterwards (the uncommitted rest of a reservation that drew from
-- it) expire at once, the same way. The rules are the engine's
-- (src/engine/sql); this migration holds the columns.

-- What lapsed: a grant's books become
-- remaining + reserved + consumed + debited + expired = amount.
ALTER TABLE credit_grants
    ADD COLUMN expired bigint NOT NULL DEFAULT 0 CHECK (expired >= 0),
    -- When its lapse was written (by the reaper, or by the first spend on
    -- its account after expires_at); NULL before.
    ADD COLUMN expired_at timestamptz,
    -- When grant.expiring was emitted for it (once per grant).
    ADD COLUMN expiring_notified_at timestamptz,
    DROP CONSTRAINT credit_grants_books,
    ADD CONSTRAINT credit_grants_books
        CHECK (remaining + reserved + consumed + debited + expired = amount),
    ADD CONSTRAINT credit_grants_lapse_after_expiry
        CHECK (expired_at IS NULL OR expires_at IS NOT NULL);

-- Grants that will lapse and have not yet: by account, for the lapse on
-- access (every spend looks up its accounts' due grants), and by expiry,
-- for the reaper's scan.
CREATE INDEX credit_grants_lapse_idx ON credit_grants (account_id, expires_at)
    WHERE expired_at IS NULL AND expires_at IS NOT NULL;
CREATE INDEX credit_grants_due_idx ON credit_grants (expires_at)
    WHERE expired_at IS NULL AND expires_at IS NOT NULL;

-- Tokens that left an account by a grant's lapse, a running total beside
-- credited and adjusted: credited + adjusted = available + reserved + used
-- + grant_expired.
ALTER TABLE accounts ADD COLUMN grant_expired bigint NOT NULL DEFAULT 0 CHECK (grant_expired >= 0);

-- The daily closings' running totals of the same (0 before grants
-- expired), and of the part of it that left `reserved` (the rest of a
-- reservation going back to a lapsed grant; the other part left
-- `available`).
ALTER TABLE ledger_daily_closings
    ADD COLUMN grant_expired bigint NOT NULL DEFAULT 0,
    ADD COLUMN grant_expired_reserved bigint NOT NULL DEFAULT 0;

-- The new ledger kind. The constraint is added NOT VALID and validated
-- separately: the validation reads the ledger without blocking writes.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('credit', 'adjustment', 'reserve', 'commit', 'release', 'expire', 'grant_expire'))
    NOT VALID;
ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_kind_check;

-- The grant events (engine_record, engine_notice_expiring_grants).
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN (
    'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
    'credit.created', 'adjustment.created', 'reservation.expired',
    'grant.expired', 'grant.expiring',
    'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled')) NOT VALID;
ALTER TABLE events VALIDATE CONSTRAINT events_type_check;
