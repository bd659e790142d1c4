-- Events (a transactional outbox) and webhook delivery.
--
-- Every event is written by the money engine in the transaction of what it
-- reports: engine_move (the one ledger INSERT) writes the events of a
-- movement next to its entry — credit.created, adjustment.created,
-- reservation.expired and the balance crossings — and a trigger on the
-- job's terminal transition writes job.succeeded / job.failed. So there is
-- no event without its movement and no movement without its event, across
-- crashes: they commit or vanish together.
--
-- The feed's order is the order of commit, not of insert: an event is
-- listed only once every transaction that could still add an earlier one
-- has ended (its transaction id is below the oldest running one,
-- pg_snapshot_xmin), and the cursor is (txid, seq). A reader never skips an
-- event that commits late. See events_feed.

ALTER TABLE accounts
    -- 0 = off. `available` going from >= the threshold to below it is one
    -- account.balance_low; back to >= it, account.balance_recovered.
    ADD COLUMN low_balance_threshold bigint NOT NULL DEFAULT 0
        CHECK (low_balance_threshold >= 0),
    -- Whether account.balance_low was the last crossing reported (so each
    -- crossing is reported once).
    ADD COLUMN balance_low boolean NOT NULL DEFAULT false;

CREATE TABLE events (
    seq        bigserial   NOT NULL,
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- The writing transaction's id (xid8 as a number): the feed's order.
    txid       bigint      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    type       text        NOT NULL CHECK (type IN (
        'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
        'credit.created', 'adjustment.created', 'reservation.expired',
        'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled')),
    account_id uuid        REFERENCES accounts (id),
    data       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX events_feed_idx ON events (txid, seq);
CREATE INDEX events_account_feed_idx ON events (account_id, txid, seq);
CREATE INDEX events_type_feed_idx ON events (type, txid, seq);

CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER events_no_update_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

-- The one place an event is written.
CREATE FUNCTION engine_emit_event(p_type text, p_account uuid, p_data jsonb, p_at timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO events (type, account_id, data, created_at) VALUES (p_type, p_account, p_data, p_at)
$$;

-- The common part of an account's events: its id and balances.
CREATE FUNCTION engine_event_account(p_account accounts) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('account_id', p_account.id,
        'balances', jsonb_build_object('available', p_account.available,
            'reserved', p_account.reserved, 'used', p_account.used,
            'credited', p_account.credited, 'adjusted', p_account.adjusted),
        'low_balance_threshold', p_account.low_balance_threshold)
$$;

-- The low-balance rule, on the account row as it now is (after a movement
-- or a threshold change): below = threshold > 0 and available < threshold.
-- A change of `below` since the last report is one event; switching the
-- threshold off (0) forgets the state without an event.
CREATE FUNCTION engine_low_balance(p_account accounts, p_entry jsonb, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    below boolean := p_account.low_balance_threshold > 0
        AND p_account.available < p_account.low_balance_threshold;
BEGIN
    IF below = p_account.balance_low THEN
        RETURN;
    END IF;
    UPDATE accounts SET balance_low = below WHERE id = p_account.id;
    IF p_account.low_balance_threshold > 0 THEN
        PERFORM engine_emit_event(
            CASE WHEN below THEN 'account.balance_low' ELSE 'account.balance_recovered' END,
            p_account.id,
            engine_event_account(p_account) || jsonb_build_object('entry', p_entry), p_at);
    END IF;
END;
$$;

-- engine_move as in the money engine migration, plus the events of the
-- movement, written next to its ledger entry.
CREATE OR REPLACE FUNCTION engine_move(
    p_account uuid, p_kind text, p_amount bigint, p_active_delta integer,
    p_reservation uuid, p_job uuid, p_external_ref text, p_reason text, p_actor text,
    p_at timestamptz
) RETURNS ledger_entries
LANGUAGE plpgsql AS $$
DECLARE
    d_available bigint;
    d_reserved bigint;
    d_used bigint;
    after accounts;
    entry ledger_entries;
    entry_json jsonb;
BEGIN
    CASE p_kind
        WHEN 'credit', 'adjustment' THEN
            d_available := p_amount; d_reserved := 0; d_used := 0;
        WHEN 'reserve' THEN
            d_available := -p_amount; d_reserved := p_amount; d_used := 0;
        WHEN 'commit' THEN
            d_available := 0; d_reserved := -p_amount; d_used := p_amount;
        WHEN 'release', 'expire' THEN
            d_available := p_amount; d_reserved := -p_amount; d_used := 0;
    END CASE;
    UPDATE accounts
    SET available = available + d_available,
        reserved = reserved + d_reserved,
        used = used + d_used,
        credited = credited + CASE WHEN p_kind = 'credit' THEN p_amount ELSE 0 END,
        adjusted = adjusted + CASE WHEN p_kind = 'adjustment' THEN p_amount ELSE 0 END,
        active_reservations = active_reservations + p_active_delta,
        version = version + 1,
        updated_at = now()
    WHERE id = p_account
    RETURNING * INTO after;
    INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
        used_after, reservation_id, job_id, external_ref, reason, actor, created_at)
    VALUES (p_account, p_kind, p_amount, after.available, after.reserved, after.used,
        p_reservation, p_job, p_external_ref, p_reason, p_actor, p_at)
    RETURNING * INTO entry;

    -- The movement's events. Most movements (reserve, commit, release)
    -- write none unless they cross a balance line.
    IF p_kind IN ('credit', 'adjustment', 'expire')
       OR (d_available <> 0
           AND (after.low_balance_threshold > 0 OR after.balance_low OR after.available = 0)) THEN
        entry_json := to_jsonb(entry);
        CASE p_kind
            WHEN 'credit' THEN
                PERFORM engine_emit_event('credit.created', p_account,
                    engine_event_account(after) || jsonb_build_object('entry', entry_json,
                        'credit', (SELECT to_jsonb(c) FROM credits c WHERE c.external_ref = p_external_ref)),
                    p_at);
            WHEN 'adjustment' THEN
                PERFORM engine_emit_event('adjustment.created', p_account,
                    engine_event_account(after) || jsonb_build_object('entry', entry_json,
                        'adjustment', (SELECT to_jsonb(a) FROM adjustments a WHERE a.external_ref = p_external_ref)),
                    p_at);
            WHEN 'expire' THEN
                PERFORM engine_emit_event('reservation.expired', p_account,
                    engine_event_account(after) || jsonb_build_object('entry', entry_json,
                        'reservation', (SELECT to_jsonb(r) FROM reservations r WHERE r.id = p_reservation)),
                    p_at);
            ELSE
                NULL;
        END CASE;
        PERFORM engine_low_balance(after, entry_json, p_at);
        IF after.available = 0 AND after.available - d_available > 0 THEN
            PERFORM engine_emit_event('account.balance_depleted', p_account,
                engine_event_account(after) || jsonb_build_object('entry', entry_json), p_at);
        END IF;
    END IF;
    RETURN entry;
END;
$$;

-- job.succeeded / job.failed: on the job's one transition into a terminal
-- status, whichever engine function made it (a worker's fenced finish, the
-- reaper's expiry or exhaustion), in its transaction; at its finished_at,
-- which is its ledger entries' created_at.
CREATE FUNCTION engine_job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM engine_emit_event('job.' || NEW.status, NEW.account_id,
        (SELECT engine_event_account(a) FROM accounts a WHERE a.id = NEW.account_id)
            || jsonb_build_object('job', engine_job_json(NEW)),
        COALESCE(NEW.finished_at, clock_timestamp()));
    RETURN NULL;
END;
$$;
CREATE TRIGGER generation_jobs_finished
    AFTER UPDATE OF status ON generation_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION engine_job_finished();

-- The feed: committed events after the cursor (txid, seq), in commit
-- order, optionally of one type and/or one account. Only events of
-- transactions older than every running one are listed, so an event that
-- commits later can never sort before one already listed. Inlined into
-- the caller's query (SQL, STABLE, one SELECT), so the filters use the
-- indexes.
CREATE FUNCTION events_feed(p_txid bigint, p_seq bigint, p_limit integer, p_type text,
    p_account uuid)
RETURNS SETOF events
LANGUAGE sql STABLE AS $$
    SELECT * FROM events
    WHERE (txid, seq) > (p_txid, p_seq)
      AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
      AND (p_type IS NULL OR type = p_type)
      AND (p_account IS NULL OR account_id = p_account)
    ORDER BY txid, seq
    LIMIT p_limit
$$;

-- Webhook endpoints (admin). The secret signs (Standard Webhooks); while
-- a rotation is under way the previous secret signs too, until
-- previous_secret_expires_at. Deleting keeps the row (deleted_at) so the
-- delivery history stays explainable.
CREATE TABLE webhook_endpoints (
    id                         uuid        PRIMARY KEY,
    url                        text        NOT NULL,
    event_types                text[]      NOT NULL CHECK (cardinality(event_types) > 0),
    -- NULL: every account's events; else this account's only.
    account_id                 uuid        REFERENCES accounts (id),
    description                text,
    enabled                    boolean     NOT NULL DEFAULT true,
    -- Why it was disabled: disabled_by_admin, gone (410), failing.
    disabled_reason            text,
    secret                     text        NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    -- The first failure since the last success (NULL when healthy).
    failing_since              timestamptz,
    last_success_at            timestamptz,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    deleted_at                 timestamptz
);

-- One row per (endpoint, event): what must be delivered, claimed by any
-- replica with a lease (FOR UPDATE SKIP LOCKED; no lock is held across
-- the HTTP call). account_id is the event's (the sharding key).
CREATE TABLE webhook_deliveries (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id     uuid        NOT NULL REFERENCES webhook_endpoints (id),
    event_id        uuid        NOT NULL REFERENCES events (id),
    account_id      uuid,
    status          text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token     bigint      NOT NULL DEFAULT 0,
    leased_until    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';

-- Every attempt, for the endpoint's delivery log.
CREATE TABLE webhook_attempts (
    id           bigserial        PRIMARY KEY,
    delivery_id  uuid             NOT NULL REFERENCES webhook_deliveries (id),
    endpoint_id  uuid             NOT NULL REFERENCES webhook_endpoints (id),
    event_id     uuid             NOT NULL REFERENCES events (id),
    attempt      integer          NOT NULL,
    attempted_at timestamptz      NOT NULL,
    -- The HTTP status, or NULL when there was none (error says why).
    status_code  integer,
    error        text,
    latency_ms   double precision NOT NULL,
    -- delivered, retrying, exhausted (no attempt left), endpoint_gone (410).
    outcome      text             NOT NULL
);
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id);

-- How far the fan-out from the feed to the deliveries has got.
CREATE TABLE webhook_relay (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    after_txid bigint  NOT NULL,
    after_seq  bigint  NOT NULL
);
INSERT INTO webhook_relay VALUES (true, 0, 0);

-- One fan-out step: the next events of the feed become deliveries to the
-- enabled endpoints that subscribe to them (type, account, and created no
-- later than the event), and the cursor moves past them, in one
-- transaction. One replica at a time (the cursor row is locked; another
-- replica skips). Returns the number of events handled, NULL when another
-- replica holds the relay. With nothing past the cursor it returns 0
-- without taking the lock: an idle relay, polled by every replica, writes
-- nothing and holds no transaction id back.
CREATE FUNCTION webhook_relay_step(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cursor_row webhook_relay;
    handled integer;
    last_txid bigint;
    last_seq bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM events e, webhook_relay r
                   WHERE (e.txid, e.seq) > (r.after_txid, r.after_seq)) THEN
        RETURN 0;
    END IF;
    SELECT * INTO cursor_row FROM webhook_relay FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH batch AS MATERIALIZED (
        SELECT * FROM events_feed(cursor_row.after_txid, cursor_row.after_seq, p_limit, NULL, NULL)
    ), fanned_out AS (
        INSERT INTO webhook_deliveries (endpoint_id, event_id, account_id)
        SELECT w.id, e.id, e.account_id
        FROM batch e
        JOIN webhook_endpoints w
          ON w.enabled AND w.deleted_at IS NULL
         AND e.type = ANY (w.event_types)
         AND (w.account_id IS NULL OR w.account_id = e.account_id)
         AND w.created_at <= e.created_at
        ON CONFLICT (endpoint_id, event_id) DO NOTHING
    )
    SELECT count(*), (array_agg(txid ORDER BY txid DESC, seq DESC))[1],
           (array_agg(seq ORDER BY txid DESC, seq DESC))[1]
    INTO handled, last_txid, last_seq
    FROM batch;
    IF handled > 0 THEN
        UPDATE webhook_relay SET after_txid = last_txid, after_seq = last_seq;
    END IF;
    RETURN handled;
END;
$$;

-- Each table's role in the plan past one primary (docs/scaling.md).
COMMENT ON TABLE events IS
    'distribution: distributed by account_id, colocated with accounts (account-less events, endpoint.disabled, local to the coordinator; the feed then orders per shard)';
COMMENT ON TABLE webhook_endpoints IS
    'distribution: reference table (few rows, read by every shard''s relay)';
COMMENT ON TABLE webhook_deliveries IS
    'distribution: distributed by account_id, colocated with accounts (deliveries of account-less events local to the coordinator)';
COMMENT ON TABLE webhook_attempts IS
    'distribution: local to the coordinator (the delivery log, no account_id)';
COMMENT ON TABLE webhook_relay IS
    'distribution: local to the coordinator (one row; one relay cursor per shard under Citus)';
