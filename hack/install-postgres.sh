#!/usr/bin/env bash
# Install, start and prepare the PostgreSQL server that the history store's tests and the
# local cluster's Muster pods use.
#
# Safe to run again: every step checks before it acts, and a running server is reloaded
# (pg_hba.conf) or restarted (listen_addresses) only when this script changed its
# configuration. Runs as root (CI and the dev machines are root; no sudo there). Creates role
# `muster` (password `muster`) owning database `muster_test` (the tests', each in a schema of
# its own) and database `muster` (the in-cluster Muster's history), reachable with password
# authentication at 127.0.0.1:5432 and, from pods of the local cluster (source addresses in
# the pod CIDR, role `muster` only), at the host's primary IPv4 address: the one of the
# default route's interface, which is where pods reach the host.
set -euo pipefail

PG_ROLE="${MUSTER_PG_ROLE:-muster}"
PG_PASSWORD="${MUSTER_PG_PASSWORD:-muster}"
PG_DATABASE="${MUSTER_PG_DATABASE:-muster_test}"
PG_CLUSTER_DATABASE="${MUSTER_PG_CLUSTER_DATABASE:-muster}"
POD_CIDR="${MUSTER_POD_CIDR:-10.244.0.0/16}"

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

# Where pods reach the host: the address of the default route's interface. Pods' packets
# arrive from their own addresses (delivered locally, never masqueraded), so pg_hba.conf
# allows the pod CIDR.
primary_ipv4() {
  local dev
  dev="$(ip -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')"
  [[ -n "${dev}" ]] || return 0
  ip -4 -o addr show dev "${dev}" scope global | awk '{split($4, a, "/"); print a[1]; exit}'
}

CONF_DIR="/etc/postgresql/${PG_MAJOR}/main"
HOST_IP="$(primary_ipv4)"
listen="localhost"
if [[ -n "${HOST_IP}" ]]; then
  listen="localhost,${HOST_IP}"
else
  echo "install-postgres.sh: no default route; listening on localhost only (pods cannot reach it)" >&2
fi
# Written only when it differs: the file's content decides whether to restart.
restart=0
reload=0
listen_conf="${CONF_DIR}/conf.d/muster.conf"
want_conf="# hack/install-postgres.sh: the host's primary address too, for the local cluster's pods.
listen_addresses = '${listen}'"
if [[ ! -f "${listen_conf}" ]] || [[ "$(cat "${listen_conf}")" != "${want_conf}" ]]; then
  mkdir -p "${CONF_DIR}/conf.d"
  printf '%s\n' "${want_conf}" > "${listen_conf}"
  restart=1
fi
# The role alone, with a password, from the pod CIDR alone. The role may reach every
# database it can reach from 127.0.0.1 already; pods get nothing the host's users lack.
hba_line="host    all             ${PG_ROLE}          ${POD_CIDR}           scram-sha-256"
if ! grep -qxF "${hba_line}" "${CONF_DIR}/pg_hba.conf"; then
  printf '%s\n%s\n' "# hack/install-postgres.sh: pods of the local cluster (pod CIDR)" "${hba_line}" \
    >> "${CONF_DIR}/pg_hba.conf"
  reload=1
fi

if ! pg_lsclusters -h | awk -v v="${PG_MAJOR}" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
  # A container restarted without cleanup can leave a stale pid file that blocks the start.
  pidfile="/var/lib/postgresql/${PG_MAJOR}/main/postmaster.pid"
  if [[ -f "${pidfile}" ]] && ! kill -0 "$(head -n 1 "${pidfile}")" 2>/dev/null; then
    rm -f "${pidfile}"
  fi
  pg_ctlcluster "${PG_MAJOR}" main start
elif [[ "${restart}" -eq 1 ]]; then
  pg_ctlcluster "${PG_MAJOR}" main restart
elif [[ "${reload}" -eq 1 ]]; then
  pg_ctlcluster "${PG_MAJOR}" main reload
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

for database in "${PG_DATABASE}" "${PG_CLUSTER_DATABASE}"; do
  if [[ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '${database}'")" != "1" ]]; then
    psql_admin -c "CREATE DATABASE ${database} OWNER ${PG_ROLE}"
  fi
done

echo "PostgreSQL ${PG_MAJOR} running; postgresql+psycopg://${PG_ROLE}:***@127.0.0.1:5432/${PG_DATABASE}"
if [[ -n "${HOST_IP}" ]]; then
  echo "from the local cluster's pods (${POD_CIDR}): postgresql+psycopg://${PG_ROLE}:***@${HOST_IP}:5432/${PG_CLUSTER_DATABASE}"
fi
