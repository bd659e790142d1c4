-- Automatic top-ups (docs/topups.md): rules per account that credit it,
-- or ask the customer's billing to, when its balance falls below a
-- threshold or once per period. The rules are the engine's
-- (src/engine/sql/80_topups.sql); this migration holds the tables.
CREATE TABLE topup_rules (
    id                    uuid        PRIMARY KEY,
    account_id            uuid        NOT NULL REFERENCES accounts (id),
    -- threshold: fires when available (plus the tokens of the rule's open
    -- request) falls below threshold_tokens, once per crossing;
    -- schedule: fires once per period.
    trigger               text        NOT NULL CHECK (trigger IN ('threshold', 'schedule')),
    threshold_tokens      bigint      CHECK (threshold_tokens > 0),
    period                text        CHECK (period IN ('daily', 'weekly', 'monthly')),
    -- weekly: ISO day of the week (1 = Monday … 7); monthly: day of the
    -- month (1 … 28); daily: none.
    anchor_day            smallint,
    -- The periods' time zone (a name PostgreSQL knows; UTC by default).
    time_zone             text        NOT NULL DEFAULT 'UTC',
    -- fixed: add `tokens`; target: bring available up to `target_tokens`.
    method                text        NOT NULL CHECK (method IN ('fixed', 'target')),
    tokens                bigint      CHECK (tokens > 0),
    target_tokens         bigint      CHECK (target_tokens > 0),
    -- grant: the service credits at once; request: the service asks
    -- (topup.requested) and the customer's billing credits back with the
    -- request's id as external_ref.
    mode                  text        NOT NULL CHECK (mode IN ('grant', 'request')),
    request_ttl_seconds   integer     CHECK (request_ttl_seconds BETWEEN 60 AND 2592000),
    -- The grant's priority and expiry.
    priority              smallint    NOT NULL DEFAULT 50 CHECK (priority BETWEEN 0 AND 100),
    expires_after_seconds bigint      CHECK (expires_after_seconds BETWEEN 60 AND 315360000),
    expires_at_period_end boolean     NOT NULL DEFAULT false,
    max_tokens_per_day    bigint      CHECK (max_tokens_per_day > 0),
    max_tokens_per_month  bigint      CHECK (max_tokens_per_month > 0),
    enabled               boolean     NOT NULL DEFAULT true,
    -- A schedule rule: the end of the last period it fired for (it is
    -- looked at again from then on; NULL: at the next pass).
    next_period_at        timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- A deleted rule is kept (grants and entries name it) and never fires.
    deleted_at            timestamptz,
    CONSTRAINT topup_rules_trigger_fields CHECK (
        (trigger = 'threshold') = (threshold_tokens IS NOT NULL)
        AND (trigger = 'schedule') = (period IS NOT NULL)),
    CONSTRAINT topup_rules_anchor CHECK (
        CASE period WHEN 'weekly' THEN anchor_day BETWEEN 1 AND 7
                    WHEN 'monthly' THEN anchor_day BETWEEN 1 AND 28
                    ELSE anchor_day IS NULL END),
    CONSTRAINT topup_rules_method_fields CHECK (
        (method = 'fixed') = (tokens IS NOT NULL)
        AND (method = 'target') = (target_tokens IS NOT NULL)),
    CONSTRAINT topup_rules_mode_fields CHECK ((mode = 'request') = (request_ttl_seconds IS NOT NULL)),
    CONSTRAINT topup_rules_expiry CHECK (
        NOT (expires_at_period_end AND (trigger <> 'schedule' OR expires_after_seconds IS NOT NULL)))
);
-- At most one live threshold rule per account: its state lives on the
-- account row (accounts.topup_threshold, topup_armed), which every spend
-- reads anyway.
CREATE UNIQUE INDEX topup_rules_one_threshold ON topup_rules (account_id)
    WHERE trigger = 'threshold' AND deleted_at IS NULL;
