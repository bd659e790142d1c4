#!/bin/sh
# The service's own PostgreSQL role: LOGIN, and the owner of its database
# (so its migrations create the tables, functions and the engine's schema
# there), nothing more: not a superuser, no CREATEDB, CREATEROLE,
# REPLICATION or BYPASSRLS. PostgreSQL keeps superuser_reserved_connections
# (3) for superusers only, so when the pools take every other connection an
# operator's psql as postgres still gets in (docs/operations.md, "The
# service's database role").
#
# docker compose runs it once, on a fresh data directory, from
# /docker-entrypoint-initdb.d/ (as POSTGRES_USER, on POSTGRES_DB, which
# exists). Elsewhere, with psql's PG* variables pointing at the server:
#   POSTGRES_USER=postgres POSTGRES_DB=token_billing SERVICE_DB_USER=billing \
#     SERVICE_DB_PASSWORD=… postgres/service-role.sh
set -eu
psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v role="${SERVICE_DB_USER:-billing}" -v password="$SERVICE_DB_PASSWORD" \
    -v database="$POSTGRES_DB" <<'SQL'
CREATE ROLE :"role" LOGIN PASSWORD :'password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER DATABASE :"database" OWNER TO :"role";
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
SQL
