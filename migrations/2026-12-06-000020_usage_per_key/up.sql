-- Usage per key (docs/fleet.md): a ledger entry names the API key whose
-- request wrote it (a reserve, a kiosk's commit or release, an admin's
-- credit); NULL for the service's own movements (the worker's settlement
-- of a job, the reaper's expiry, a grant's lapse, a top-up) and for
-- entries written before this column existed. The usage report counts a
-- settlement for the key that made the reservation.
--
-- Added without a default: no existing row is rewritten (the ledger is
-- never rewritten), and a build without the column keeps writing NULL.
ALTER TABLE public.ledger_entries ADD COLUMN api_key_id uuid;
