"""What a stopped driver left running, as tests and benches check it. The driver is started in a
process group of its own with a mark in its environment (`launch_env`, `GROUP`); left over is
any live process that

- was in its tree just before the stop (Ray's GCS, raylet and workers, each trial server's
  guard and vLLM processes), or
- is in its process group (Ray's own processes: GCS, raylet, dashboard and runtime-env agents,
  whose titles Ray rewrites, environment included), or
- carries the mark in its environment (every Ray worker and vLLM process it started, even one
  started while it stopped, and orphaned since).

Other users' Ray or vLLM processes on the machine are never counted.
"""

from __future__ import annotations

import os
import uuid

import psutil

MARK_ENV = "VLLM_OPTIMIZER_LEFTOVER_MARK"
GROUP = {"process_group": 0}  # subprocess.Popen keywords: the driver heads a process group of its own


def launch_env() -> tuple[dict[str, str], str]:
    """The environment to start a driver with, and its mark."""
    mark = uuid.uuid4().hex
    return {**os.environ, MARK_ENV: mark}, mark


def tree(pid: int) -> set[int]:
    """The process and every descendant it has now (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _live(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ours(p: psutil.Process, pgid: int, mark: str) -> bool:
    try:
        if os.getpgid(p.pid) == pgid:
            return True
        return p.environ().get(MARK_ENV) == mark
    except (psutil.Error, ProcessLookupError):
        return False


def left(before_stop: set[int], pgid: int, mark: str) -> list[psutil.Process]:
    """Live processes of the driver's tree taken before the stop, of its group `pgid`, or marked `mark`."""
    me = os.getpid()
    found = {p.pid: p for p in psutil.process_iter()
             if p.pid != me and (p.pid in before_stop or _ours(p, pgid, mark)) and _live(p)}
    return sorted(found.values(), key=lambda p: p.pid)


def describe(procs: list[psutil.Process]) -> list[str]:
    """'pid name' for each, as a report prints them."""
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            out.append(f"{p.pid} (gone)")
    return out


def kill(procs: list[psutil.Process]) -> None:
    """SIGKILL each (by pid), so that what one try left does not weigh on the next."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
