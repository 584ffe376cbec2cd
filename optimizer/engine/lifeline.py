"""The guard at the head of a vLLM server's process group: the server dies with its owner.

    owner (the Ray worker running a trial, or any process holding a VllmServer)
      |  holds the write end of a pipe; nothing else does
      +-- guard (this file, run by path: standard library only)   session leader, pgid = its pid
            |  holds the read end
            +-- API server  ->  EngineCore  ->  worker(s)          all in the guard's process group

The owner starts the guard in a new session; the guard starts vLLM in that session. When
the owner dies for any reason (SIGKILL, the OOM killer, Ray killing its worker) the kernel
closes its file descriptors, the guard's read end sees end-of-file at once, and the guard
stops the whole group: SIGTERM, `grace` seconds, then SIGKILL. Nothing here depends on the
owner running any code at its death, on the driver, or on a filesystem; it works the same on
every node. The write end is close-on-exec, so no program the owner runs keeps it open; a
child the owner forks without exec would (no caller here forks).

The guard also stops the group when the API server exits by itself (an EngineCore it left
behind would hold the memory otherwise), then exits the way the API server did (its code,
or the same signal), so the owner reads the server's own exit status. A SIGTERM or SIGINT
sent to the guard alone is passed on to the API server; one sent to the whole group (as
`engine/vllm.py` stops a server) reaches every process directly.

    python lifeline.py FD GRACE -- COMMAND...
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 2.0  # SIGTERM -> SIGKILL once the owner is gone: nobody waits on the server's answers
POLL_S = 0.2  # how often the API server's own exit is looked at (the owner's death is seen at once)


def members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the group other than this one, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM every other process of the group, wait up to `grace`, SIGKILL what is left, and
    wait (at most 10 s) until none is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in members(pgid):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait
        while members(pgid) and time.monotonic() < end:
            time.sleep(0.05)
        if not members(pgid):
            return


def owner_gone(fd: int, timeout: float) -> bool:
    """True once every write end of the pipe is closed (end-of-file on the read end)."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable) and os.read(fd, 64) == b""


def exit_like(returncode: int) -> None:
    """Exit with the API server's status: its code, or death by the same signal."""
    if returncode < 0:
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP take no handler: they need none
            pass
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
        sys.exit(128 - returncode)
    sys.exit(returncode)


def _say(text: str) -> None:
    sys.stderr.write(f"# lifeline: {text}\n")
    sys.stderr.flush()


def main(argv: list[str]) -> None:
    fd, grace, cmd = int(argv[1]), float(argv[2]), argv[4:]
    pgid, owner = os.getpgrp(), os.getppid()
    child: list[subprocess.Popen] = []

    def pass_on(signum, _frame) -> None:
        if child and child[0].poll() is None:
            try:
                os.kill(child[0].pid, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    if owner_gone(fd, 0):
        _say("the owner was gone before the server started; not starting it")
        sys.exit(1)
    child.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
    while True:
        rc = child[0].poll()
        if rc is not None:
            stop_group(pgid, grace)
            exit_like(rc)
        if owner_gone(fd, POLL_S):
            t = time.monotonic()
            _say(f"the owner (pid {owner}) died; stopping the server's process group {pgid}")
            stop_group(pgid, grace)
            child[0].poll()
            _say(f"process group {pgid} gone {time.monotonic() - t:.1f} s after the owner")
            sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
