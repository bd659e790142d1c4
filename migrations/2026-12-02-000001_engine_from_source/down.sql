-- Not reversible by a migration: the engine this migration retired lived in
-- the migrations before it, and copying it back here would make a fourth
-- text of it. To go back to such a build, restore the database from a
-- backup taken before the upgrade (docs/backup.md).
DO $$
BEGIN
    RAISE EXCEPTION 'migration engine_from_source cannot be reverted: restore a backup taken before it';
END;
$$;
