-- The ceiling of the money engine batched inside PostgreSQL: one statement
-- (one transaction, one WAL flush) reserving 1 token on each of :k random
-- accounts of bench/seed.sql through engine_apply — the same function, the
-- same checks (key, status, balance, limit, replay) and the same ledger
-- entries as the service's batches. Reservations/s = tx/s × k:
--   pgbench -n -M prepared -c 8 -j 2 -T 8 -D k=8 -D accounts=1000 -f bench/engine_batch.pgbench.sql <db>
SELECT count(*) FROM engine_apply((
    SELECT jsonb_agg(jsonb_build_object(
        'op', 'reserve', 'account', account, 'actor', 'bench',
        'key', jsonb_build_object('id', account,
                                  'secret_hash', encode(sha256('pgbench-secret'::bytea), 'hex')),
        'request_id', gen_random_uuid(), 'amount', 1, 'requested_ttl', NULL, 'ttl', 300,
        'reservation_id', gen_random_uuid()))
    FROM (SELECT bench_uuid(1 + floor(random() * :accounts)::bigint) AS account
          FROM generate_series(1, :k)) picked));
