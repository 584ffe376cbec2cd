"""Watching the live traffic while a generation tunes: reads never stop.

A thread reads the source every `poll_s` while the generation's trials run (the main thread is
in the driver's loop; it touches the source again only after this thread has stopped), so
`/status`'s `watch` shows the live window and its last read throughout. A change from the
traffic the generation tunes on (workload/drift.py) is said at once, on the console and as
`watch.last_change`; `daemon.on_change` says what follows:

    wait    the generation goes on; once it ends, the traffic is read afresh (daemon/loop.py)
    abort   the generation ends now (shutdown.Handoff, checked by the driver's loops: the
            running trials are stopped and queued again, the finished ones kept), and the next
            one starts on the new traffic
    auto    abort when the traffic turned saturated (traffic/window.py: the generation's own
            window was not) and what arrives changed (a length quantile or the rate moved, not
            only the requests in flight: a trial slowing a production server on the same machine
            fills its backlog too, and must not end its own generation); else wait

A change that does not last (the traffic is back within the threshold) is forgotten.
"""

from __future__ import annotations

import threading
import time

from optimizer import shutdown
from optimizer.workload import drift


ONLY_LOAD = ("in flight", "burstiness", "prefix-cache")  # what moves when the servers slow, not the arrivals


class GenerationWatch:
    def __init__(self, observer, shape: drift.Shape, threshold: float, poll_s: float, on_change: str,
                 console, generation: int, tuned_saturated: bool = False):
        self.observer, self.shape, self.threshold, self.poll_s = observer, shape, threshold, poll_s
        self.tuned_saturated = tuned_saturated  # the generation's own window was saturated
        self.on_change, self.console, self.generation = on_change, console, generation
        self.seen: float | None = None  # when a change was first seen (None: the same traffic)
        self.moved: list[str] = []
        self.saturated = False
        self.aborted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GenerationWatch":
        self.observer.beats = False  # the driver's loop beats; this thread must not stand in for it
        self.observer.watch["last_change"] = None  # the change that started this generation is not news
        self.observer.state.put({"watch": self.observer.watch}, beat=False)
        self._thread = threading.Thread(target=self._run, name="optimizer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, *exc) -> None:
        """Stop reading. On a stop signal the daemon exits: a read in flight is not waited for
        (the thread is a daemon thread). Otherwise the main thread reads the source next, so the
        read in flight ends first (a source's own timeout bounds it)."""
        self._stop.set()
        stopping = kind is not None and issubclass(kind, KeyboardInterrupt) and not issubclass(kind, shutdown.Handoff)
        if self._thread is not None:
            self._thread.join(timeout=1.0 if stopping else 60.0)
        self.observer.beats = True
        shutdown.handoff.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                w = self.observer.current()
            except Exception as exc:  # noqa: BLE001 - a bad read must not end the watch; the next poll retries
                self.console.print(f"[red]traffic source[/]: {type(exc).__name__}: {exc}")
                continue
            if w is not None:
                self._judge(w)

    def _judge(self, w) -> None:
        moved = drift.changes(self.shape, drift.shape_of_window(w), self.threshold)
        if not moved:
            if self.seen is not None:
                self.console.print("  the change did not last: same traffic over the window")
            self.seen, self.moved = None, []
            self.observer.watch["last_change"] = None
            return
        self.moved, self.saturated = moved, self.saturated or w.saturated
        arriving = [m for m in moved if not m.startswith(ONLY_LOAD)]
        abort = self.on_change == "abort" or (self.on_change == "auto" and w.saturated and not self.tuned_saturated
                                              and bool(arriving))
        if self.seen is None:
            self.seen = time.time()
            self.observer.watch["last_change"] = self.seen
            then = "ending it now" if abort else "it goes on; the next generation starts once it ends"
            self.console.print(f"[bold]traffic changed[/] during generation {self.generation} "
                               f"({'; '.join(moved)}): {then} (daemon.on_change {self.on_change})")
        elif abort and not self.aborted:
            self.console.print(f"  generation {self.generation} ends now: the new traffic saturates the servers")
        if abort and not self.aborted:
            self.aborted = True
            shutdown.handoff.set()
