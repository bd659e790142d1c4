-- The outcome of the last successful reaper pass, so every replica can
-- export it (only the replica holding the advisory lock runs a pass).
CREATE TABLE reaper_status (
    singleton            boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    last_success_at      timestamptz NOT NULL,
    invariant_violations integer     NOT NULL CHECK (invariant_violations >= 0)
);
