#!/usr/bin/env bash
# A PostgreSQL server for the tests (tests/integration/test_postgres_storage.py,
# test_ray_job_submit.py), idempotent: installs the Debian `postgresql` package if it is missing,
# starts its cluster (listening on localhost only, the Debian default), creates the role
# `optimizer` (password `optimizer`) and the database `optimizer_test` it owns, checks a password
# login over TCP, and prints the SQLAlchemy URL on its last line (the only line on stdout;
# progress goes to stderr). Needs root, or passwordless sudo.
set -euo pipefail

ROLE=optimizer
PASSWORD=optimizer
DATABASE=optimizer_test
HOST=127.0.0.1

say() { echo "postgres_for_tests: $*" >&2; }

if [[ $EUID -eq 0 ]]; then
    AS_ROOT=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    AS_ROOT=(sudo -n)
else
    say "needs root (or passwordless sudo) to install and start PostgreSQL"
    exit 1
fi

# 1. The server package.
if ! command -v pg_ctlcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    say "installing the Debian postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    install=("${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql)
    if ! "${install[@]}" >&2; then
        say "install failed; running apt-get update and trying again"
        "${AS_ROOT[@]}" apt-get update -q >&2
        "${install[@]}" >&2
    fi
fi

# 2. Its cluster (the package creates `<version> main`; create it if a container image skipped that).
VERSION=$(ls /usr/lib/postgresql/ | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" {found=1} END {exit !found}'; then
    say "creating cluster $VERSION/main"
    "${AS_ROOT[@]}" pg_createcluster "$VERSION" main >&2
fi
read -r _ _ PORT STATUS _ < <(pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main"')
if [[ $STATUS != online* ]]; then
    say "starting cluster $VERSION/main on port $PORT"
    "${AS_ROOT[@]}" pg_ctlcluster "$VERSION" main start >&2
fi
for _ in $(seq 1 60); do
    pg_isready -q -h "$HOST" -p "$PORT" && break
    sleep 0.5
done
pg_isready -h "$HOST" -p "$PORT" >&2 || { say "server on $HOST:$PORT does not answer"; exit 1; }

# 3. The role and the database (names and password are fixed literals: no quoting needed).
as_postgres() { "${AS_ROOT[@]}" runuser -u postgres -- psql -p "$PORT" -v ON_ERROR_STOP=1 -qtA "$@"; }
if [[ $(as_postgres -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'") != 1 ]]; then
    say "creating role $ROLE"
    as_postgres -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" >&2
fi
if [[ $(as_postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'") != 1 ]]; then
    say "creating database $DATABASE"
    as_postgres -c "CREATE DATABASE $DATABASE OWNER $ROLE" >&2
fi

# 4. The URL works: a password login over TCP.
PGPASSWORD=$PASSWORD psql -h "$HOST" -p "$PORT" -U "$ROLE" -d "$DATABASE" -qtA -c "SELECT 1" >/dev/null
echo "postgresql://$ROLE:$PASSWORD@$HOST:$PORT/$DATABASE"
