"""The study database lost while a generation runs under the daemon (a PostgreSQL restart or failover, a SQLite
file locked past its timeout): the generation is not lost with it. The daemon says so once per
loss (console, `/status` last_error), waits (1 s, doubling, at most RETRY_MAX_S), takes its
study lock again (on PostgreSQL the lock went with the connection) and runs the generation
again. The generation resumes its study: its finished trials are there, and the trial that was
running is told FAIL (infra: the storage was lost while it ran) and queued again."""

from __future__ import annotations

from optuna.exceptions import StorageInternalError
from sqlalchemy.exc import SQLAlchemyError

from optimizer import shutdown
from optimizer.errors import StorageError, first_line

LOST = (SQLAlchemyError, StorageInternalError, StorageError)
FIRST_S = 1.0
RETRY_MAX_S = 60.0


def cause(exc: BaseException) -> str:
    """The loss in one line: the database driver's own error when Optuna wrapped it (its wrapper's
    message guesses at invalid data), else the error's first line."""
    seen = exc
    while seen is not None and not isinstance(seen, SQLAlchemyError) and seen.__cause__ is not None:
        seen = seen.__cause__
    if isinstance(seen, SQLAlchemyError) and getattr(seen, "orig", None) is not None:
        seen = seen.orig
    return first_line(seen if seen is not None else exc, 300)


def retrying(attempt, on_lost, relock):
    """`attempt()` until it returns without losing the storage. `on_lost(why, wait_s)` hears each
    loss; `relock()` takes the study's lock again before the next attempt (it may lose it too)."""
    delay = FIRST_S
    while True:
        try:
            return attempt()
        except LOST as exc:
            on_lost(cause(exc), delay)
        while True:
            shutdown.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            try:
                relock()
                break
            except LOST as exc:
                on_lost(cause(exc), delay)
