"""Open the study storage: any SQLAlchemy URL, SQLite (`sqlite:///trials.db`) by default.

For SQLite the path is made absolute (a relative one would follow the working
directory, which Ray jobs change), the file is checked before Optuna touches it (a
damaged or foreign file is reported, never overwritten), WAL mode is switched on so
optuna-dashboard can read while the driver writes, and connections wait on a lock
instead of failing at once.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

import optuna
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from optimizer.errors import StorageError, first_line

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
    sqlite.org/howtocorrupt.html, 2.2). SQLite shares its descriptors per file within a process."""
    if path.is_dir():
        raise StorageError(f"storage {path} is a directory; name a database file, e.g. {path / 'trials.db'}")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise StorageError(f"storage {path} is not a SQLite database (damaged or foreign file); "
                               "move it aside or pass --storage with another path") from exc
        raise StorageError(f"storage {path} is damaged ({exc}); move it aside or pass --storage") from exc
    if tables and "studies" not in tables:
        raise StorageError(f"storage {path} is a SQLite database but not an Optuna one; "
                           "pass --storage with another path")


def check_storage(url: str) -> Path | None:
    """Refuse, without writing anything, a SQLite path whose directory is missing or whose
    file is damaged or foreign, or a database server that does not answer (or refuses the
    credentials); returns the database file (None for other databases)."""
    path = sqlite_path(url)
    if path:
        if not path.parent.is_dir():
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


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage for `url`; raises StorageError with the fix."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the commands print their own lines
    path = check_storage(url)
    if path:
        with closing(sqlite3.connect(path)) as con:
            con.execute("PRAGMA journal_mode=WAL")
        url = f"sqlite:///{path}"
        kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
    else:
        kwargs = {"pool_pre_ping": True}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as exc:
        raise StorageError(f"storage '{url}' cannot be opened ({type(exc).__name__}: {first_line(exc)})"
                           "; check the URL, the driver package and the server") from exc


def study_attrs(storage_url: str) -> list[tuple[str, dict]]:
    """Every study in the storage, as (name, user attributes)."""
    storage = open_storage(storage_url)
    return [(s.study_name, dict(s.user_attrs))
            for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False)]
