// @generated automatically by Diesel CLI.

diesel::table! {
    accounts (id) {
        id -> Uuid,
        name -> Text,
        status -> Text,
        available -> Int8,
        reserved -> Int8,
        used -> Int8,
        credited -> Int8,
        adjusted -> Int8,
        active_reservations -> Int4,
        max_active_reservations -> Int4,
        version -> Int8,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        low_balance_threshold -> Int8,
        balance_low -> Bool,
        grant_expired -> Int8,
    }
}

diesel::table! {
    adjustments (id) {
        id -> Uuid,
        account_id -> Uuid,
        amount -> Int8,
        reason -> Text,
        external_ref -> Text,
        actor -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    api_keys (id) {
        id -> Uuid,
        secret_hash -> Bytea,
        scope -> Text,
        account_id -> Nullable<Uuid>,
        label -> Text,
        created_at -> Timestamptz,
        revoked_at -> Nullable<Timestamptz>,
        expires_at -> Nullable<Timestamptz>,
        last_used_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    audit_events (id) {
        id -> Int8,
        event_id -> Uuid,
        actor -> Text,
        action -> Text,
        target -> Text,
        before -> Nullable<Jsonb>,
        after -> Nullable<Jsonb>,
        request_id -> Nullable<Text>,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    credits (id) {
        id -> Uuid,
        account_id -> Uuid,
        amount -> Int8,
        external_ref -> Text,
        note -> Nullable<Text>,
        actor -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    generation_jobs (id) {
        id -> Uuid,
        account_id -> Uuid,
        request_id -> Uuid,
        request_hash -> Bytea,
        kind -> Text,
        params -> Jsonb,
        cost -> Int8,
        status -> Text,
        reservation_id -> Uuid,
        lease_owner -> Nullable<Text>,
        lease_token -> Int8,
        lease_expires_at -> Nullable<Timestamptz>,
        attempts -> Int4,
        next_attempt_at -> Timestamptz,
        provider_job_id -> Nullable<Text>,
        result -> Nullable<Jsonb>,
        error -> Nullable<Jsonb>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        finished_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    ledger_entries (id) {
        id -> Int8,
        account_id -> Uuid,
        kind -> Text,
        amount -> Int8,
        available_after -> Int8,
        reserved_after -> Int8,
        used_after -> Int8,
        reservation_id -> Nullable<Uuid>,
        job_id -> Nullable<Uuid>,
        external_ref -> Nullable<Text>,
        reason -> Nullable<Text>,
        actor -> Text,
        created_at -> Timestamptz,
        grant_id -> Nullable<Uuid>,
        api_key_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    reaper_status (singleton) {
        singleton -> Bool,
        last_success_at -> Timestamptz,
        invariant_violations -> Int4,
    }
}

diesel::table! {
    reservations (id) {
        id -> Uuid,
        account_id -> Uuid,
        request_id -> Uuid,
        amount -> Int8,
        requested_ttl_seconds -> Nullable<Int4>,
        state -> Text,
        committed_amount -> Int8,
        expires_at -> Timestamptz,
        job_id -> Nullable<Uuid>,
        created_at -> Timestamptz,
        resolved_at -> Nullable<Timestamptz>,
        draws -> Jsonb,
    }
}

diesel::table! {
    credit_grants (id) {
        id -> Uuid,
        account_id -> Uuid,
        seq -> Int8,
        source -> Text,
        amount -> Int8,
        remaining -> Int8,
        reserved -> Int8,
        consumed -> Int8,
        debited -> Int8,
        priority -> Int2,
        expires_at -> Nullable<Timestamptz>,
        external_ref -> Nullable<Text>,
        opening_reserved -> Int8,
        created_at -> Timestamptz,
        expired -> Int8,
        expired_at -> Nullable<Timestamptz>,
        expiring_notified_at -> Nullable<Timestamptz>,
        drawable -> Bool,
    }
}

diesel::joinable!(adjustments -> accounts (account_id));
diesel::joinable!(api_keys -> accounts (account_id));
diesel::joinable!(credits -> accounts (account_id));
diesel::joinable!(credit_grants -> accounts (account_id));
diesel::joinable!(generation_jobs -> accounts (account_id));
diesel::joinable!(generation_jobs -> reservations (reservation_id));
diesel::joinable!(ledger_entries -> accounts (account_id));
diesel::joinable!(ledger_entries -> reservations (reservation_id));
diesel::joinable!(reservations -> accounts (account_id));

diesel::allow_tables_to_appear_in_same_query!(
    audit_events,
    accounts,
    adjustments,
    api_keys,
    credits,
    credit_grants,
    generation_jobs,
    ledger_entries,
    reaper_status,
    reservations,
);
