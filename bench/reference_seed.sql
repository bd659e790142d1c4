-- The data of the fixed pgbench references (bench/reference_*.pgbench.sql),
-- on a database migrated by the service (its tables, nothing else):
--   psql -v accounts=1000 -f bench/reference_seed.sql <db>
--
-- :accounts accounts, each with 1,000,000,000 tokens credited (a credits
-- row and its ledger entry, so a replay of the ledger gives the balances)
-- and one kiosk key whose id is the account's id and whose secret hashes to
-- sha256('pgbench-secret'). Ids derive from the account number
-- (bench_uuid(n)), so the scripts need no lookup. No active-reservation
-- limit (0), no low-balance threshold: the same fleet `bench load` creates.
--
-- Fixed means: the references' statements are the whole cost. Triggers
-- run the service's functions, which change with the service (when this
-- was written, the trigger `generation_jobs_finished` wrote job.succeeded
-- through engine_* functions; the engine's second edition drops it); the
-- user triggers of the tables the references write are therefore disabled
-- here, whatever they are, and the references write what the books need
-- (reservation, ledger entry, job row, job.succeeded event) in their own
-- SQL. Foreign keys and CHECKs (internal constraint triggers) stay on.
CREATE OR REPLACE FUNCTION bench_uuid(n bigint) RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(n), 12, '0'))::uuid $$;

ALTER TABLE accounts DISABLE TRIGGER USER;
ALTER TABLE api_keys DISABLE TRIGGER USER;
ALTER TABLE reservations DISABLE TRIGGER USER;
ALTER TABLE ledger_entries DISABLE TRIGGER USER;
ALTER TABLE generation_jobs DISABLE TRIGGER USER;
ALTER TABLE events DISABLE TRIGGER USER;
ALTER TABLE credits DISABLE TRIGGER USER;

INSERT INTO accounts (id, name, max_active_reservations, available, credited)
SELECT bench_uuid(n), 'reference ' || n, 0, 1000000000, 1000000000
FROM generate_series(1, :accounts) n;
INSERT INTO credits (id, account_id, amount, external_ref, actor)
SELECT gen_random_uuid(), id, 1000000000, 'reference-seed-' || id, 'bench' FROM accounts;
INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after,
    external_ref, actor)
SELECT id, 'credit', 1000000000, 1000000000, 0, 0, 'reference-seed-' || id, 'bench'
FROM accounts ORDER BY id;
INSERT INTO api_keys (id, secret_hash, scope, account_id, label)
SELECT id, sha256('pgbench-secret'::bytea), 'kiosk', id, 'reference' FROM accounts;
ANALYZE;
