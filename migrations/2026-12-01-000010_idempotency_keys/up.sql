-- `Idempotency-Key` of the creations that have no natural key in their body
-- (an account, an API key): a retry after a lost response finds the object
-- the first request created instead of creating a second one.
--
-- One row per (caller, endpoint, key), written in the creation's own
-- transaction: a concurrent duplicate waits on the primary key, then sees
-- the row and replays it.
CREATE TABLE idempotency_keys (
    -- The API key id of the caller (or the bootstrap admin's marker).
    actor TEXT NOT NULL,
    -- The path the request was sent to, e.g. /v1/accounts/<id>/api-keys.
    endpoint TEXT NOT NULL,
    idempotency_key TEXT NOT NULL
        CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    -- SHA-256 of the canonical request: the same key with another body is
    -- refused (422).
    request_hash BYTEA NOT NULL CHECK (length(request_hash) = 32),
    -- The created account or API key.
    resource_id UUID NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (actor, endpoint, idempotency_key)
);
