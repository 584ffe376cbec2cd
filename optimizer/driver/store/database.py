"""Open the study storage: any SQLAlchemy URL, SQLite (`sqlite:///trials.db`) by default.

For SQLite the path is made absolute (a relative one would follow the working
directory, which Ray jobs change), the file is checked before Optuna touches it (a
damaged or foreign file is reported, never overwritten), WAL mode is switched on so
optuna-dashboard can read while the driver writes, and connections wait on a lock
instead of failing at once.

A storage opened for reading (`read_only=True`: report, plan, the daemon's look at its
generations) keeps the file's journal mode as it is and holds no connection between reads,
so a reader leaves the file byte for byte as it was and no `-wal`/`-shm` beside it. A
writer's connections are closed when its driver lock is released (`close_storages`), so a
run that stops, refused or not, leaves no `-wal`/`-shm` behind either (SQLite deletes them
when the last connection closes). A `-wal` found beside the file is another connection's
and is left as found.
"""

from __future__ import annotations

import os
import re
import sqlite3
import weakref
from contextlib import closing
from pathlib import Path

import optuna
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from optimizer.errors import StorageError, first_line
from optimizer.record import of_study, version

BUSY_TIMEOUT_S = 20


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for other databases or in-memory SQLite)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageError(f"storage '{url}' is not a database URL; use e.g. sqlite:///trials.db") from exc
    if not parsed.drivername.startswith("sqlite") or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).expanduser().resolve()


def masked(url: str) -> str:
    """The URL as it may be printed or logged: a password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparsable URL)"


def normalize_url(url: str, in_job: bool = False) -> str:
    """The URL with a SQLite path made absolute; other URLs unchanged. In a Ray job run from an
    uploaded working directory (`in_job`), a relative SQLite path is refused: it would land in
    that temporary copy and be deleted with the job (docs/vllm-facts.md#ray-job-working-dir)."""
    if in_job and url.startswith("sqlite") and not url.startswith("sqlite:////") and ":memory:" not in url:
        raise StorageError(f"storage '{url}' is a relative SQLite path, and this runs as a Ray job whose working "
                           "directory is a temporary copy deleted with the job; pass an absolute path "
                           "(--storage sqlite:////data/trials.db) or a database URL (postgresql://...)")
    path = sqlite_path(url)
    return f"sqlite:///{path}" if path else url


def check_sqlite_file(path: Path) -> None:
    """Raise StorageError if `path` exists but is not a SQLite database holding an Optuna study.

    Read through SQLite only, never with a plain open(): closing any other descriptor of the
    database file drops every POSIX lock this process holds on it, so a process that already
    has the study open (the daemon opening its next generation) would lose its locks, and
    another process could checkpoint the WAL under it ("database disk image is malformed";
    sqlite.org/howtocorrupt.html, 2.2). SQLite shares its descriptors per file within a process.

    Opened read-write (`mode=rw`: never created; read-only where the file system says so), not
    `mode=ro`: a read-only connection to a WAL-mode file makes its -wal and -shm but cannot delete
    them on close, so a refusal after this check would leave them beside the database. Only
    sqlite_master is read; nothing is written. A -wal already there is another connection's: then
    read-only, so that this close cannot be the last one, which checkpoints that WAL into the file."""
    if path.is_dir():
        raise StorageError(f"storage {path} is a directory; name a database file, e.g. {path / 'trials.db'}")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode={'ro' if wal_found(path) else 'rw'}", uri=True)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise StorageError(f"storage {path} is not a SQLite database (damaged or foreign file); "
                               "move it aside or pass --storage with another path") from exc
        if _read_only_dir(path.parent):  # a WAL-mode file is read through its -shm beside it, which needs writes
            raise StorageError(f"storage {path} cannot be read ({exc}): {path.parent} takes no writes, and a "
                               "WAL-mode database needs them (for its -shm file); copy it to a writable directory and "
                               "pass --storage with the copy") from exc
        raise StorageError(f"storage {path} is damaged ({exc}); move it aside or pass --storage") from exc
    if tables and "studies" not in tables:
        raise StorageError(f"storage {path} is a SQLite database but not an Optuna one; "
                           "pass --storage with another path")


def _read_only_dir(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY) or not os.access(directory, os.W_OK)
    except OSError:
        return False


def check_storage(url: str) -> Path | None:
    """Refuse, without writing anything, a SQLite path whose directory is missing or whose
    file is damaged or foreign, or a database server that does not answer (or refuses the
    credentials); returns the database file (None for other databases)."""
    path = sqlite_path(url)
    if path:
        if not path.parent.is_dir():
            blocker = next((p for p in path.parents if p.exists()), None)
            if blocker is not None and not blocker.is_dir():
                raise StorageError(f"storage {path}: {blocker} is a file, not a directory; pass --storage with a "
                                   "path in a directory")
            raise StorageError(f"storage {path}: directory {path.parent} does not exist; create it first")
        check_sqlite_file(path)
    elif not url.startswith("sqlite"):
        _probe_server(url)
    return path


