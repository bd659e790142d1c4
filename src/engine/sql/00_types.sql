-- The engine's typed contract: the rows its functions take and keep.
--
-- A movement is what engine_record (the one write path) applies to an
-- account and writes to the ledger; a request is one operation of a batch
-- (engine_apply, the one entry point). Every field of a movement is set; a
-- field that may be empty says so below. Callers never pass "missing
-- means all".
--
-- Plans. The functions a request or a job's worker calls run with
-- `SET plan_cache_mode = force_generic_plan`: each statement is planned once
-- per connection (and again after its tables' statistics change), not on
-- every call. Left to choose, PostgreSQL planned the batch statements anew
-- on every call, and planning cost three times their execution (measured
-- with pg_stat_statements; BENCHMARKS.md). A generic plan does not know the
-- batch's keys, so every look-up by a primary key is written as `= ANY
-- (ARRAY(...))` of the batch's keys, which is found by index whatever the
-- plan; a look-up by a two-column key (an account's request_id) is a
-- LATERAL subquery with LIMIT 1, one index probe per item (`= ANY` of the
-- second column alone walks the whole index). Nor does a statement join
-- two of the batch's own sets (CTEs) on their keys: with no idea of their
-- sizes the planner joins them by nested loop, quadratic in the batch. The
-- reaper's and the claimer's scans (a LIMIT over a status) keep the default:
-- they run a few times a minute, and their plans depend on the limit.

CREATE TYPE engine_movement AS (
    account      uuid,
    kind         text,        -- credit, adjustment, reserve, commit, release, expire,
                              -- grant_expire
    amount       bigint,      -- signed only for an adjustment
    active_delta integer,     -- +1 on a reserve, -1 on the last entry of a settlement
    reservation  uuid,        -- may be NULL (credit, adjustment, a grant's lapse); a
                              -- grant_expire with one takes the reservation's rest
    job          uuid,        -- may be NULL
    external_ref text,        -- may be NULL
    reason       text,        -- may be NULL
    actor        text,
    at           timestamptz,
    grant_id     uuid,        -- the grant whose tokens move; NULL when none does (a
                              -- credit or positive adjustment names the grant it made)
    api_key      uuid         -- the key whose request moves them; NULL: the service's own
);

-- What a movement does to an account's balances (engine_deltas) and to
-- the grant it names (engine_grant_deltas).
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

-- One operation as the service sends it: engine_apply's batch is an array
-- of these (element i is operation i; engine_op_incomplete lists the
-- fields each kind of operation sets, the others NULL). It crosses as one
-- array parameter, bound by src/engine/mod.rs (`EngineRequest`) by position:
-- its `EngineRequestFields` lists these fields' types in this order (a
-- test checks that every field arrives under its name). Every function
-- that decides an operation takes it whole: its fields are written here
-- once.
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

-- A batch's own picture of the rows its operations decide on and write:
-- an account as the batch leaves it, a reservation and a job as they are
-- to be written (engine_apply keeps them; engine_record writes them). The
-- engine's own types, not the tables' row types: a table's row type in a
-- function's signature would stop every migration that alters the table
-- while a build's engine schema is installed. engine_reservation has every
-- column of reservations, in its order (the API shows it whole).
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
    max_active_reservations integer
);

-- A presented key that is valid (engine_valid_key), as a batch's
-- operations are decided against it: who it is, where it may spend, when
-- it was last used, and its budget (NULL: none) with the count of the
-- period starting at budget_period_start.
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

-- One interval of an account's drawable tokens in draw order
-- (engine_grant_pools): [lo, hi) held by the grant `grant_id` (NULL: no
-- grant). A batch reads its spending accounts' intervals once
-- (engine_lock_accounts) and draws from them (engine_draws).
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

-- A change of a kiosk key's budget count (api_keys.budget_spent), written
-- by engine_record with the movements: `tokens` > 0, a reserve made
-- against the budget in the period starting at `period_start` (its
-- reservation then carries the key and the period); < 0, what a settled
-- reservation `reservation` gives back to the period it counted in.
CREATE TYPE engine_budget_move AS (
    key_id       uuid,
    period_start timestamptz,
    reservation  uuid,
    tokens       bigint
);
