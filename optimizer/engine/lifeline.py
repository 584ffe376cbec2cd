"""The guard at the head of a vLLM server's process group: the server dies with its owner.

    owner (the Ray worker running a trial, or any process holding a VllmServer)
      |  holds the write end of a pipe; nothing else does
      +-- guard (this file, run by path: standard library only)   group leader, pgid = its pid
            +-- watcher (a fork of the guard)  holds the pipe's read end, and one to the guard
            +-- API server  ->  EngineCore  ->  worker(s)          all in the guard's process group

The owner starts the guard in a new process group of the owner's own session (engine/vllm.py
says why not a session of its own); the guard forks the watcher, then starts vLLM.
When the owner dies for any reason (SIGKILL, the OOM killer, Ray killing its worker) the kernel
closes its file descriptors and the watcher sees end-of-file at once; it sees the same when
the guard dies. Either way it stops the whole group: SIGTERM, `grace` seconds, then SIGKILL.
The watcher is not the owner's child on purpose: a Ray worker that exits after its driver
died SIGKILLs its direct children first (measured, Ray 2.60), which is the guard, not it.
Nothing here depends on the owner running any code at its death, on the driver, or on a
filesystem; it works the same on every node. The write end is close-on-exec, so no program
the owner runs keeps it open; a child the owner forks without exec would (no caller forks).

The guard waits for the API server and exits the way it did (its code, or the same signal),
so the owner reads the server's own exit status at once; the watcher then stops whatever the
API server left in the group (an EngineCore left behind would hold the memory). A SIGTERM,
SIGINT or SIGHUP to the guard is passed on to the API server (one that comes before the API
server exists, once it does). A stop of the whole group, as `engine/vllm.py` does it, thus
reaches the API server twice, directly and through the guard: vLLM's ready server takes both as
one shutdown; one still starting may cut its own clean-up short, and the group's SIGKILL
(3 s later for a server not yet ready) ends that. The watcher ignores these signals.

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
NOTE_PREFIX = "# lifeline: "  # the watcher's lines in the server log, never the server's own (engine/failures.py)


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


def stop_group(pgid: int, grace: float, gentle: tuple[int, ...] = ()) -> None:
    """SIGTERM every other process of the group but `gentle`, wait up to `grace` for all of them
    (`gentle` included) to go, then SIGKILL what is left, again each round (nothing forked late
    escapes), for at most 10 s."""
    for pid in members(pgid, gentle):
        _kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while members(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    end = time.monotonic() + 10.0
    while time.monotonic() < end:
        left = members(pgid)
        if not left:
            return
        for pid in left:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def owner_gone(fd: int) -> bool:
    """True if every write end of the pipe is already closed (end-of-file on the read end)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable) and os.read(fd, 64) == b""


def watch(owner_fd: int, guard_fd: int, owner: int, pgid: int, grace: float) -> None:
    """The watcher's life: wait for the owner's end or the guard's to close, then stop what is
    left of the group. The guard (pid = pgid) is spared the SIGTERM: it would pass it on a second
    time; it exits by itself once the API server has.

    The guard's end closes while the kernel tears the guard down, a moment before it becomes a
    zombie: the guard itself is then still listed, and is not something it left behind. Counting
    it made a server that ended whole look like one that left processes: the notes below, written
    after the server's last line, were then read as its failure's evidence."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    closed: set[int] = set()
    while not closed:
        readable, _, _ = select.select([owner_fd, guard_fd], [], [])
        closed = {fd for fd in readable if os.read(fd, 64) == b""}
    if owner_fd in closed:
        who = f"the owner (pid {owner}) died"
    elif members(pgid, spare=(pgid,)):
        who = "the guard ended (its API server exited, or it was killed) with processes left"
    else:
        os._exit(0)  # the server ended whole: nothing to stop
    t = time.monotonic()
    _say(f"{who}; stopping the server's process group {pgid}")
    stop_group(pgid, grace, gentle=(pgid,))
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
    """One whole line in one write (the server's processes write to the same open log file); a write
    that fails (a full disk) never keeps the watcher from stopping the group."""
    try:
        os.write(2, f"{NOTE_PREFIX}{text}\n".encode(errors="replace"))
    except OSError:
        pass


def main(argv: list[str]) -> None:
    fd, grace, cmd = int(argv[1]), float(argv[2]), argv[4:]
    pgid, owner = os.getpgrp(), os.getppid()
    if owner_gone(fd):
        _say("the owner was gone before the server started; not starting it")
        sys.exit(1)
    guard_read, guard_write = os.pipe()
    if os.fork() == 0:
        os.close(guard_write)
        watch(fd, guard_read, owner, pgid, grace)
    os.close(guard_read)  # guard_write stays open until the guard exits: the watcher sees that
    child: list[subprocess.Popen] = []
    pending: list[int] = []

    def pass_on(signum, _frame) -> None:
        if not child:
            pending.append(signum)  # before the API server exists: passed on once it does
        elif child[0].poll() is None:
            _kill(child[0].pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    child.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
    for signum in pending:
        _kill(child[0].pid, signum)
    exit_like(child[0].wait())  # what the API server left behind, the watcher stops


if __name__ == "__main__":
    main(sys.argv)
