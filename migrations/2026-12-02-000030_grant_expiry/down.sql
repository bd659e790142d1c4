-- Refused while any grant has lapsed: its grant_expire entries have no
-- place in the earlier schema.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_entries WHERE kind = 'grant_expire')
       OR EXISTS (SELECT 1 FROM events WHERE type IN ('grant.expired', 'grant.expiring')) THEN
        RAISE EXCEPTION 'grants have expired: the ledger holds grant_expire entries (or the events grant events), which the earlier schema cannot hold';
    END IF;
END;
$$;
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN (
    'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
    'credit.created', 'adjustment.created', 'reservation.expired',
    'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled'));
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('credit', 'adjustment', 'reserve', 'commit', 'release', 'expire'));
ALTER TABLE ledger_daily_closings DROP COLUMN grant_expired_reserved, DROP COLUMN grant_expired;
ALTER TABLE accounts DROP COLUMN grant_expired;
DROP INDEX credit_grants_due_idx;
DROP INDEX credit_grants_lapse_idx;
ALTER TABLE credit_grants
    DROP CONSTRAINT credit_grants_lapse_after_expiry,
    DROP CONSTRAINT credit_grants_books,
    ADD CONSTRAINT credit_grants_books CHECK (remaining + reserved + consumed + debited = amount),
    DROP COLUMN expiring_notified_at,
    DROP COLUMN expired_at,
    DROP COLUMN expired;
