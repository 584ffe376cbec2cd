"""Stopping on a signal without breaking the clean-up.

SIGTERM (systemd, kill, a CI cancel), SIGINT (Ctrl-C) and SIGHUP (a closed terminal) all mean
"stop": the running trial's server is stopped, the trial is told FAIL (`interrupted`) and its
configuration is queued again. The first signal is acted on; later ones only say that the
stop is under way, so a second Ctrl-C cannot abandon a server half-stopped.

Where the driver waits in a loop of its own (a trial's wait, the daemon's watch), the signal
only sets `requested` and the loop raises at its next poll, so a signal never lands in the
middle of a database write; anywhere else it raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import contextmanager


class _Flag:
    """A stop flag a signal handler can set. Not a threading.Event: its set() takes a lock the
    main thread may hold inside wait(), and the handler runs on the main thread (a deadlock,
    found by a test). A plain attribute and waits in short steps have no such window."""

    STEP_S = 0.1

    def __init__(self):
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self._set and (left := end - time.monotonic()) > 0:
            time.sleep(min(self.STEP_S, left))
        return self._set


requested = _Flag()


class Handoff(KeyboardInterrupt):
    """Not a stop: the daemon ends the running generation for new traffic. The running trials
    are stopped and queued again as for a stop; the daemon then starts the next generation."""


handoff = _Flag()  # set by the daemon's watch (another thread); cleared once the generation ended
_polling = 0


def _on_signal(signum, frame) -> None:
    if requested.is_set():
        print(f"already stopping ({signal.Signals(signum).name} ignored): the running trial's server is being "
              "stopped", file=sys.stderr, flush=True)
        return
    requested.set()
    if not _polling:
        raise KeyboardInterrupt


def install(clear: bool = True) -> None:
    """Route SIGTERM, SIGINT and SIGHUP here. SIGINT too: a non-interactive shell starts `cmd &`
    with SIGINT ignored, and Python would leave it ignored (measured: a driver ran a whole study
    through a SIGINT). Called again after `ray.init` (`clear=False`), which replaces the SIGTERM
    handler with its own `sys.exit` and a native one that aborts (measured: exit 134, the
    running server orphaned)."""
    if clear:
        requested.clear()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def check() -> None:
    """Raise KeyboardInterrupt if a stop was asked for, Handoff if the daemon asked to end the
    generation (called by the polling loops)."""
    if requested.is_set():
        raise KeyboardInterrupt
    if handoff.is_set():
        raise Handoff


@contextmanager
def polling():
    """A region whose loop calls `check()` often: signals set the flag instead of raising."""
    global _polling
    _polling += 1
    try:
        check()
        yield
    finally:
        _polling -= 1


def sleep(seconds: float) -> None:
    """Sleep that ends early (raising KeyboardInterrupt) when a stop is asked for."""
    with polling():
        if requested.wait(seconds):
            check()


@contextmanager
def deferred():
    """A region a signal must not cut short (a server's stop after a first signal): signals only set
    the flag, and the caller's next `check()` acts on them."""
    global _polling
    _polling += 1
    try:
        yield
    finally:
        _polling -= 1
