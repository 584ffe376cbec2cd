"""The Ray runtime for trials: an embedded local instance by default, a cluster when named.

`ray.init(address="local")` always starts a fresh local instance; a bare `ray.init()`
would try to join a cluster a past `ray start` left in /tmp/ray (docs/vllm-facts.md#embedded-ray). Trials are
tasks with `max_retries=0`: the driver decides what to retry, so no trial runs twice unseen.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import threading
import time
from contextlib import contextmanager

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


def reap_server(board, number: int, timeout: float = 10.0, settle: float = 0.0) -> str:
    """Stop the server of a trial whose worker died before stopping it, if it still runs on this
    host: REAPED, GONE or UNKNOWN (then the caller tries the run-state file's record). `settle`:
    how long its guard is given to stop it first (it SIGKILLs after lifeline.GRACE_S).

    The second line of defence: the server's own guard stops its group when the worker dies, on
    every node. Ray's cleanup would not: measured with ray 2.60, neither
    `RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper` nor the worker's direct-child
    cleanup kills a server in its own process group, which it must be (to be stopped as a whole)."""
    try:
        where = ray.get(board.server_of.remote(number), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return UNKNOWN  # Ray itself is gone; the trial's user attrs still name the server
    if where is None or where[0] != socket.gethostname():
        return UNKNOWN
    end = time.monotonic() + settle
    while group_pids(where[1]) and time.monotonic() < end:
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


def _start_embedded() -> None:
    """Start the embedded local Ray, once more after a failed start (Ray's own start-up timeout
    fires on a machine busy enough: "The current node timed out during startup")."""
    for attempt in range(1, EMBEDDED_TRIES + 1):
        try:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     log_to_driver=False, object_store_memory=256 * 1024**2)
            return
        except SystemExit:
            raise
        except Exception:  # noqa: BLE001 - see ray_runtime
            ray.shutdown()
            if attempt == EMBEDDED_TRIES:
                raise
            time.sleep(2.0)


@contextmanager
def ray_runtime(address: str | None, on_start=None):
    """Start (or join) Ray for the duration of a study; shut it down afterwards. `on_start` is
    called once Ray is up (the run-state records the embedded instance's processes)."""
    address = address or os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            # Ray 2.x turns token authentication on for a local cluster and says so at every start;
            # the operator has nothing to do about it (the embedded cluster is this process's own).
            logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)
            logging.getLogger(RAY_WORKER_LOGGER).setLevel(logging.WARNING)  # "Started a local Ray instance."
            _start_embedded()
    except SystemExit as exc:  # a stop signal inside ray.init met Ray's own handler (sys.exit(signum))
        if exc.code not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            raise
        shutdown.install(clear=False)
        shutdown.requested.set()
        ray.shutdown()
        raise KeyboardInterrupt from exc  # stopped like any other stop: `run` 130, the daemon 0
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, or a bare Exception
        if address:
            raise RayUnavailable(f"ray: cannot reach cluster at '{address}' ({first_line(exc)}); "
                                 "check --ray-address, or leave it out to run on this machine") from exc
        raise RayUnavailable(f"ray: the embedded local Ray did not start ({first_line(exc)}); "
                             "check free memory and /tmp space, or run `ray stop --force`") from exc
    if threading.current_thread() is threading.main_thread():
        shutdown.install(clear=False)  # take SIGTERM back from Ray (shutdown.py)
    try:
        if on_start and not address:
            on_start()
        yield
    finally:
        ray.shutdown()
