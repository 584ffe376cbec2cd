"""Whether the kernel's OOM killer took one of a server's processes.

When the kernel kills a vLLM worker for memory, the API server above it exits with an ordinary
status, and its last log line is whatever Python printed on the way out (a `resource_tracker`
warning, measured): not evidence of anything. The kernel's own log says what happened, one
record per kill ("Out of memory: Killed process 11622 (python3) ..." or "Memory cgroup out of
memory: Killed process ..."). It is read from /dev/kmsg, which needs root or CAP_SYSLOG; where it
cannot be read, the exit status alone decides (engine/failures.py).

A kill is this server's when its pid is one the server's process group held while it ran
(`VllmServer.pids`, sampled during start-up), and it happened after the server started: another
process killed on the same host (production's server, say) is never blamed on a trial.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

import psutil

KMSG = "/dev/kmsg"
_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")


@dataclass(frozen=True)
class OomKill:
    at: float  # wall-clock time of the kill
    pid: int
    name: str
    line: str  # the kernel's record, as it wrote it

    def describe(self, since: float) -> str:
        return (f"the kernel's OOM killer killed {self.name} (pid {self.pid}) {self.at - since:.0f} s after the "
                f"server started: {self.line[:200]}")


def parse(records: str, boot: float) -> list[OomKill]:
    """The OOM kills in /dev/kmsg records ("prio,seq,usec since boot,flags;message"; continuation
    lines start with a space)."""
    out = []
    for record in records.splitlines():
        head, sep, message = record.partition(";")
        fields = head.split(",")
        if not sep or record.startswith(" ") or len(fields) < 3 or not fields[2].isdigit():
            continue
        m = _KILLED.search(message)
        if m:
            out.append(OomKill(boot + int(fields[2]) / 1e6, int(m.group(1)), m.group(2), message.strip()))
    return out


def read_records(path: str = KMSG) -> str:
    """Every record the kernel's ring buffer still holds ("" when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while reading: go on with the next
                    continue
                break
            if not chunk:
                break
            chunks.append(chunk.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return "".join(chunks)


def killed(pids: set[int], since: float, path: str = KMSG) -> OomKill | None:
    """The kernel's OOM kill of one of `pids` at or after `since` (a second of clock slack), if any."""
    if not pids:
        return None
    for kill in parse(read_records(path), psutil.boot_time()):
        if kill.pid in pids and kill.at >= since - 1.0:
            return kill
    return None
