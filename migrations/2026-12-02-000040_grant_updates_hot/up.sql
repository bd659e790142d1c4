-- Grant updates without index writes. Every movement updates the grants it
-- names (remaining, reserved, …), and the draw-order index was partial on
-- `remaining > 0`: a column of its predicate changed on every update, so
-- no update was HOT and each wrote a new entry into every index of the
-- table (on a hot account, every batch, into the same few keys). The
-- predicate is now `drawable`, a column that follows `remaining > 0` (a
-- CHECK keeps it so) and changes only when a grant empties or fills again;
-- the other updates touch no indexed column and, with room left on the
-- page (fillfactor), stay HOT. The lapse's look-up by account uses the
-- same index (its grants that still hold tokens), so its own index goes.
ALTER TABLE credit_grants ADD COLUMN drawable boolean NOT NULL DEFAULT false;
UPDATE credit_grants SET drawable = remaining > 0 WHERE remaining > 0;
ALTER TABLE credit_grants ADD CONSTRAINT credit_grants_drawable CHECK (drawable = (remaining > 0));
CREATE INDEX credit_grants_drawable_idx ON credit_grants (account_id, priority, expires_at, seq)
    WHERE drawable;
DROP INDEX credit_grants_draw_idx;
DROP INDEX credit_grants_lapse_idx;
ALTER TABLE credit_grants SET (fillfactor = 70);
