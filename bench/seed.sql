-- Accounts and kiosk keys for the pgbench reference, with ids derived from
-- their number so the script needs no lookup. Run on a migrated database.
CREATE FUNCTION bench_uuid(n bigint) RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(n), 12, '0'))::uuid $$;
INSERT INTO accounts (id, name, max_active_reservations, available, credited)
SELECT bench_uuid(n), 'pgbench ' || n, 0, 1000000000, 1000000000
FROM generate_series(1, :accounts) n;
-- Each account's tokens as one grant (as the upgrade to grants makes
-- them: no ledger entry behind them).
INSERT INTO credit_grants (id, account_id, source, amount, remaining, drawable)
SELECT id, id, 'upgrade', available, available, true FROM accounts WHERE name LIKE 'pgbench %';
INSERT INTO api_keys (id, secret_hash, scope, account_id, label)
SELECT id, sha256('pgbench-secret'::bytea), 'kiosk', id, 'pgbench' FROM accounts;
ANALYZE;
