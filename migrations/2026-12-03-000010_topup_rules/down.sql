ALTER TABLE events DROP CONSTRAINT events_type_check;
DELETE FROM events WHERE type LIKE 'topup.%';
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN (
    'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
    'credit.created', 'adjustment.created', 'reservation.expired',
    'grant.expired', 'grant.expiring',
    'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled'));
ALTER TABLE credit_grants DROP COLUMN topup_rule_id;
ALTER TABLE accounts DROP COLUMN topup_threshold, DROP COLUMN topup_armed;
DROP TABLE topup_firings;
DROP TABLE topup_rules;
