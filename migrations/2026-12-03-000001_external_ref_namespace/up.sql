-- Credits and adjustments share one namespace of external references
-- (issue 35): an external_ref names one booking, whichever endpoint booked
-- it. The engine enforces it from now on (engine_external takes the
-- reference's lock and looks in both tables). Data written before may
-- already hold a reference booked as both a credit and an adjustment; this
-- migration only reports such collisions — it never rewrites the ledger,
-- the credits or the adjustments: finance decides what each one was.
--
-- external_ref_collisions lists every reference booked as both, with both
-- bookings; it stays, so the report can be read again at any time
-- (docs/operations.md).
CREATE VIEW external_ref_collisions AS
SELECT c.external_ref,
       c.id AS credit_id, c.account_id AS credit_account_id, c.amount AS credit_amount,
       c.created_at AS credit_created_at,
       a.id AS adjustment_id, a.account_id AS adjustment_account_id,
       a.amount AS adjustment_amount, a.created_at AS adjustment_created_at
FROM credits c
JOIN adjustments a ON a.external_ref = c.external_ref;

DO $$
DECLARE
    found bigint;
    sample text;
BEGIN
    SELECT count(*), string_agg(x.external_ref, ', ' ORDER BY x.external_ref)
    INTO found, sample
    FROM (SELECT external_ref FROM external_ref_collisions ORDER BY external_ref LIMIT 20) x;
    IF found > 0 THEN
        RAISE WARNING 'external_ref namespace: % reference(s) booked as both a credit and an adjustment (first: %); nothing was changed, see SELECT * FROM external_ref_collisions',
            (SELECT count(*) FROM external_ref_collisions), sample;
    END IF;
END;
$$;
