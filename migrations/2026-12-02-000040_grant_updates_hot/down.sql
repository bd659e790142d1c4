ALTER TABLE credit_grants RESET (fillfactor);
CREATE INDEX credit_grants_lapse_idx ON credit_grants (account_id, expires_at)
    WHERE expired_at IS NULL AND expires_at IS NOT NULL;
CREATE INDEX credit_grants_draw_idx ON credit_grants (account_id, priority, expires_at, seq)
    WHERE remaining > 0;
DROP INDEX credit_grants_drawable_idx;
ALTER TABLE credit_grants DROP CONSTRAINT credit_grants_drawable;
ALTER TABLE credit_grants DROP COLUMN drawable;