CREATE INDEX topup_rules_account_idx ON topup_rules (account_id, created_at);
CREATE INDEX topup_rules_schedule_idx ON topup_rules (next_period_at NULLS FIRST)
    WHERE trigger = 'schedule' AND enabled AND deleted_at IS NULL;
COMMENT ON TABLE topup_rules IS
    'distribution: distributed by account_id, colocated with accounts';

-- Every firing of a rule: a grant made, a request opened, a cap reached,
-- or (a schedule's period) nothing to do.
CREATE TABLE topup_firings (
    id           uuid        PRIMARY KEY,
    rule_id      uuid        NOT NULL REFERENCES topup_rules (id),
    account_id   uuid        NOT NULL REFERENCES accounts (id),
    outcome      text        NOT NULL CHECK (outcome IN ('granted', 'requested', 'cap_reached', 'skipped')),
    -- A schedule's firing: the start of the period it is for (one per
    -- period, whichever replica or restart fires it).
    period_start timestamptz,
    -- cap_reached: the cap's period ('day:2026-12-03', 'month:2026-12'),
    -- reported once.
    cap_period   text,
    tokens       bigint      NOT NULL CHECK (tokens >= 0),
    -- A request's state (request mode only): open until the customer's
    -- credit lands (fulfilled) or its time runs out (expired).
    state        text        CHECK (state IN ('open', 'fulfilled', 'expired')),
    expires_at   timestamptz,
    -- The credit that answered it (granted: the service's own).
    credit_id    uuid,
    created_at   timestamptz NOT NULL,
    resolved_at  timestamptz,
    CONSTRAINT topup_firings_request CHECK ((outcome = 'requested') = (state IS NOT NULL)
                                           AND (state IS NULL) = (expires_at IS NULL)),
    CONSTRAINT topup_firings_cap CHECK ((outcome = 'cap_reached') = (cap_period IS NOT NULL))
);
CREATE UNIQUE INDEX topup_firings_period ON topup_firings (rule_id, period_start)
    WHERE period_start IS NOT NULL;
CREATE UNIQUE INDEX topup_firings_cap_once ON topup_firings (rule_id, cap_period)
    WHERE cap_period IS NOT NULL;
CREATE UNIQUE INDEX topup_firings_one_open ON topup_firings (rule_id) WHERE state = 'open';
CREATE INDEX topup_firings_rule_idx ON topup_firings (rule_id, created_at);
CREATE INDEX topup_firings_open_expiry_idx ON topup_firings (expires_at) WHERE state = 'open';
COMMENT ON TABLE topup_firings IS
    'distribution: distributed by account_id, colocated with accounts';

-- The account's threshold rule, where every spend reads it: the line
-- `available` must stay at or above (the rule's threshold less the tokens
-- of its open request; 0: no live threshold rule) and whether the rule is
-- armed (it fires when available goes below the line while armed, and
-- re-arms when available is back at or above it).
ALTER TABLE accounts
    ADD COLUMN topup_threshold bigint NOT NULL DEFAULT 0 CHECK (topup_threshold >= 0),
    ADD COLUMN topup_armed boolean NOT NULL DEFAULT false;

-- A top-up's grant names its rule (its credit entry names the grant: the
-- ledger's rows and columns stay as they are).
ALTER TABLE credit_grants ADD COLUMN topup_rule_id uuid REFERENCES topup_rules (id);
CREATE INDEX credit_grants_topup_rule_idx ON credit_grants (topup_rule_id)
    WHERE topup_rule_id IS NOT NULL;

-- The top-up events (src/engine/sql/80_topups.sql).
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN (
    'account.balance_low', 'account.balance_recovered', 'account.balance_depleted',
    'credit.created', 'adjustment.created', 'reservation.expired',
    'grant.expired', 'grant.expiring',
    'topup.granted', 'topup.requested', 'topup.request_expired', 'topup.cap_reached',
    'job.succeeded', 'job.failed', 'invariant.violated', 'endpoint.disabled')) NOT VALID;
ALTER TABLE events VALIDATE CONSTRAINT events_type_check;
