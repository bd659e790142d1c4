-- Generation jobs: one per (account, request_id), the kiosk's idempotency
-- key. A job spends exactly one reservation, created in the same
-- transaction; workers hold fenced leases (lease_token is bumped on every
-- claim, and every worker write is conditional on it).

CREATE TABLE generation_jobs (
    id               uuid        PRIMARY KEY,
    account_id       uuid        NOT NULL REFERENCES accounts (id),
    request_id       uuid        NOT NULL,
    -- SHA-256 of the canonical request ({kind, params}): tells a replay from
    -- a reuse of the request_id with a different body.
    request_hash     bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
    kind             text        NOT NULL CHECK (char_length(kind) BETWEEN 1 AND 64),
    params           jsonb       NOT NULL,
    cost             bigint      NOT NULL CHECK (cost > 0),
    status           text        NOT NULL DEFAULT 'queued'
                                 CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    -- Deferred: the job row is inserted first, to claim its request_id,
    -- and its reservation later in the same transaction.
    reservation_id   uuid        NOT NULL UNIQUE REFERENCES reservations (id) DEFERRABLE INITIALLY DEFERRED,
    lease_owner      text,
    lease_token      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    provider_job_id  text,
    result           jsonb,
    error            jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT generation_jobs_request_unique UNIQUE (account_id, request_id),
    CONSTRAINT generation_jobs_finished CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    CONSTRAINT generation_jobs_running_leased CHECK (status <> 'running' OR lease_expires_at IS NOT NULL)
);

-- Workers' claim: due queued jobs, and running jobs whose lease ran out.
CREATE INDEX generation_jobs_queued_idx ON generation_jobs (next_attempt_at) WHERE status = 'queued';
CREATE INDEX generation_jobs_running_idx ON generation_jobs (lease_expires_at) WHERE status = 'running';
-- Listing an account's jobs, newest first.
CREATE INDEX generation_jobs_account_idx ON generation_jobs (account_id, id);
