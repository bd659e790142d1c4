-- FIXED REFERENCE: never edit this file (write a new one instead). It must not
-- move with the service's code, or a ratio against it measures nothing.
--
-- One generation job in hand-written SQL: three statements, each its own
-- transaction (pgbench runs every top-level statement in autocommit). One
-- pgbench transaction = one job, from created to succeeded: jobs/s = tps.
--
--   create: conditional UPDATE of the account row (key: id, secret hash, not
--           revoked, not expired, kiosk scope on this account; status;
--           balance; active-reservation limit; request_id not used yet by a
--           job of this account), INSERT the job row, its reservation and
--           the ledger entry with the balances after (the statement the
--           service ran at commit 601b970, CREATE_JOB_FAST_SQL, with the
--           values a kiosk sends written in and the key's expiry added);
--   claim:  a worker takes this job's lease: the job row FOR UPDATE SKIP
--           LOCKED, then UPDATE queued → running if due, the fencing token
--           bumped, attempts counted (the SET of 601b970's claim_next);
--   finish: lock the account row, then the job and reservation rows (found
--           by id alone, checked on the locked rows: see the commit of
--           bench/reference_cycle.pgbench.sql for why), mark the job
--           succeeded if this worker's lease still holds and its
--           reservation is held and unexpired,
--           commit the reservation, move the balances, INSERT the ledger
--           entry and the job.succeeded event. The event is written here,
--           not by the schema's trigger (bench/reference_seed.sql disables
--           it: it runs the service's functions, which change).
--
-- The claim names its job: no worker poll (issue 26 counts the poll, the
-- heartbeats, the long poll's reads and the provider call among what the
-- service adds to these three transactions): the least SQL one job needs.
-- Costs and times are the service's defaults: kind "standard" costs 1,
-- reservation TTL 300 s, lease 30 s.
--
-- Data: bench/reference_seed.sql.
--   pgbench -n -M prepared -c 8 -j 2 -T 8 -D accounts=1000 -f bench/reference_job.pgbench.sql <db>
\set n random(1, :accounts)
WITH request AS MATERIALIZED (SELECT gen_random_uuid() AS id), moved AS (UPDATE accounts SET available = available - 1, reserved = reserved + 1, active_reservations = active_reservations + 1, version = version + 1, updated_at = now() WHERE id = bench_uuid(:n) AND status = 'active' AND available >= 1 AND (max_active_reservations = 0 OR active_reservations < max_active_reservations) AND EXISTS (SELECT 1 FROM api_keys WHERE id = bench_uuid(:n) AND secret_hash = sha256('pgbench-secret'::bytea) AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND (scope = 'admin' OR (scope = 'kiosk' AND account_id = bench_uuid(:n)))) AND NOT EXISTS (SELECT 1 FROM generation_jobs WHERE account_id = bench_uuid(:n) AND request_id = (SELECT id FROM request)) RETURNING available, reserved, used), job AS (INSERT INTO generation_jobs (id, account_id, request_id, request_hash, kind, params, cost, reservation_id) SELECT gen_random_uuid(), bench_uuid(:n), request.id, sha256('{"kind":"standard","params":{"simulate":{"delay_ms":0}}}'::bytea), 'standard', '{"simulate": {"delay_ms": 0}}'::jsonb, 1, gen_random_uuid() FROM moved, request RETURNING id, request_id, reservation_id), held AS (INSERT INTO reservations (id, account_id, request_id, amount, state, expires_at, job_id) SELECT job.reservation_id, bench_uuid(:n), job.request_id, 1, 'held', now() + make_interval(secs => 300), job.id FROM job RETURNING id), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, job_id, actor) SELECT bench_uuid(:n), 'reserve', 1, moved.available, moved.reserved, moved.used, job.reservation_id, job.id, bench_uuid(:n)::text FROM moved, job) SELECT job.id FROM job, held \gset c_
WITH candidate AS MATERIALIZED (SELECT status, next_attempt_at FROM generation_jobs WHERE id = :c_id FOR UPDATE SKIP LOCKED) UPDATE generation_jobs SET status = 'running', lease_owner = 'reference-' || :client_id, lease_token = lease_token + 1, lease_expires_at = now() + make_interval(secs => 30), attempts = attempts + 1, updated_at = now() FROM candidate WHERE generation_jobs.id = :c_id AND candidate.status = 'queued' AND candidate.next_attempt_at <= now() RETURNING generation_jobs.id, generation_jobs.account_id, generation_jobs.reservation_id, generation_jobs.lease_token \gset j_
WITH locked AS (SELECT id FROM accounts WHERE id = :j_account_id FOR NO KEY UPDATE), current_job AS MATERIALIZED (SELECT status, lease_token FROM generation_jobs WHERE id = :j_id AND EXISTS (SELECT 1 FROM locked) FOR NO KEY UPDATE), current_reservation AS MATERIALIZED (SELECT state, expires_at FROM reservations WHERE id = :j_reservation_id AND EXISTS (SELECT 1 FROM current_job) FOR NO KEY UPDATE), job AS (UPDATE generation_jobs SET status = 'succeeded', result = jsonb_build_object('output', 'reference://outputs/' || id || '.png'), error = NULL, finished_at = clock_timestamp(), updated_at = now(), lease_expires_at = NULL FROM current_job, current_reservation WHERE generation_jobs.id = :j_id AND current_job.status = 'running' AND current_job.lease_token = :j_lease_token AND current_reservation.state = 'held' AND current_reservation.expires_at > now() RETURNING generation_jobs.*), settled AS (UPDATE reservations SET state = 'committed', resolved_at = now(), committed_amount = amount WHERE id = :j_reservation_id AND EXISTS (SELECT 1 FROM job) RETURNING id, account_id, amount, committed_amount, expires_at), moved AS (UPDATE accounts SET reserved = accounts.reserved - settled.amount, used = accounts.used + settled.committed_amount, available = accounts.available + (settled.amount - settled.committed_amount), active_reservations = accounts.active_reservations - 1, version = accounts.version + 1, updated_at = now() FROM settled WHERE accounts.id = settled.account_id RETURNING accounts.*, settled.committed_amount, settled.expires_at AS reservation_expires_at), entry AS (INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after, used_after, reservation_id, job_id, actor, created_at) SELECT moved.id, 'commit', moved.committed_amount, moved.available, moved.reserved, moved.used, :j_reservation_id, job.id, 'system', job.finished_at FROM moved, job), event AS (INSERT INTO events (type, account_id, data, created_at) SELECT 'job.succeeded', moved.id, jsonb_build_object('account_id', moved.id, 'balances', jsonb_build_object('available', moved.available, 'reserved', moved.reserved, 'used', moved.used, 'credited', moved.credited, 'adjusted', moved.adjusted), 'low_balance_threshold', moved.low_balance_threshold, 'job', (to_jsonb(job) - 'request_hash') || jsonb_build_object('reservation_state', 'committed', 'reservation_expires_at', moved.reservation_expires_at)), job.finished_at FROM moved, job) SELECT count(*) AS finished FROM job \gset f_
\if :f_finished != 1
\set job_not_finished 1 / 0
\endif
