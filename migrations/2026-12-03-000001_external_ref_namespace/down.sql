DROP VIEW external_ref_collisions;
