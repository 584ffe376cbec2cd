"""Where a running trial and the driver talk, through Ray (a trial may run on another machine:
no shared file). One small actor, created by the driver, holds per trial:

- its phase ('starting', 'replaying', ...) and its server's host and process group, so the
  driver can show progress and reap a server whose worker died;
- its stage checkpoints (partial measurements), which the driver reads, reports to Optuna
  (`trial.report`) and judges; and the driver's verdict on each ('' = go on).

`BoardDriver` is the trial's side: posting is fire-and-forget. Only a trial that listens for
the driver's verdict (early stop on) polls it, from a background thread: one verdict call is in
flight at a time, looked at with `ray.wait(timeout=0)`, so a slow board never holds the thread
in `ray.get` and unanswered calls never pile up. (The 2-30 s stalls of the replay's event loop
once blamed on Ray here came from the server's own session: engine/vllm.py.)
"""

from __future__ import annotations

import socket
import threading
import time

import ray

from optimizer.trial.driver_link import Driver

ASK_AGAIN_S = 30.0  # a verdict call unanswered this long is given up and asked again


@ray.remote(num_cpus=0)
class TrialBoard:
    def __init__(self):
        self.phases: dict[int, str] = {}
        self.servers: dict[int, tuple[str, int]] = {}
        self.checkpoints: dict[int, list[tuple[int, dict]]] = {}
        self.verdicts: dict[int, tuple[int, str]] = {}

    def set(self, number: int, phase: str) -> None:
        self.phases[number] = phase

    def get(self) -> dict[int, str]:
        return dict(self.phases)

    def server(self, number: int, host: str, pgid: int) -> None:
        self.servers[number] = (host, pgid)

    def server_of(self, number: int) -> tuple[str, int] | None:
        return self.servers.get(number)

    def checkpoint(self, number: int, step: int, payload: dict) -> None:
        self.checkpoints.setdefault(number, []).append((step, payload))

    def take_checkpoints(self, number: int) -> list[tuple[int, dict]]:
        """The checkpoints not read yet (the driver reads each once)."""
        return self.checkpoints.pop(number, [])

    def decide(self, number: int, step: int, reason: str) -> None:
        self.verdicts[number] = (step, reason)

    def verdict(self, number: int) -> tuple[int, str]:
        return self.verdicts.get(number, (-1, ""))


class BoardDriver(Driver):
    """The trial's end of the board (runs in the Ray worker). `listen`: poll the driver's verdict
    (a trial whose driver never judges it does not: nothing to hear, and no Ray traffic)."""

    def __init__(self, board, number: int, listen: bool = True, poll_s: float = 0.5):
        self.board, self.number, self.host = board, number, socket.gethostname()
        self._step, self._reason = -1, ""
        self.polls, self.errors, self.last_error = 0, 0, ""  # the channel's health, for the record
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(poll_s,), daemon=True) if listen else None
        if self._thread is not None:
            self._thread.start()

    def _poll(self, every: float) -> None:
        pending, since = None, 0.0
        while not self._closed.wait(every):
            try:
                if pending is None:
                    pending, since = self.board.verdict.remote(self.number), time.monotonic()
                if not ray.wait([pending], timeout=0)[0]:
                    if time.monotonic() - since > ASK_AGAIN_S:  # lost, or the board is gone: ask anew
                        pending = None
                        self.errors += 1
                        self.last_error = f"no answer from the board in {ASK_AGAIN_S:g} s"
                    continue
                step, reason = ray.get(pending, timeout=0)
                pending = None
                self.polls += 1
            except Exception as exc:  # the driver is gone or slow: carry on measuring
                pending = None
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                continue
            with self._changed:
                if step > self._step:
                    self._step, self._reason = step, self._reason or reason
                    self._changed.notify_all()

    def phase(self, phase: str) -> None:
        self.board.set.remote(self.number, phase)

    def spawned(self, pgid: int) -> None:
        self.board.server.remote(self.number, self.host, pgid)

    def checkpoint(self, step: int, payload: dict) -> None:
        self.board.checkpoint.remote(self.number, step, payload)

    def stop_reason(self) -> str:
        return self._reason

    def verdict(self, step: int, wait_s: float) -> str:
        with self._changed:
            self._changed.wait_for(lambda: self._step >= step, timeout=wait_s)
            return self._reason

    def close(self) -> None:
        self._closed.set()

    def health(self) -> dict:
        return {"verdict_polls": self.polls, "poll_errors": self.errors, "last_error": self.last_error,
                "verdict_step": self._step}
