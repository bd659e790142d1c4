-- The books' identity, enforced on every write of an account row, not only
-- audited: credited + adjusted − grant_expired = available + reserved +
-- used. An UPDATE or INSERT that would break it fails with SQLSTATE 23514
-- (check_violation) naming accounts_books_identity, and its transaction
-- (the whole engine batch) rolls back: a bug in a movement cannot commit.
--
-- The rule joins the account's row rules (accounts_rules, the function its
-- one CHECK calls with the whole row, 2026-12-04-000010): replacing the
-- function changes what the CHECK enforces from now on. Rows already
-- stored are checked first, here: a database whose books do not hold
-- stops at this migration, naming the first account, rather than refusing
-- that account's next movement.

DO $$
DECLARE
    broken uuid;
BEGIN
    SELECT a.id INTO broken FROM public.accounts a
    WHERE a.credited + a.adjusted - a.grant_expired <> a.available + a.reserved + a.used
    ORDER BY a.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'account % breaks the books'' identity (credited + adjusted - grant_expired = available + reserved + used): reconcile it before this migration', broken
            USING ERRCODE = 'check_violation';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION public.accounts_rules(r public.accounts) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text := CASE
        WHEN NOT (LEAST(r.available, r.reserved, r.used, r.credited, r.active_reservations,
                        r.max_active_reservations, r.low_balance_threshold, r.grant_expired,
                        r.topup_threshold) >= 0) THEN 'accounts_counts_nonnegative'
        WHEN NOT (char_length(r.name) BETWEEN 1 AND 200) THEN 'accounts_name_check'
        WHEN NOT (r.status IN ('active', 'suspended')) THEN 'accounts_status_check'
        WHEN NOT (r.credited + r.adjusted - r.grant_expired = r.available + r.reserved + r.used)
            THEN 'accounts_books_identity'
    END;
BEGIN
    RETURN broken IS NULL OR public.row_rule_broken('accounts', broken);
END;
$$;
