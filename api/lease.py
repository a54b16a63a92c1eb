"""One active coordinator per database: the serving process holds a lease for its whole life.

- SQLite: an exclusive `flock` on `<database file>.coordinator.lock` (the kernel drops it when the
  process dies, kill -9 included, so a restart never waits for an expiry).
- PostgreSQL: a session advisory lock, keyed by the schema the service uses, held on a connection of
  its own (outside the pool); the server ends it when that session ends.

A second server on the same database refuses to start with one line naming the holder. The lock is
checked every few seconds; a PostgreSQL session lost (database restart) is re-acquired, and if
another server got it meanwhile this one stops (SIGTERM to itself) rather than coordinate twice.
Generation changes are also compare-and-swap in the store, a second line of defence.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from api import logs

log = logs.get("lease")
_PG_KEY = 74737002  # first half of the advisory lock key; the second is hashtext(current_schema())


class LeaseHeld(RuntimeError):
    """Another server coordinates this database."""


class Lease:
    def __init__(self, database_url: str):
        self.url = make_url(database_url)
        self._file = None
        self._engine = None
        self._conn = None
        self._stop = threading.Event()

    def acquire(self) -> Lease:
        if self.url.get_backend_name() == "sqlite":
            self._acquire_sqlite()
        elif self.url.get_backend_name() == "postgresql":
            self._acquire_postgres()
            threading.Thread(target=self._watch, name="coordinator-lease", daemon=True).start()
        return self

    def _acquire_sqlite(self) -> None:
        database = self.url.database
        if not database or database == ":memory:":
            return  # a private in-memory database: nobody else can open it
        path = Path(f"{database}.coordinator.lock")
        self._file = open(path, "a+")  # noqa: SIM115 - held open for the process's life
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            self._file = None
            raise LeaseHeld(f"--database-url: another recycle server ({holder}) already coordinates "
                            f"{database} (lock {path}); stop it first, or use another database") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}")
        self._file.flush()

    def _acquire_postgres(self) -> None:
        self._engine = create_engine(self.url, poolclass=NullPool)
        self._conn = self._engine.connect()
        self._conn.execution_options(isolation_level="AUTOCOMMIT")
        got = self._conn.execute(text("SELECT pg_try_advisory_lock(:k, hashtext(current_schema()))"),
                                 {"k": _PG_KEY}).scalar()
        if not got:
            holder = self._conn.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = :k AND granted "
                "AND objid = hashtext(current_schema())::oid"), {"k": _PG_KEY}).scalar()
            schema = self._conn.execute(text("SELECT current_schema()")).scalar()
            self.release()
            raise LeaseHeld(f"--database-url: another recycle server (database session pid {holder}) already "
                            f"coordinates schema {schema} of {self.url.database}; stop it first, or use "
                            "another database")

    def _watch(self) -> None:
        while not self._stop.wait(3.0):
            try:
                self._conn.execute(text("SELECT 1"))
                continue
            except Exception:  # noqa: BLE001 - the session is gone: its lock went with it
                log.warning("coordinator lease session lost; re-acquiring")
            try:
                self.release()
                self._acquire_postgres()
                log.info("coordinator lease re-acquired")
            except LeaseHeld as exc:
                log.error("coordinator lease taken by another server; stopping", extra={"error": str(exc)})
                os.kill(os.getpid(), signal.SIGTERM)
                return
            except Exception:  # noqa: BLE001 - database still down: try again at the next check
                continue

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def close(self) -> None:
        self._stop.set()
        self.release()
