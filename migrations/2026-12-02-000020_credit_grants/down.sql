DROP INDEX ledger_entries_grant_idx;
ALTER TABLE ledger_entries DROP COLUMN grant_id;
ALTER TABLE reservations DROP COLUMN draws;
DROP TABLE credit_grants;
