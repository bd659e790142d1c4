-- FIXED REFERENCE: never edit this file (write a new one instead). It must not
-- move with the service's code, or a ratio against it measures nothing.
--
-- The cycles of bench/reference_cycle.pgbench.sql set-based: 8 kiosks'
-- reserve → commit cycles on 8 distinct random accounts, as two statements
-- (two transactions): one reserve statement for the 8, then one commit
-- statement for their 8 reservations. Each statement locks its accounts in
-- id order first (FOR NO KEY UPDATE), then moves the tokens with one
-- UPDATE … FROM and writes the reservations and ledger entries with
-- INSERT … SELECT — the shape that measured fastest here (FACTS: batch in one
-- statement, lock in id order). Every op keeps its own checks: key (id,
-- secret hash, not revoked, not expired, kiosk scope on its account),
-- status, balance, active-reservation limit, request_id not used yet; the
-- commit: held and unexpired. One pgbench transaction = 8 cycles:
-- cycles/s = tps × 8.
--
-- Data: bench/reference_seed.sql with many accounts (spread only; 8 distinct
-- accounts need at least 8, and the draw below assumes many more).
--   pgbench -n -M prepared -c 8 -j 2 -T 8 -D accounts=1000 -f bench/reference_cycle_batched8.pgbench.sql <db>
-- The 8 accounts are the first 8 distinct of 16 random draws (in draw
-- order, so unbiased); a run aborts if a statement did not move all 8.
WITH draws AS (SELECT i, 1 + floor(random() * :accounts)::bigint AS n FROM generate_series(1, 16) i), picked AS MATERIALIZED (SELECT bench_uuid(n) AS account, gen_random_uuid() AS request_id, gen_random_uuid() AS reservation_id FROM (SELECT DISTINCT ON (n) n, i FROM draws ORDER BY n, i) first_draws ORDER BY i LIMIT 8), locked AS MATERIALIZED (SELECT id FROM accounts WHERE id = ANY (ARRAY(SELECT account FROM picked)) ORDER BY id FOR NO KEY UPDATE), moved AS (UPDATE accounts SET available = accounts.available - 1, reserved = accounts.reserved + 1, active_reservations = accounts.active_reservations + 1, version = accounts.version + 1, updated_at = now() FROM picked WHERE accounts.id = ANY (ARRAY(SELECT id FROM locked)) AND accounts.id = picked.account AND accounts.status = 'active' AND accounts.available >= 1 AND (accounts.max_active_reservations = 0 OR accounts.active_reservations < accounts.max_active_reservations) AND EXISTS (SELECT 1 FROM api_keys k WHERE k.id = picked.account AND k.secret_hash = sha256('pgbench-secret'::bytea) AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND (k.scope = 'admin' OR (k.scope = 'kiosk' AND k.account_id = accounts.id))) AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.account_id = accounts.id AND r.request_id = picked.request_id AND r.job_id IS NULL) RETURNING accounts.id, accounts.available, accounts.reserved, accounts.used, picked.request_id, picked.reservation_id), held AS (INSERT INTO reservations (id, account_id, request_id, amount, requested_ttl_seconds, state, expires_at) SELECT reservation_id, id, request_id, 1, NULL, 'held', now() + make_interval(secs => 300) FROM moved ORDER BY id RETURNING id, account_id), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, actor) SELECT id, 'reserve', 1, available, reserved, used, reservation_id, id::text FROM moved ORDER BY moved.id) SELECT count(*) AS held, array_agg(id) AS ids, array_agg(account_id) AS accounts FROM held \gset b_
\if :b_held != 8
\set fewer_than_8_reserved 1 / 0
\endif
WITH locked AS MATERIALIZED (SELECT id FROM accounts WHERE id = ANY (:b_accounts::uuid[]) ORDER BY id FOR NO KEY UPDATE), target AS MATERIALIZED (SELECT id, account_id, amount, state, expires_at, job_id FROM reservations WHERE (SELECT count(*) FROM locked) > 0 AND id = ANY (:b_ids::uuid[]) FOR NO KEY UPDATE), settled AS (UPDATE reservations SET state = 'committed', resolved_at = now(), committed_amount = target.amount FROM target WHERE reservations.id = target.id AND target.state = 'held' AND target.expires_at > now() AND target.job_id IS NULL AND EXISTS (SELECT 1 FROM api_keys k WHERE k.id = target.account_id AND k.secret_hash = sha256('pgbench-secret'::bytea) AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND (k.scope = 'admin' OR (k.scope = 'kiosk' AND k.account_id = target.account_id))) RETURNING reservations.id, reservations.account_id, reservations.amount, reservations.committed_amount), moved AS (UPDATE accounts SET reserved = accounts.reserved - settled.amount, used = accounts.used + settled.committed_amount, available = accounts.available + (settled.amount - settled.committed_amount), active_reservations = accounts.active_reservations - 1, version = accounts.version + 1, updated_at = now() FROM settled WHERE accounts.id = settled.account_id RETURNING accounts.id, accounts.available, accounts.reserved, accounts.used, settled.id AS reservation_id, settled.committed_amount), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, actor) SELECT id, 'commit', committed_amount, available, reserved, used, reservation_id, id::text FROM moved ORDER BY moved.id) SELECT count(*) AS committed FROM settled \gset c_
\if :c_committed != 8
\set fewer_than_8_committed 1 / 0
\endif
