"""The Ray runtime for trials: an embedded local instance by default, a cluster when named.

`ray.init(address="local")` always starts a fresh local instance; a bare `ray.init()`
would try to join a cluster a past `ray start` left in /tmp/ray (docs/vllm-facts.md#embedded-ray). Trials are
tasks with `max_retries=0`: the driver decides what to retry, so no trial runs twice unseen.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import threading
import time
from contextlib import contextmanager

import psutil
import ray

from optimizer import shutdown
from optimizer.engine import lifeline
from optimizer.engine.vllm import group_pids, terminate_group
from optimizer.errors import RayUnavailable, first_line
from optimizer.trial.task import remote_trial

REAPED = "reaped"  # it was still running: the driver stopped it
GONE = "gone"  # it had already stopped (its guard did it when its worker died: engine/lifeline.py)
UNKNOWN = "unknown"  # no server heard of, another host's (its own guard stops it there), or Ray is gone
GUARD_SETTLE_S = lifeline.GRACE_S + 5.0  # a dead worker's server: the time its guard needs to stop it


BOARD_WAIT_S = 10.0  # the longest the driver waits for one answer of the board (trial/channel.py)


def board_get(ref, timeout: float = BOARD_WAIT_S):
    """The board's answer to `ref`, waited for in short steps: GetTimeoutError after `timeout`, or at
    once when a stop is asked for. The board is a Ray actor at Ray's worker priority (nice 15): on a
    machine busy with a vLLM start-up it can take seconds to answer, and a stop that waited out
    10 s per read took 33 s to exit (measured: bench/daemon_stop.py, the board and the trial's
    worker frozen)."""
    end = time.monotonic() + timeout
    while True:
        ready, _ = ray.wait([ref], timeout=max(0.0, min(0.1, end - time.monotonic())))
        if ready:
            return ray.get(ref)
        if shutdown.requested.is_set() or time.monotonic() >= end:
            why = ": a stop was asked for" if shutdown.requested.is_set() else f" in {timeout:g} s"
            raise ray.exceptions.GetTimeoutError(f"no answer from the trial board{why}")


def reap_server(board, number: int, timeout: float = 10.0, settle: float = 0.0) -> str:
    """Stop the server of a trial whose worker died before stopping it, if it still runs on this
    host: REAPED, GONE or UNKNOWN (then the caller tries the run-state file's record). `settle`:
    how long its guard is given to stop it first (it SIGKILLs after lifeline.GRACE_S).

    The second line of defence: the server's own guard stops its group when the worker dies, on
    every node. Ray's cleanup would not: measured with ray 2.60, neither
    `RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper` nor the worker's direct-child
    cleanup kills a server in its own process group, which it must be (to be stopped as a whole)."""
    try:
        where = board_get(board.server_of.remote(number))
    except (ray.exceptions.RayError, TimeoutError):
        return UNKNOWN  # Ray itself is gone (or a stop cannot wait); the run-state still names the server
    if where is None or where[0] != socket.gethostname():
        return UNKNOWN
    end = time.monotonic() + settle
    while group_pids(where[1]) and time.monotonic() < end and not shutdown.requested.is_set():
        time.sleep(0.1)
    if not group_pids(where[1]):
        return GONE
    _, leftovers = terminate_group(where[1], timeout)
    return UNKNOWN if leftovers else REAPED


run_trial = ray.remote(max_retries=0)(remote_trial)
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set in a `ray job submit` entrypoint's environment (measured, ray 2.60)


def job_working_dir() -> bool:
    """True when this process is a Ray job's entrypoint run from an uploaded `--working-dir`: its
    working directory is then a temporary copy under /tmp/ray/.../working_dir_files, gone with the job."""
    raw = os.environ.get(JOB_CONFIG_ENV)
    if not raw:
        return False
    try:
        return bool(json.loads(raw).get("runtime_env", {}).get("working_dir"))
    except (ValueError, AttributeError):
        return True  # a job whose config we cannot read: assume the worst
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_WORKER_LOGGER = "ray._private.worker"
_HOST_PORT = re.compile(r"^(?:ray://)?\[?([^\]/]+?)\]?:(\d+)$")


def unauthenticated_join(address: str | None) -> str | None:
    """A warning when this driver joins a cluster (`--ray-address`, RAY_ADDRESS) without
    RAY_AUTH_MODE=token. A client cannot tell whether the cluster checks tokens before it has
    joined, so this warns rather than refuses; the cluster files start every node with it."""
    if not address or address == "local" or os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return None
    return (f"joining Ray at '{address}' without RAY_AUTH_MODE=token: a cluster started without token "
            "authentication runs code for anyone who reaches its ports; start every node with RAY_AUTH_MODE=token "
            "and the same ~/.ray/auth_token (as ray_cluster.yaml does), and set it here too")


def check_address(address: str | None, timeout: float = 5.0) -> None:
    """Refuse a `host:port` (or `ray://host:port`) cluster address nothing answers on, before any
    study is opened: `ray.init` would retry for a minute and then abort (measured with ray 2.60)."""
    m = _HOST_PORT.match(address or "")
    if not m:
        return  # embedded, "auto", or a form Ray resolves itself
    host, port = m.group(1), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailable(f"ray: cannot reach cluster at '{address}' ({exc.strerror or exc}); check "
                             "--ray-address (the head's GCS port, 6379 by default), or leave it out to run on "
                             "this machine") from exc


EMBEDDED_TRIES = 2  # a GCS that did not come up in time on a loaded machine comes up at the next try
INIT_STOP_WAIT_S = 3.0  # a stop while Ray starts: how long it gets to come up (and stop whole) before it is killed


def _start_embedded() -> None:
    """Start the embedded local Ray, once more after a failed start (Ray's own start-up timeout
    fires on a machine busy enough: "The current node timed out during startup")."""
    for attempt in range(1, EMBEDDED_TRIES + 1):
        try:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     log_to_driver=False, object_store_memory=256 * 1024**2)
            return
        except Exception:  # noqa: BLE001 - see ray_runtime
            ray.shutdown()
            if attempt == EMBEDDED_TRIES or shutdown.requested.is_set():  # a stop asked for: no second start
                raise
            time.sleep(2.0)


@contextmanager
def ray_runtime(address: str | None, on_start=None):
    """Start (or join) Ray for the duration of a study; shut it down afterwards, and with it every
    process the embedded Ray left (`_shut_down`). `on_start` is called once Ray is up (the run-state
    records the embedded instance's processes). A stop signal while Ray starts is acted on once it
    is up (`_Owner`): KeyboardInterrupt, after the same shut-down."""
    address = address or os.environ.get("RAY_ADDRESS")
    mine = _descendants()  # this driver's own child processes before Ray: never Ray's
    owner = _Owner(address)
    try:
        if not address:
            # Ray 2.x turns token authentication on for a local cluster and says so at every start;
            # the operator has nothing to do about it (the embedded cluster is this process's own).
            logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)
            logging.getLogger(RAY_WORKER_LOGGER).setLevel(logging.WARNING)  # "Started a local Ray instance."
        owner.start()
    except BaseException as exc:
        _shut_down(address, mine, owner)
        if not isinstance(exc, Exception):
            raise  # a stop signal (KeyboardInterrupt), or another exit
        if address:
            raise RayUnavailable(f"ray: cannot reach cluster at '{address}' ({first_line(exc)}); "
                                 "check --ray-address, or leave it out to run on this machine") from exc
        raise RayUnavailable(f"ray: the embedded local Ray did not start ({first_line(exc)}); "
                             "check free memory and /tmp space, or run `ray stop --force`") from exc
    _take_signals_back()  # from the native handler Ray's core worker installed
    try:
        shutdown.check()  # a stop asked for while Ray started
        if on_start and not address:
            on_start()
        yield
    finally:
        _shut_down(address, mine, owner)


class _NotMainThread(logging.Filter):
    """Drops Ray's warning that it set no SIGTERM handler off the main thread: `_Owner` wants none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class _Owner:
    """The thread that starts Ray and lives until Ray is shut down.

    ray.init runs there while the calling thread waits with signals deferred (shutdown.polling): a
    stop signal meanwhile only sets the stop flag, and Ray starts whole before it is shut down. On
    the main thread a stop signal cut ray.init short wherever it landed (Ray's own SIGTERM handler
    raises SystemExit there): Ray's dashboard and runtime-env agents were left running, and once
    the shut-down that followed aborted the driver (measured with Ray 2.60: exit -6). The thread
    must outlive Ray: Ray starts its GCS and raylet with PR_SET_PDEATHSIG, which fires when the
    *thread* that started them ends (measured: both SIGKILLed as soon as a short-lived init thread
    ended). docs/vllm-facts.md#ray-stop-while-starting.

    A start that is slow to come up (10-20 s on a machine loaded enough, measured) is not waited
    out: INIT_STOP_WAIT_S after a stop, if Ray is still starting its processes (not yet connecting
    this driver, which must not be cut short), the start is abandoned: KeyboardInterrupt, and
    `_shut_down` kills what it started instead of asking Ray."""

    def __init__(self, address: str | None):
        self.address = address
        self.abandoned = False
        self._failed: list[BaseException] = []
        self._up = threading.Event()
        self._done = threading.Event()

    def start(self) -> None:
        """Start Ray (raises what ray.init raised); returns once it is up."""
        quiet = _NotMainThread()
        logging.getLogger(RAY_WORKER_LOGGER).addFilter(quiet)
        try:
            with shutdown.polling():
                threading.Thread(target=self._own, name="ray-owner", daemon=True).start()
                asked = None
                while not self._up.wait(0.1):
                    if shutdown.requested.is_set():
                        asked = asked or time.monotonic()
                        if time.monotonic() - asked >= INIT_STOP_WAIT_S and not _connecting():
                            self.abandoned = True
                            raise KeyboardInterrupt
        finally:
            logging.getLogger(RAY_WORKER_LOGGER).removeFilter(quiet)
        if self._failed:
            raise self._failed[0]

    def release(self) -> None:
        """Let the thread end (after ray.shutdown: what it started is gone by then)."""
        self._done.set()

    def _own(self) -> None:
        try:
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                _start_embedded()
        except BaseException as exc:  # noqa: BLE001 - raised again by start(), on the waiting thread
            self._failed.append(exc)
        self._up.set()
        self._done.wait()


def _take_signals_back() -> None:
    """Install shutdown.py's handlers again (from the main thread, the only one that may). Ray's
    native code changes SIGTERM's action without Python knowing, which still names shutdown.py's
    handler: its core worker installs its own handler while it connects, and ray.shutdown resets
    SIGTERM to the default action (measured with Ray 2.60: a SIGTERM after a generation, while
    watching or in the next generation's Ray start, killed the daemon outright, exit -15)."""
    if threading.current_thread() is threading.main_thread():
        shutdown.install(clear=False)


def _connecting() -> bool:
    """True once Ray's processes are up and ray.init is connecting this driver (Ray's global node is
    set just before; the connection holds Ray's connect lock, which ray.shutdown also takes)."""
    return getattr(ray._private.worker, "_global_node", None) is not None


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _shut_down(address: str | None, mine: list[psutil.Process], owner: _Owner) -> None:
    """ray.shutdown(), with signals deferred (one must not cut it short); then SIGKILL what the
    embedded Ray started and left running: its dashboard and runtime-env agents can outlive a Ray
    shut down soon after its start (measured with Ray 2.60), and a trial server the stop
    could not end dies here rather than outliving the driver. Listed before the shut-down: once the
    raylet is gone its children are no longer this process's descendants. A start `_Owner`
    abandoned is not shut down but killed: every process it started so far."""
    with shutdown.deferred():
        if owner.abandoned:  # Ray is still starting: it cannot be asked to stop
            _kill([], lambda: [p for p in _descendants() if p not in mine])
            # Ray's own exit hook would run ray.shutdown, which waits for the abandoned start if it has
            # reached its connection by then: the driver would not exit.
            atexit.unregister(ray._private.worker.shutdown)
            return
        left = [] if address else [p for p in _descendants() if p not in mine]
        ray.shutdown()
        _take_signals_back()  # ray.shutdown resets SIGTERM to the default action under Python's feet
        owner.release()
        _kill(left)


def _kill(procs: list[psutil.Process], more=lambda: []) -> None:
    """SIGKILL `procs` and whatever `more()` lists, each frozen (SIGSTOP) first and `more()` asked
    again until it lists nothing new: a process that is frozen forks no child that could escape."""
    frozen = {p.pid: p for p in procs}
    new = more()
    for _ in range(20):  # a handful of rounds is enough: frozen processes fork nothing
        if not new:
            break
        for p in new:
            frozen[p.pid] = p
            try:
                p.suspend()
            except psutil.Error:
                pass
        new = [p for p in more() if p.pid not in frozen]
    for p in frozen.values():
        try:
            p.kill()  # psutil checks the pid is still the same process
        except psutil.Error:
            pass
    psutil.wait_procs(list(frozen.values()), timeout=5)
