"""A trial's vLLM server seen from outside, as tests and bench need it: its guard (the head of
its process group, engine/lifeline.py), its owner (the Ray worker running the trial), how far
it got, and how long it takes to be gone once its owner is killed.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from optimizer.http_open import urlopen
from optimizer.engine.vllm import group_pids

GUARD = "lifeline.py"


def guards(marker: str) -> list[psutil.Process]:
    """The guards whose server command names `marker` (e.g. the model's directory); not their
    watchers, which have the same command line but do not lead the group."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(a.endswith(GUARD) for a in cmd[:3]) \
                    and any(marker in a for a in cmd) and os.getpgid(p.pid) == p.pid:
                found.append(p)
        except ProcessLookupError:
            continue
    return found


def wait_for_guard(marker: str, timeout: float, still=lambda: True) -> psutil.Process:
    """The first guard naming `marker`, waiting up to `timeout` while `still()` holds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and still():
        found = guards(marker)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no vLLM server naming {marker} started")


def port_of(guard: psutil.Process) -> int:
    cmd = guard.cmdline()
    return int(cmd[cmd.index("--port") + 1])


def completed_requests(port: int) -> float:
    """Requests the server has finished (its /metrics), or -1 when it does not answer yet."""
    try:
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def wait_replaying(guard: psutil.Process, timeout: float) -> None:
    """Until the server has answered a request of the replay (so it is ready, and measured)."""
    port, end = port_of(guard), time.monotonic() + timeout
    while time.monotonic() < end:
        if completed_requests(port) > 0:
            return
        if not guard.is_running():
            raise AssertionError("the server ended before it replayed")
        time.sleep(0.2)
    raise AssertionError("the server never replayed")


def kill(*procs) -> float:
    """SIGKILL each (a psutil.Process, a Popen or a pid), back to back; the monotonic time of it."""
    t = time.monotonic()
    for p in procs:
        pid = p if isinstance(p, int) else p.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return t


def gone_after(pgid: int, since: float, timeout: float) -> float | None:
    """Seconds from `since` until no process of the group is left, or None if some still are
    after `timeout` seconds from now."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not group_pids(pgid):
            return time.monotonic() - since
        time.sleep(0.05)
    return None


def dead_after(pid: int, since: float, timeout: float) -> float | None:
    """Seconds from `since` until the process is gone (or a zombie), or None after `timeout`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.monotonic() - since
        except psutil.NoSuchProcess:
            return time.monotonic() - since
        time.sleep(0.05)
    return None
