DROP INDEX audit_events_created_at_idx;
DROP INDEX webhook_deliveries_event_idx;
DROP INDEX webhook_attempts_delivery_idx;
DROP INDEX webhook_deliveries_created_at_idx;
DROP INDEX idempotency_keys_created_at_idx;
DROP INDEX events_created_at_idx;
CREATE OR REPLACE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE OR REPLACE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
DROP TABLE retention_watermarks;
DROP TABLE ledger_daily_closings;
DROP TABLE ledger_closed_days;
