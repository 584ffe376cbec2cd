"""One driver per study on a database server: a PostgreSQL session advisory lock on the study's
name, taken before a driver recovers anything, and held on a connection of its own for the
driver's whole run. The server drops it when that connection ends (the driver stopped, died, or
lost the network), so a dead driver never blocks the next one.

The run-state lock (driver_lock.py) is a file: it sees only drivers that share the SQLite
database's directory or the artifacts directory. Two drivers of one PostgreSQL study from two
hosts, or from two artifacts directories, would both take it, and the second's recovery would
fail the first one's running trials. This lock is the database's own, so every host sees it.
Other databases keep the file lock alone (docs/troubleshooting.md#known-limits).
"""

from __future__ import annotations

import hashlib
import os
import socket

from sqlalchemy.engine import make_url

from optimizer.driver.store.database import masked
from optimizer.errors import ConfigError, StorageError

APP = "vllm-optimizer driver"  # our lock connections' application_name: names the holder


def lock_key(study: str) -> int:
    """The advisory lock's 64-bit key for a study name (the same on every host)."""
    return int.from_bytes(hashlib.sha256(f"vllm-optimizer\0{study}".encode()).digest()[:8], "big", signed=True)


class StudyLock:
    def __init__(self, url: str, study: str | None):
        self.url, self.study = url, study
        self._conn = None

    @property
    def applies(self) -> bool:
        return bool(self.study) and make_url(self.url).get_backend_name() == "postgresql"

    def acquire(self) -> None:
        """Take the study's lock (ConfigError naming the holder when another driver has it)."""
        if not self.applies:
            return
        import psycopg  # noqa: PLC0415 - PostgreSQL storage only

        u = make_url(self.url).set(drivername="postgresql")
        me = f"{APP} {socket.gethostname()}:{os.getpid()}"
        try:
            self._conn = psycopg.connect(u.render_as_string(hide_password=False), autocommit=True, connect_timeout=10,
                                         application_name=me[:63])
            held = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(self.study),)).fetchone()[0]
        except psycopg.Error as exc:
            self.release()
            raise StorageError(f"storage {masked(self.url)}: cannot take the lock of study '{self.study}' "
                               f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}); "
                               "check the database server") from None
        if not held:
            who = self._holder()
            self.release()
            raise ConfigError(f"study '{self.study}' in {masked(self.url)} is in use by another driver ({who}); stop it "
                              "first, or pass --study-name NEW") from None

    def _holder(self) -> str:
        key = lock_key(self.study)
        row = self._conn.execute(
            "SELECT a.application_name, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s::bigint LIMIT 1",
            (key,)).fetchone()
        if not row:
            return "another session"
        name, addr = row
        return (name.removeprefix(APP).strip() or "a session") + (f" from {addr}" if addr else "")

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # the server drops the session's advisory locks with it
            finally:
                self._conn = None
