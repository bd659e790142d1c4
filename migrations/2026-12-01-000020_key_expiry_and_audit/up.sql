-- Keys that expire, and when each key was last used (at most one write a
-- minute per key: see api_keys.rs `touch_last_used` and
-- engine_authorize_spend).
ALTER TABLE api_keys
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN last_used_at timestamptz;

-- Who changed what: one row per administrative change (account create and
-- patch, key create and revoke, credit, adjustment), written in the same
-- transaction as the change itself. Credits and adjustments are written by
-- the money engine (engine_credit, engine_adjust), the others by the
-- service's domain functions.
CREATE TABLE audit_events (
    -- Monotonic id: the pagination cursor.
    id         bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    -- The API key id of the caller, or the bootstrap admin's marker.
    actor      text        NOT NULL,
    -- e.g. account.created, account.updated, api_key.created,
    -- api_key.revoked, credit.created, adjustment.created.
    action     text        NOT NULL,
    -- What changed: account:<id> or api_key:<id>.
    target     text        NOT NULL,
    -- The changed fields before and after the change (NULL when the object
    -- did not exist before).
    before     jsonb,
    after      jsonb,
    -- The HTTP request's X-Request-Id, when the change came from one.
    request_id text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX audit_events_target_idx ON audit_events (target, id);

-- Append-only, like the ledger: no UPDATE, DELETE or TRUNCATE, from any client.
CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_events_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
