-- The money engine's functions now live in source files
-- (src/engine/sql/*.sql), installed by the service on every start into a
-- schema named by their content hash (src/engine/install.rs). This
-- migration retires the copies the earlier migrations created in `public`
-- (money_engine, events_and_webhooks), and the trigger that wrote job
-- events: the engine's job functions write them now, next to the status
-- change. Tables and data are untouched.
--
-- Upgrading from a build whose engine lived in migrations is not a rolling
-- deploy: stop the old replicas before the first new one starts (it runs
-- this migration). From here on, builds run side by side.

DROP TRIGGER generation_jobs_finished ON generation_jobs;

DO $$
DECLARE
    retired regprocedure;
BEGIN
    FOR retired IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'engine\_%'
    LOOP
        EXECUTE 'DROP FUNCTION ' || retired;
    END LOOP;
END;
$$;

-- Every engine schema installed, and when a build last started with it
-- (old ones are dropped a week after their last start).
CREATE TABLE engine_schemas (
    name            text        PRIMARY KEY,
    installed_at    timestamptz NOT NULL DEFAULT now(),
    last_started_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE engine_schemas IS
    'distribution: local to the coordinator (the engine schemas installed; the functions are created on every node)';
