-- Core schema: accounts, API keys, credits, adjustments, reservations and the
-- append-only ledger. Every token is in exactly one of available / reserved /
-- used; the CHECKs below make a negative balance or a broken conservation law
-- impossible to commit, whatever the application does.

CREATE TABLE accounts (
    id                      uuid        PRIMARY KEY,
    name                    text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    status                  text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    available               bigint      NOT NULL DEFAULT 0 CHECK (available >= 0),
    reserved                bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    used                    bigint      NOT NULL DEFAULT 0 CHECK (used >= 0),
    credited                bigint      NOT NULL DEFAULT 0 CHECK (credited >= 0),
    adjusted                bigint      NOT NULL DEFAULT 0,
    -- Number of reservations in state 'held'. Kept on the account row so the
    -- limit is enforced by the same conditional UPDATE that moves the tokens.
    active_reservations     integer     NOT NULL DEFAULT 0 CHECK (active_reservations >= 0),
    max_active_reservations integer     NOT NULL DEFAULT 10 CHECK (max_active_reservations >= 0),
    version                 bigint      NOT NULL DEFAULT 1,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          uuid        PRIMARY KEY,
    -- SHA-256 of the secret part of the key; the key itself is never stored.
    secret_hash bytea       NOT NULL CHECK (octet_length(secret_hash) = 32),
    scope       text        NOT NULL CHECK (scope IN ('admin', 'finance', 'kiosk')),
    account_id  uuid        REFERENCES accounts (id),
    label       text        NOT NULL CHECK (char_length(label) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_keys_kiosk_bound_to_account CHECK ((scope = 'kiosk') = (account_id IS NOT NULL))
);
CREATE INDEX api_keys_account_id_idx ON api_keys (account_id);

CREATE TABLE credits (
    id           uuid        PRIMARY KEY,
    account_id   uuid        NOT NULL REFERENCES accounts (id),
    amount       bigint      NOT NULL CHECK (amount > 0),
    external_ref text        NOT NULL UNIQUE CHECK (char_length(external_ref) BETWEEN 1 AND 200),
    note         text        CHECK (char_length(note) <= 1000),
    actor        text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX credits_account_id_idx ON credits (account_id);

CREATE TABLE adjustments (
    id           uuid        PRIMARY KEY,
    account_id   uuid        NOT NULL REFERENCES accounts (id),
    amount       bigint      NOT NULL CHECK (amount <> 0),
    reason       text        NOT NULL CHECK (char_length(reason) BETWEEN 1 AND 1000),
    external_ref text        NOT NULL UNIQUE CHECK (char_length(external_ref) BETWEEN 1 AND 200),
    actor        text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX adjustments_account_id_idx ON adjustments (account_id);

CREATE TABLE reservations (
    id               uuid        PRIMARY KEY,
    account_id       uuid        NOT NULL REFERENCES accounts (id),
    request_id       uuid        NOT NULL,
    amount           bigint      NOT NULL CHECK (amount > 0),
    -- The ttl_seconds the client asked for (NULL = the default); kept to tell
    -- a replay from a reuse of the same request_id with a different body.
    requested_ttl_seconds integer,
    state            text        NOT NULL DEFAULT 'held'
                                 CHECK (state IN ('held', 'committed', 'released', 'expired')),
    committed_amount bigint      NOT NULL DEFAULT 0
                                 CHECK (committed_amount >= 0 AND committed_amount <= amount),
    expires_at       timestamptz NOT NULL,
    job_id           uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    CONSTRAINT reservations_resolved_at_set CHECK ((state = 'held') = (resolved_at IS NULL)),
    CONSTRAINT reservations_only_commit_spends CHECK (state = 'committed' OR committed_amount = 0)
);
-- Idempotency of POST /reservations: one reservation per (account, request_id).
-- Reservations made for generation jobs are keyed by their job instead.
CREATE UNIQUE INDEX reservations_account_request_idx
    ON reservations (account_id, request_id) WHERE job_id IS NULL;
-- The reaper's scan: only held reservations, by expiry.
CREATE INDEX reservations_held_expiry_idx ON reservations (expires_at) WHERE state = 'held';
CREATE INDEX reservations_account_idx ON reservations (account_id, created_at);

CREATE TABLE ledger_entries (
    -- Monotonic id: the pagination cursor. Every entry is written after its
    -- account row was locked by an UPDATE in the same transaction, so within
    -- one account ids are in commit order.
    id              bigserial   PRIMARY KEY,
    account_id      uuid        NOT NULL REFERENCES accounts (id),
    kind            text        NOT NULL
                                CHECK (kind IN ('credit', 'adjustment', 'reserve', 'commit', 'release', 'expire')),
    amount          bigint      NOT NULL,
    available_after bigint      NOT NULL CHECK (available_after >= 0),
    reserved_after  bigint      NOT NULL CHECK (reserved_after >= 0),
    used_after      bigint      NOT NULL CHECK (used_after >= 0),
    reservation_id  uuid        REFERENCES reservations (id),
    job_id          uuid,
    external_ref    text,
    reason          text,
    actor           text        NOT NULL,
    -- clock_timestamp(), not now(): the entry is written while its account
    -- row is locked, so within an account created_at follows id (commit
    -- order), which period reports rely on at their boundaries.
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT ledger_amount_sign CHECK (
        (kind = 'adjustment' AND amount <> 0) OR (kind <> 'adjustment' AND amount > 0))
);
CREATE INDEX ledger_entries_account_idx ON ledger_entries (account_id, id);
CREATE INDEX ledger_entries_created_at_idx ON ledger_entries (created_at);
-- Replays of credits and adjustments answer with the balances of their entry.
CREATE INDEX ledger_entries_external_ref_idx ON ledger_entries (external_ref) WHERE external_ref IS NOT NULL;
CREATE INDEX ledger_entries_reservation_idx ON ledger_entries (reservation_id) WHERE reservation_id IS NOT NULL;

-- The ledger is append-only: no UPDATE, DELETE or TRUNCATE, from any client.
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER ledger_entries_no_update_delete
    BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only();
CREATE TRIGGER ledger_entries_no_truncate
    BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only();
