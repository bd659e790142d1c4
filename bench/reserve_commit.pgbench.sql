-- One kiosk cycle as the service executes it (statements captured with
-- log_statement = 'all' from `token-billing bench load`), for pgbench -M
-- prepared: the reserve request (key lookup, then one transaction), then
-- the commit request (key lookup, then one transaction).
-- Accounts and keys have ids derived from their number (bench_uuid, an
-- inlined SQL function of bench/seed.sql), so the script needs no lookup.
\set n random(1, :accounts)
SELECT id, secret_hash, scope, account_id, label, created_at, revoked_at FROM api_keys WHERE id = bench_uuid(:n) LIMIT 1;
BEGIN;
INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) VALUES (gen_random_uuid(), bench_uuid(:n), gen_random_uuid(), 1, NULL, 'held', now() + make_interval(secs => 300)) ON CONFLICT (account_id, request_id) WHERE job_id IS NULL DO NOTHING RETURNING id AS reservation \gset
UPDATE accounts SET available = available - 1, reserved = reserved + 1, active_reservations = active_reservations + 1, version = version + 1, updated_at = now() WHERE id = bench_uuid(:n) AND status = 'active' AND available >= 1 AND (max_active_reservations = 0 OR active_reservations < max_active_reservations) RETURNING available, reserved, used \gset
INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, job_id, external_ref, reason, actor) VALUES (bench_uuid(:n), 'reserve', 1, :available, :reserved, :used, CAST(:reservation AS uuid), NULL, NULL, NULL, 'bench') RETURNING id;
COMMIT;
SELECT id, secret_hash, scope, account_id, label, created_at, revoked_at FROM api_keys WHERE id = bench_uuid(:n) LIMIT 1;
BEGIN;
UPDATE reservations SET state = 'committed', resolved_at = now(), committed_amount = CASE WHEN 'committed' = 'committed' THEN COALESCE(NULL::bigint, amount) ELSE 0 END WHERE id = CAST(:reservation AS uuid) AND account_id = bench_uuid(:n) AND state = 'held' AND expires_at > now() AND amount >= COALESCE(NULL::bigint, 0) RETURNING *;
UPDATE accounts SET reserved = reserved - 1, used = used + 1, available = available + 0, active_reservations = active_reservations - 1, version = version + 1, updated_at = now() WHERE id = bench_uuid(:n) RETURNING available, reserved, used \gset
INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, job_id, external_ref, reason, actor) VALUES (bench_uuid(:n), 'commit', 1, :available, :reserved, :used, CAST(:reservation AS uuid), NULL, NULL, NULL, 'bench') RETURNING id;
COMMIT;
