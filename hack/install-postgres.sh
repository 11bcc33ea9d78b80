#!/usr/bin/env bash
# Install, start and prepare the PostgreSQL server that the history store's tests use.
#
# Safe to run again: every step checks before it acts. Runs as root (CI and the dev machines
# are root; no sudo there). Creates role `muster` (password `muster`) owning database
# `muster_test`, reachable at 127.0.0.1:5432 with password authentication.
set -euo pipefail

PG_ROLE="${MUSTER_PG_ROLE:-muster}"
PG_PASSWORD="${MUSTER_PG_PASSWORD:-muster}"
PG_DATABASE="${MUSTER_PG_DATABASE:-muster_test}"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "install-postgres.sh: must run as root (apt-get and pg_ctlcluster need it)" >&2
  exit 1
fi

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # An image without package lists cannot install anything: refresh them only when needed,
  # and once more if the lists are there but stale (the install then fails to fetch).
  if ! apt-cache show postgresql >/dev/null 2>&1; then
    apt-get update
  fi
  if ! apt-get install -y --no-install-recommends postgresql postgresql-contrib; then
    apt-get update
    apt-get install -y --no-install-recommends postgresql postgresql-contrib
  fi
fi

# The newest installed major version wins; Debian 12 ships 15, later releases newer ones.
PG_MAJOR="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if [[ -z "${PG_MAJOR}" ]]; then
  echo "install-postgres.sh: no PostgreSQL server under /usr/lib/postgresql" >&2
  exit 1
fi

if ! pg_lsclusters -h | awk -v v="${PG_MAJOR}" '$1 == v && $2 == "main"' | grep -q .; then
  pg_createcluster "${PG_MAJOR}" main
fi

if ! pg_lsclusters -h | awk -v v="${PG_MAJOR}" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
  # A container restarted without cleanup can leave a stale pid file that blocks the start.
  pidfile="/var/lib/postgresql/${PG_MAJOR}/main/postmaster.pid"
  if [[ -f "${pidfile}" ]] && ! kill -0 "$(head -n 1 "${pidfile}")" 2>/dev/null; then
    rm -f "${pidfile}"
  fi
  pg_ctlcluster "${PG_MAJOR}" main start
fi

psql_admin() {
  runuser -u postgres -- psql -v ON_ERROR_STOP=1 -qtAX "$@"
}

# Wait for the server to accept connections (start returns before recovery is always done).
for _ in $(seq 1 50); do
  if psql_admin -c 'SELECT 1' >/dev/null 2>&1; then
    break
  fi
  sleep 0.2
done

if [[ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '${PG_ROLE}'")" != "1" ]]; then
  psql_admin -c "CREATE ROLE ${PG_ROLE} LOGIN PASSWORD '${PG_PASSWORD}'"
else
  psql_admin -c "ALTER ROLE ${PG_ROLE} LOGIN PASSWORD '${PG_PASSWORD}'"
fi
# Tests isolate themselves in databases of their own, so the role may create them.
psql_admin -c "ALTER ROLE ${PG_ROLE} CREATEDB"

if [[ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '${PG_DATABASE}'")" != "1" ]]; then
  psql_admin -c "CREATE DATABASE ${PG_DATABASE} OWNER ${PG_ROLE}"
fi

echo "PostgreSQL ${PG_MAJOR} running; postgresql+psycopg://${PG_ROLE}:***@127.0.0.1:5432/${PG_DATABASE}"
