-- History on one node: daily closing balances derived from the ledger, and
-- the bookkeeping of retention (what was pruned up to where).

-- A UTC day whose closing balances are written: every account that moved
-- that day has its row in ledger_daily_closings, written in the same
-- transaction. Days close in order, so every day up to the last row here
-- is closed.
CREATE TABLE ledger_closed_days (
    day        date        PRIMARY KEY,
    -- Accounts with a closing row for the day, and the day's entries.
    accounts   integer     NOT NULL CHECK (accounts >= 0),
    entries    bigint      NOT NULL CHECK (entries >= 0),
    closed_at  timestamptz NOT NULL DEFAULT now()
);

-- One account's books at the end of a UTC day on which it moved (accounts
-- that did not move have no row: their last row still holds). Balances are
-- those after the last entry of the day (last_entry_id, the entry to
-- resume from); the other figures are running totals since the account was
-- opened, so a period's movements are a difference of two rows. Derived
-- from the ledger and checked against it on every use (a mismatch is an
-- invariant violation, never trusted).
CREATE TABLE ledger_daily_closings (
    account_id         uuid   NOT NULL REFERENCES accounts (id),
    day                date   NOT NULL REFERENCES ledger_closed_days (day),
    available          bigint NOT NULL,
    reserved           bigint NOT NULL,
    used               bigint NOT NULL,
    credited           bigint NOT NULL,
    adjusted           bigint NOT NULL,
    reserved_total     bigint NOT NULL,
    committed          bigint NOT NULL,
    released           bigint NOT NULL,
    expired            bigint NOT NULL,
    job_commit_entries bigint NOT NULL,
    entries            bigint NOT NULL,
    last_entry_id      bigint NOT NULL,
    PRIMARY KEY (account_id, day)
);

-- What retention has pruned: per table, the newest row it deleted, so a
-- cursor older than that is answered with an error instead of a silent gap.
CREATE TABLE retention_watermarks (
    table_name  text        PRIMARY KEY,
    -- Rows created before this instant may have been pruned.
    pruned_before timestamptz NOT NULL,
    -- For events: the feed position (txid, seq) of the newest pruned event.
    last_txid   bigint,
    last_seq    bigint,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- events and audit_events stay append-only for every client, except a
-- retention pass, which says so with `SET LOCAL token_billing.retention =
-- 'on'` in its own transaction before it deletes expired rows.
CREATE OR REPLACE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('token_billing.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE OR REPLACE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('token_billing.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

-- Retention finds its oldest rows by age.
CREATE INDEX events_created_at_idx ON events (created_at);
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
CREATE INDEX webhook_deliveries_created_at_idx ON webhook_deliveries (created_at);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
CREATE INDEX audit_events_created_at_idx ON audit_events (created_at);

COMMENT ON TABLE ledger_closed_days IS
    'distribution: reference table (one row per closed day, read with every closing)';
COMMENT ON TABLE ledger_daily_closings IS
    'distribution: distributed by account_id, colocated with accounts';
COMMENT ON TABLE retention_watermarks IS
    'distribution: local to the coordinator (one row per pruned table)';
