DROP TABLE ledger_entries;
DROP FUNCTION ledger_entries_append_only();
DROP TABLE reservations;
DROP TABLE adjustments;
DROP TABLE credits;
DROP TABLE api_keys;
DROP TABLE accounts;
