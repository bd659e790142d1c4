-- FIXED REFERENCE: never edit this file (write a new one instead). It must not
-- move with the service's code, or a ratio against it measures nothing.
--
-- One kiosk's reserve → commit cycle in hand-written SQL, one request per
-- transaction: two statements, each its own transaction (pgbench runs every
-- top-level statement in autocommit). These are the statements the service
-- ran at commit 601b970 (reserve_fast_sql and resolve_fast_sql, printed then
-- by `bench pgbench-script`) with the values a kiosk sends written in,
-- adapted to the current tables: the key check also refuses an expired key
-- (api_keys.expires_at), and the commit locks the account row before the
-- reservation row (the lock order every path follows). One pgbench
-- transaction = one cycle.
--
--   reserve: conditional UPDATE of the account row (key: id, secret hash,
--            not revoked, not expired, kiosk scope on this account; status;
--            balance; active-reservation limit; request_id not used yet),
--            INSERT the reservation, INSERT the ledger entry with the
--            balances after;
--   commit:  lock the account row, UPDATE the reservation held → committed
--            if unexpired, UPDATE the balances, INSERT the ledger entry.
--
-- Data: bench/reference_seed.sql. Spread: -D accounts=1000; hot: -D accounts=1.
--   pgbench -n -M prepared -c 8 -j 2 -T 8 -D accounts=1000 -f bench/reference_cycle.pgbench.sql <db>
-- The request_id is a fresh gen_random_uuid(), computed once per statement
-- (a MATERIALIZED CTE) so that its look-up goes through the unique index as a
-- bound value would.
\set n random(1, :accounts)
WITH request AS MATERIALIZED (SELECT gen_random_uuid() AS id), moved AS (UPDATE accounts SET available = available - 1, reserved = reserved + 1, active_reservations = active_reservations + 1, version = version + 1, updated_at = now() WHERE id = bench_uuid(:n) AND status = 'active' AND available >= 1 AND (max_active_reservations = 0 OR active_reservations < max_active_reservations) AND EXISTS (SELECT 1 FROM api_keys WHERE id = bench_uuid(:n) AND secret_hash = sha256('pgbench-secret'::bytea) AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND (scope = 'admin' OR (scope = 'kiosk' AND account_id = bench_uuid(:n)))) AND NOT EXISTS (SELECT 1 FROM reservations WHERE account_id = bench_uuid(:n) AND request_id = (SELECT id FROM request) AND job_id IS NULL) RETURNING available, reserved, used), held AS (INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) SELECT gen_random_uuid(), bench_uuid(:n), request.id, 1, NULL, 'held', now() + make_interval(secs => 300) FROM moved, request RETURNING id), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, actor) SELECT bench_uuid(:n), 'reserve', 1, moved.available, moved.reserved, moved.used, held.id, bench_uuid(:n)::text FROM moved, held) SELECT id FROM held \gset r_
WITH locked AS (SELECT id FROM accounts WHERE id = bench_uuid(:n) FOR NO KEY UPDATE), settled AS (UPDATE reservations SET state = 'committed', resolved_at = now(), committed_amount = amount WHERE id = :r_id AND account_id = bench_uuid(:n) AND EXISTS (SELECT 1 FROM locked) AND state = 'held' AND expires_at > now() AND job_id IS NULL AND EXISTS (SELECT 1 FROM api_keys WHERE id = bench_uuid(:n) AND secret_hash = sha256('pgbench-secret'::bytea) AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND (scope = 'admin' OR (scope = 'kiosk' AND account_id = bench_uuid(:n)))) RETURNING account_id, amount, committed_amount), moved AS (UPDATE accounts SET reserved = accounts.reserved - settled.amount, used = accounts.used + settled.committed_amount, available = accounts.available + (settled.amount - settled.committed_amount), active_reservations = accounts.active_reservations - 1, version = accounts.version + 1, updated_at = now() FROM settled WHERE accounts.id = settled.account_id RETURNING accounts.available, accounts.reserved, accounts.used, settled.committed_amount), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, actor) SELECT bench_uuid(:n), 'commit', moved.committed_amount, moved.available, moved.reserved, moved.used, :r_id, bench_uuid(:n)::text FROM moved) SELECT count(*) AS committed FROM settled \gset c_
