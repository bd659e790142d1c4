-- Credit grants: every credit and every positive adjustment becomes a
-- grant, the unit tokens are drawn from (priority 0 first, then the grant
-- that expires soonest, grants that never expire last, then creation
-- order). The account's balances stay as they are and remain the sums of
-- its grants: available = sum(remaining), reserved = sum(reserved).
--
-- This migration holds the tables and turns today's balances into grants;
-- the rules are the engine's (src/engine/sql).
CREATE TABLE credit_grants (
    -- A credit's or a positive adjustment's grant has the id of that
    -- credit or adjustment; the upgrade's grants get a random one.
    id               uuid        PRIMARY KEY,
    account_id       uuid        NOT NULL REFERENCES accounts (id),
    -- Creation order: the last key of the draw order.
    seq              bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    source           text        NOT NULL CHECK (source IN ('credit', 'adjustment', 'upgrade')),
    amount           bigint      NOT NULL CHECK (amount > 0),
    -- What can still be drawn.
    remaining        bigint      NOT NULL CHECK (remaining >= 0),
    -- What held reservations have drawn and not yet settled.
    reserved         bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    -- What commits spent.
    consumed         bigint      NOT NULL DEFAULT 0 CHECK (consumed >= 0),
    -- What negative adjustments took.
    debited          bigint      NOT NULL DEFAULT 0 CHECK (debited >= 0),
    priority         smallint    NOT NULL DEFAULT 50 CHECK (priority BETWEEN 0 AND 100),
    -- NULL: never expires (the only kind of grant there is so far).
    expires_at       timestamptz,
    external_ref     text,
    -- The upgrade's grant only: what the account's held reservations had
    -- drawn when it was made (the ledger holds their reserve entries, which
    -- name no grant). A grant's books: remaining = amount - opening_reserved
    -- + the movements of the entries naming it; reserved = opening_reserved
    -- + theirs.
    opening_reserved bigint      NOT NULL DEFAULT 0 CHECK (opening_reserved >= 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credit_grants_books CHECK (remaining + reserved + consumed + debited = amount)
);
-- The draw order of an account's grants that still hold tokens, in the
-- order the engine reads them (ascending: grants that never expire last).
CREATE INDEX credit_grants_draw_idx ON credit_grants (account_id, priority, expires_at, seq)
    WHERE remaining > 0;
-- GET /v1/accounts/{id}/grants: an account's grants in creation order.
CREATE INDEX credit_grants_account_idx ON credit_grants (account_id, seq);

COMMENT ON TABLE credit_grants IS
    'distribution: distributed by account_id, colocated with accounts';

-- A reservation's draws: [{"grant_id", "amount"}] in draw order, summing
-- to its amount.
ALTER TABLE reservations ADD COLUMN draws jsonb NOT NULL DEFAULT '[]';

-- The grant an entry moves (NULL: the entry moves no grant's tokens, or
-- was written before grants existed).
ALTER TABLE ledger_entries ADD COLUMN grant_id uuid REFERENCES credit_grants (id);
CREATE INDEX ledger_entries_grant_idx ON ledger_entries (grant_id) WHERE grant_id IS NOT NULL;

-- The upgrade: each account holding tokens gets one grant that never
-- expires, priority 50, holding its available tokens and what its held
-- reservations drew; each held reservation draws all of its amount from
-- it. No ledger entry is written: the balances do not move.
WITH made AS (
    INSERT INTO credit_grants (id, account_id, source, amount, remaining, reserved, priority,
        opening_reserved)
    SELECT gen_random_uuid(), a.id, 'upgrade', a.available + a.reserved, a.available, a.reserved,
           50, a.reserved
    FROM accounts a WHERE a.available + a.reserved > 0
    ORDER BY a.id
    RETURNING id, account_id
)
UPDATE reservations r
SET draws = jsonb_build_array(jsonb_build_object('grant_id', m.id, 'amount', r.amount))
FROM made m
WHERE m.account_id = r.account_id AND r.state = 'held';
