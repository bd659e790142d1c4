DROP TABLE audit_events;
DROP FUNCTION audit_events_append_only();
ALTER TABLE api_keys DROP COLUMN last_used_at, DROP COLUMN expires_at;
