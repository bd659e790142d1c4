-- Each table's role in the plan past one primary (docs/scaling.md: Citus,
-- distributed by account_id), written on the table itself so that whoever
-- adds a table sees the rule in \d+ and a move can be generated from the
-- catalogue. Comments only: nothing about storage, locking or the engine
-- changes.
COMMENT ON TABLE accounts IS
    'distribution: distributed by id (the account_id of every colocated table); anchor of the colocation group';
COMMENT ON TABLE reservations IS
    'distribution: distributed by account_id, colocated with accounts';
COMMENT ON TABLE ledger_entries IS
    'distribution: distributed by account_id, colocated with accounts';
COMMENT ON TABLE credits IS
    'distribution: distributed by account_id, colocated with accounts (external_ref unique per account under Citus)';
COMMENT ON TABLE adjustments IS
    'distribution: distributed by account_id, colocated with accounts (external_ref unique per account under Citus)';
COMMENT ON TABLE generation_jobs IS
    'distribution: distributed by account_id, colocated with accounts (claim and reaper per shard under Citus)';
COMMENT ON TABLE api_keys IS
    'distribution: reference table (looked up before the shard is known)';
COMMENT ON TABLE audit_events IS
    'distribution: reference table or local to the coordinator (administrative, no account_id)';
COMMENT ON TABLE idempotency_keys IS
    'distribution: reference table or local to the coordinator (administrative creations)';
COMMENT ON TABLE reaper_status IS
    'distribution: local to the coordinator (one row)';
