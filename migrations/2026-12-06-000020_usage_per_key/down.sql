ALTER TABLE public.ledger_entries DROP COLUMN api_key_id;
