-- The engine's types. A field that may be NULL says so; callers never pass "missing means all".

-- Plans: functions that a request or a job's worker calls run with `SET plan_cache_mode =
-- force_generic_plan` (planning at every call cost three times the execution). A generic plan
-- does not know the batch's keys, so a look-up by primary key is `= ANY (ARRAY(...))`; by a
-- two-column key (an account's request_id), a LATERAL subquery with LIMIT 1 (`= ANY` of the
-- second column walks the whole index). No statement joins two of the batch's CTEs on their
-- keys (nested loop, quadratic in the batch). The reaper's and claimer's LIMIT scans keep the
-- default mode: their plans depend on the limit.

-- One movement of one account's tokens: engine_record applies it and writes its ledger entry.
CREATE TYPE engine_movement AS (
    account      uuid,
    kind         text,        -- credit, adjustment, reserve, commit, release, expire, grant_expire
    amount       bigint,      -- signed only for an adjustment
    active_delta integer,     -- +1 on a reserve, -1 on the last entry of a settlement
    reservation  uuid,        -- may be NULL; a grant_expire with one takes its rest
    job          uuid,        -- may be NULL
    external_ref text,        -- may be NULL
    reason       text,        -- may be NULL
    actor        text,
    at           timestamptz,
    grant_id     uuid,        -- the grant moved, or made (credit, positive adjustment); may be NULL
    api_key      uuid         -- the key whose request moves them; NULL: the service's own
);

-- A movement's deltas to an account (engine_deltas) and to its grant (engine_grant_deltas).
CREATE TYPE engine_balances AS (
    available     bigint,
    reserved      bigint,
    used          bigint,
    credited      bigint,
    adjusted      bigint,
    grant_expired bigint
);

CREATE TYPE engine_grant_balances AS (
    remaining bigint,
    reserved  bigint,
    consumed  bigint,
    debited   bigint,
    expired   bigint
);

-- One operation of engine_apply's batch (an array of these); engine_op_incomplete lists the
-- fields each op sets, the others are NULL. Deciding functions take it whole. src/engine/mod.rs
-- binds it by position: `EngineRequestFields` lists the types in this order (a test checks).
CREATE TYPE engine_request AS (
    op              text,
    account         uuid,
    actor           text,
    key_id          uuid,
    key_hash        bytea,
    authorized      boolean,
    request         uuid,
    amount          bigint,
    requested_ttl   integer,
    ttl             integer,
    new_id          uuid,
    job             uuid,
    reservation     uuid,
    hash            bytea,
    kind            text,
    params          jsonb,
    external_ref    text,
    note            text,
    reason          text,
    http_request_id text,
    lease_token     bigint,
    status          text,
    result          jsonb,
    error           jsonb,
    priority        integer,
    expires_at      timestamptz,
    amount_paid     bigint,
    currency        text
);

-- engine_account, engine_reservation, engine_job: a batch's own picture of the rows it decides
-- on (engine_apply keeps them, engine_record writes them). Not the tables' row types: one in a
-- signature would block every migration altering the table while an engine schema is
-- installed. engine_reservation has every column of reservations, in order (the API shows it).
CREATE TYPE engine_account AS (
    id                      uuid,
    status                  text,
    available               bigint,
    reserved                bigint,
    used                    bigint,
    credited                bigint,
    adjusted                bigint,
    grant_expired           bigint,
    active_reservations     integer,
    max_active_reservations integer,
    low_balance_threshold   bigint,
    balance_low             boolean,
    topup_threshold         bigint,
    topup_armed             boolean,
    topup_unconsumed        bigint
);

-- A valid presented key (engine_valid_key), as a batch decides against it. budget_tokens NULL:
-- no budget; budget_spent counts the period starting at budget_period_start.
CREATE TYPE engine_key AS (
    key_id              uuid,
    scope               text,
    account_id          uuid,
    last_used_at        timestamptz,
    budget_tokens       bigint,
    budget_period       text,
    budget_time_zone    text,
    budget_spent        bigint,
    budget_period_start timestamptz
);

-- [lo, hi) of an account's drawable tokens in draw order, held by grant_id (NULL: no grant):
-- engine_grant_pools builds them, engine_lock_accounts reads them, engine_draw draws from one.
CREATE TYPE engine_pool AS (
    account_id uuid,
    grant_id   uuid,
    lo         bigint,
    hi         bigint
);

CREATE TYPE engine_reservation AS (
    id                    uuid,
    account_id            uuid,
    request_id            uuid,
    amount                bigint,
    requested_ttl_seconds integer,
    state                 text,
    committed_amount      bigint,
    expires_at            timestamptz,
    job_id                uuid,
    created_at            timestamptz,
    resolved_at           timestamptz,
    draws                 jsonb,
    budget_key_id         uuid,         -- the key whose budget it counts in (NULL: none)
    budget_period_start   timestamptz   -- and the period it counts in
);

CREATE TYPE engine_job AS (
    id             uuid,
    account_id     uuid,
    request_id     uuid,
    request_hash   bytea,
    kind           text,
    params         jsonb,
    cost           bigint,
    reservation_id uuid
);

-- A change of a kiosk key's budget count (api_keys.budget_spent), written by engine_record.
-- tokens > 0: a reserve against the budget in the period starting at period_start (its
-- reservation then carries the key and period); < 0: what settled `reservation` gives back.
CREATE TYPE engine_budget_move AS (
    key_id       uuid,
    period_start timestamptz,
    reservation  uuid,
    tokens       bigint
);
