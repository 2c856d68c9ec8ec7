#!/bin/sh
# Entry point of fractune-postgres (docker/postgres/Dockerfile): the part of the official postgres image's entry
# point that docker/compose.yaml relies on. On the first start (an empty $PGDATA) it creates the cluster with the
# superuser $POSTGRES_USER (default postgres) and its password $POSTGRES_PASSWORD (required), password
# (scram-sha-256) logins from the network, and the database $POSTGRES_DB (default: the user's name). Then it
# runs its command (postgres) as the user postgres, listening on every interface of the container.
# The password is never printed and never put in a file of the image.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
export PGDATA

if [ "$(id -u)" = 0 ]; then
  install -d -o postgres -g postgres -m 0700 "$PGDATA"
  chown -R postgres:postgres "$PGDATA"
  install -d -o postgres -g postgres -m 2775 /var/run/postgresql
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD is required to create the database cluster" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  trap 'rm -f "$pwfile"' EXIT
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
         --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  trap - EXIT
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  # the database, created through the Unix socket only, before the server listens on the network
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --no-psqlrc --username="$POSTGRES_USER" --dbname=postgres \
         -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: created the cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi

if [ "${1:-}" = postgres ]; then
  shift
  exec postgres -c listen_addresses='*' "$@"
fi
exec "$@"
