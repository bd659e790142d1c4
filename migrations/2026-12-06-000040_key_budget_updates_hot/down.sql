ALTER TABLE public.api_keys RESET (fillfactor);
