-- The one JSON shape of each resource, shared by the API and the events (an event's `entry` is
-- the ledger API's entry, field for field). A grant's is engine_grant_json (25_grants.sql), a
-- job's engine_job_view (30_spend.sql). Those below take to_jsonb(row), not a row type
-- (00_types.sql says why).

-- Every time the API and the events show: RFC 3339 in UTC, six fractional digits, `Z`. The Rust
-- side writes the same (`token_billing::time::micros`).
CREATE FUNCTION engine_time(p_at timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- The same, of a time held as text in a row's JSON.
CREATE FUNCTION engine_time_of(p_at jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT engine_time((p_at #>> '{}')::timestamptz)
$$;

-- A ledger entry (the ledger API's entries, the events' `entry`).
CREATE FUNCTION engine_entry_json(p_entry jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('entry_id', p_entry->'id', 'account_id', p_entry->'account_id',
        'kind', p_entry->'kind', 'amount', p_entry->'amount',
        'available_after', p_entry->'available_after',
        'reserved_after', p_entry->'reserved_after', 'used_after', p_entry->'used_after',
        'reservation_id', p_entry->'reservation_id', 'job_id', p_entry->'job_id',
        'external_ref', p_entry->'external_ref', 'reason', p_entry->'reason',
        'actor', p_entry->'actor', 'created_at', engine_time_of(p_entry->'created_at'),
        'grant_id', p_entry->'grant_id', 'api_key_id', p_entry->'api_key_id',
        -- A top-up's credit names its rule through its grant: ledger rows never change.
        'topup_rule_id', CASE WHEN p_entry->>'kind' = 'credit' THEN
            (SELECT to_jsonb(g.topup_rule_id) FROM credit_grants g
             WHERE g.id = (p_entry->>'grant_id')::uuid) END)
$$;

-- A reservation (the reservations API, `reservation.expired`).
CREATE FUNCTION engine_reservation_json(p_reservation jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('reservation_id', p_reservation->'id',
        'account_id', p_reservation->'account_id', 'request_id', p_reservation->'request_id',
        'amount', p_reservation->'amount', 'state', p_reservation->'state',
        'committed_amount', p_reservation->'committed_amount',
        'expires_at', engine_time_of(p_reservation->'expires_at'),
        'job_id', p_reservation->'job_id',
        'created_at', engine_time_of(p_reservation->'created_at'),
        'resolved_at', engine_time_of(p_reservation->'resolved_at'),
        'draws', COALESCE(p_reservation->'draws', '[]'))
$$;

-- A credit or an adjustment as the API answers it ({"credit": …} or {"adjustment": …}): the
-- booking, its (last) ledger entry's balances and its grant (a removal has none). The object of
-- engine_external's outcome (replays too), credit.created and adjustment.created.
CREATE FUNCTION engine_external_json(p_kind text, p_row jsonb, p_entry jsonb, p_grant jsonb)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(p_kind, jsonb_build_object(p_kind || '_id', p_row->'id',
        'account_id', p_row->'account_id', 'amount', p_row->'amount',
        'external_ref', p_row->'external_ref', 'created_at', engine_time_of(p_row->'created_at'),
        'available', p_entry->'available_after', 'reserved', p_entry->'reserved_after',
        'used', p_entry->'used_after', 'ledger_entry_id', p_entry->'id',
        'grant_id', p_grant->'id', 'expires_at', engine_time_of(p_grant->'expires_at'),
        'priority', p_grant->'priority', 'amount_paid', p_grant->'amount_paid',
        'currency', p_grant->'currency')
        || CASE p_kind WHEN 'credit' THEN jsonb_build_object('note', p_row->'note',
                                              'topup_rule_id', p_grant->'topup_rule_id')
                       ELSE jsonb_build_object('reason', p_row->'reason') END)
$$;
