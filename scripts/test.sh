#!/usr/bin/env bash
# Set up, start a throw-away PostgreSQL 15 cluster, lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate

PGDIR=$(mktemp -d /tmp/recycle-pg.XXXXXX)
cleanup() { pg_ctl -D "$PGDIR/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$PGDIR"; }
trap cleanup EXIT
if command -v initdb >/dev/null 2>&1 || [ -d /usr/lib/postgresql ]; then
  # Resolve symlinks: initdb may be linked into /usr/local/bin while its siblings are not.
  PGBIN=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb | tail -1)")")
  PORT=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  RUNAS=()
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root: run the cluster as an unprivileged user.
    id recycle-pg >/dev/null 2>&1 || useradd --system --no-create-home recycle-pg
    chown -R recycle-pg "$PGDIR"
    RUNAS=(runuser -u recycle-pg --)
  fi
  "${RUNAS[@]}" "$PGBIN/initdb" -D "$PGDIR/data" -U recycle --auth=trust >/dev/null
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -o "-p $PORT -k $PGDIR -c listen_addresses=127.0.0.1" \
    -l "$PGDIR/log" -w start >/dev/null
  "${RUNAS[@]}" "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U recycle recycle_test
  export RECYCLE_TEST_POSTGRES_URL="postgresql+psycopg://recycle@127.0.0.1:$PORT/recycle_test"
  cleanup() { "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$PGDIR/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$PGDIR"; }
else
  echo "warning: PostgreSQL not found; PostgreSQL variants of the API tests will be skipped" >&2
fi

ruff check .
python -m pytest -q "$@"