def _probe_server(url: str) -> None:
    """Connect once, read nothing: an unreachable server or wrong credentials fail here, in one line."""
    shown = masked(url)
    try:
        engine = create_engine(url, connect_args=_connect_timeout(url))
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise StorageError(f"storage '{shown}' cannot be used ({type(exc).__name__}: {first_line(exc)}); "
                           "check the URL and that its driver package is installed") from exc
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        reason = first_line(exc.orig or exc)
        refused = _LOGIN_REFUSED.search(reason)
        if refused:  # the server answered: saying "unreachable" would send the user to the network
            raise StorageError(f"storage '{shown}' refused the login ({reason[refused.start():]}); check the user "
                               "name and password in the URL") from exc
        raise StorageError(f"storage '{shown}' is unreachable ({reason}); check the host, "
                           "port, database name and credentials") from exc
    finally:
        engine.dispose()


# What PostgreSQL (psycopg, libpq) and MySQL say when they answer but refuse the user or password.
_LOGIN_REFUSED = re.compile(r"password authentication failed for user \S+|Access denied for user .*")


def _connect_timeout(url: str) -> dict:
    return {"connect_timeout": 5} if make_url(url).drivername.startswith(("postgresql", "mysql")) else {}


def open_storage(url: str, read_only: bool = False) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for `url`; raises StorageError with the fix.

    `read_only`: for a command that only reads the study (report, plan, ...): SQLite's journal
    mode is left as the file has it (switching to WAL rewrites the header), and no connection is
    pooled (each read closes its own, so a WAL file's `-wal`/`-shm` go with it). Writes still
    work through it (sensitivity records its table), just without WAL switched on.

    A `-wal` already beside the file belongs to another connection (another process, or a
    driver that died): it is left as found, with this storage's connections held open as
    before, since closing the last one would checkpoint that WAL into the file."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the commands print their own lines
    path = check_storage(url)
    found = bool(path) and wal_found(path)
    if path:
        if not read_only:
            _wal_on(path)
        url = f"sqlite:///{path}"
        kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
    else:
        kwargs = {"pool_pre_ping": True}
    if read_only and not found:
        kwargs["poolclass"] = NullPool
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as exc:
        raise StorageError(f"storage '{masked(url)}' cannot be opened ({type(exc).__name__}: {first_line(exc)})"
                           "; check the URL, the driver package and the server") from exc
    if not found:  # the -wal and -shm are this process's to remove
        _OPEN[storage] = url
    return storage


def wal_found(path: Path) -> bool:
    """True if a `-wal` is beside the database: some connection has it open (or died with it open)."""
    return path.with_name(path.name + "-wal").exists()


def _wal_on(path: Path) -> None:
    try:
        with closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)) as con:
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as exc:  # e.g. a directory that takes no new files (-wal, -shm)
        raise StorageError(f"storage {path}: cannot open it for writing ({first_line(exc)}); check that its "
                           "directory takes writes and that no other process holds it locked, or pass --storage "
                           "with another path") from exc


# Every storage this process opened (and found no -wal beside), and its URL: what close_storages() closes.
_OPEN: weakref.WeakKeyDictionary[optuna.storages.RDBStorage, str] = weakref.WeakKeyDictionary()


def close_storage(storage: optuna.storages.RDBStorage) -> None:
    """Close the storage's pooled connections (it stays usable: the next read connects again).
    The last connection to close a WAL database checkpoints it and deletes `-wal` and `-shm`."""
    storage.remove_session()
    storage.engine.dispose()


def close_storages(url: str) -> None:
    """Close every storage this process opened on `url` (the driver lock calls it on release)."""
    key = _key(url)
    for storage, opened in list(_OPEN.items()):
        if _key(opened) == key:
            try:
                close_storage(storage)
            except (SQLAlchemyError, sqlite3.Error, OSError):  # a connection that will not close: the process
                pass  # exit closes it; the lock must still be released


def _key(url: str) -> str:
    try:
        return normalize_url(url)
    except StorageError:
        return url


def study_attrs(storage_url: str) -> list[tuple[str, dict]]:
    """Every study in the storage, as (name, user attributes); read without changing a byte."""
    storage = open_storage(storage_url, read_only=True)
    try:
        return [(s.study_name, of_study.all_attrs(s))
                for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False)]
    finally:
        close_storage(storage)


def check_stored(url: str, name: str) -> None:
    """The record's version check (record/version.py `check`) on the stored study `name`, read without
    changing a byte: before the driver opens the storage for writing (which turns a SQLite file's WAL
    mode on), so a refused study is left as it was. Nothing to check where there is no such study yet."""
    path = sqlite_path(url)
    if path is not None and (not path.is_file() or path.stat().st_size == 0):
        return
    storage = open_storage(url, read_only=True)
    try:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return
        version.check(study)
    finally:
        close_storage(storage)
