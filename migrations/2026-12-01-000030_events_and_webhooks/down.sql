DROP FUNCTION webhook_relay_step(integer);
DROP TABLE webhook_relay;
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
DROP FUNCTION events_feed(bigint, bigint, integer, text, uuid);
DROP TRIGGER generation_jobs_finished ON generation_jobs;
DROP FUNCTION engine_job_finished();
DROP FUNCTION engine_low_balance(accounts, jsonb, timestamptz);
DROP TABLE events;
DROP FUNCTION events_append_only();
-- engine_move without events: the money engine migration's version.
CREATE OR REPLACE FUNCTION engine_move(
    p_account uuid, p_kind text, p_amount bigint, p_active_delta integer,
    p_reservation uuid, p_job uuid, p_external_ref text, p_reason text, p_actor text,
    p_at timestamptz
) RETURNS ledger_entries
LANGUAGE plpgsql AS $$
DECLARE
    d_available bigint;
    d_reserved bigint;
    d_used bigint;
    after accounts;
    entry ledger_entries;
BEGIN
    CASE p_kind
        WHEN 'credit', 'adjustment' THEN
            d_available := p_amount; d_reserved := 0; d_used := 0;
        WHEN 'reserve' THEN
            d_available := -p_amount; d_reserved := p_amount; d_used := 0;
        WHEN 'commit' THEN
            d_available := 0; d_reserved := -p_amount; d_used := p_amount;
        WHEN 'release', 'expire' THEN
            d_available := p_amount; d_reserved := -p_amount; d_used := 0;
    END CASE;
    UPDATE accounts
    SET available = available + d_available,
        reserved = reserved + d_reserved,
        used = used + d_used,
        credited = credited + CASE WHEN p_kind = 'credit' THEN p_amount ELSE 0 END,
        adjusted = adjusted + CASE WHEN p_kind = 'adjustment' THEN p_amount ELSE 0 END,
        active_reservations = active_reservations + p_active_delta,
        version = version + 1,
        updated_at = now()
    WHERE id = p_account
    RETURNING * INTO after;
    INSERT INTO ledger_entries (account_id, kind, amount, available_after, reserved_after,
        used_after, reservation_id, job_id, external_ref, reason, actor, created_at)
    VALUES (p_account, p_kind, p_amount, after.available, after.reserved, after.used,
        p_reservation, p_job, p_external_ref, p_reason, p_actor, p_at)
    RETURNING * INTO entry;
    RETURN entry;
END;
$$;
DROP FUNCTION engine_event_account(accounts);
DROP FUNCTION engine_emit_event(text, uuid, jsonb, timestamptz);
ALTER TABLE accounts DROP COLUMN balance_low, DROP COLUMN low_balance_threshold;
