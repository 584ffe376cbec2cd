"""The guard at the head of a vLLM server's process group: the server dies with its owner.

    owner (the Ray worker running a trial, or any process holding a VllmServer)
      |  holds the write end of a pipe; nothing else does
      +-- guard (this file, run by path: standard library only)   session leader, pgid = its pid
            +-- watcher (a fork of the guard)  holds the pipe's read end, and one to the guard
            +-- API server  ->  EngineCore  ->  worker(s)          all in the guard's process group

The owner starts the guard in a new session; the guard forks the watcher, then starts vLLM.
When the owner dies for any reason (SIGKILL, the OOM killer, Ray killing its worker) the kernel
closes its file descriptors and the watcher sees end-of-file at once; it sees the same when
the guard dies. Either way it stops the whole group: SIGTERM, `grace` seconds, then SIGKILL.
The watcher is not the owner's child on purpose: a Ray worker that exits after its driver
died SIGKILLs its direct children first (measured, Ray 2.60), which is the guard, not it.
Nothing here depends on the owner running any code at its death, on the driver, or on a
filesystem; it works the same on every node. The write end is close-on-exec, so no program
the owner runs keeps it open; a child the owner forks without exec would (no caller forks).

The guard waits for the API server; when it exits by itself the guard stops the rest of
the group (an EngineCore left behind would hold the memory), then exits the way the API
server did (its code, or the same signal), so the owner reads the server's own exit status.
A SIGTERM or SIGINT sent to the guard alone is passed on to the API server; one sent to the
whole group (as `engine/vllm.py` stops a server) reaches every process directly, and the
watcher ignores it.

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


def members(pgid: int, spare: tuple[int, ...] = ()) -> list[int]:
    """Live (non-zombie) processes of the group other than this one and `spare`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or int(name) in spare:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def stop_group(pgid: int, grace: float, spare: tuple[int, ...] = ()) -> None:
    """SIGTERM every other process of the group (but `spare`), wait up to `grace`, SIGKILL what
    is left, and wait (at most 10 s) until none is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in members(pgid, spare):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + wait
        while members(pgid, spare) and time.monotonic() < end:
            time.sleep(0.05)
        if not members(pgid, spare):
            return


def owner_gone(fd: int) -> bool:
    """True if every write end of the pipe is already closed (end-of-file on the read end)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable) and os.read(fd, 64) == b""


def watch(owner_fd: int, guard_fd: int, owner: int, pgid: int, grace: float) -> None:
    """The watcher's life: wait for the owner's end or the guard's to close, then stop the group."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    closed: set[int] = set()
    while not closed:
        readable, _, _ = select.select([owner_fd, guard_fd], [], [])
        closed = {fd for fd in readable if os.read(fd, 64) == b""}
    if owner_fd not in closed and not members(pgid, (pgid,)):  # the guard (pid = pgid) waits for us
        os._exit(0)  # the guard ended after its server: nothing left to stop
    t = time.monotonic()
    who = f"the owner (pid {owner}) died" if owner_fd in closed else "the guard died before its server"
    _say(f"{who}; stopping the server's process group {pgid}")
    stop_group(pgid, grace)
    _say(f"process group {pgid} gone {time.monotonic() - t:.1f} s later")
    os._exit(0)


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
    if owner_gone(fd):
        _say("the owner was gone before the server started; not starting it")
        sys.exit(1)
    guard_read, guard_write = os.pipe()
    watcher = os.fork()
    if watcher == 0:
        os.close(guard_write)
        watch(fd, guard_read, owner, pgid, grace)
    os.close(guard_read)
    child: list[subprocess.Popen] = []

    def pass_on(signum, _frame) -> None:
        if child and child[0].poll() is None:
            try:
                os.kill(child[0].pid, signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    child.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
    rc = child[0].wait()
    stop_group(pgid, grace, spare=(watcher,))  # what the API server left behind
    os.close(guard_write)  # the watcher sees it and ends
    os.waitpid(watcher, 0)
    exit_like(rc)


if __name__ == "__main__":
    main(sys.argv)
