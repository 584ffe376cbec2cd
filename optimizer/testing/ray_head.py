"""A throwaway Ray head on this machine, as `ray start --head` makes one, and its clean stop.

Used by the job-submission test and bench: free ports, its own `--temp-dir` (so no stale
/tmp/ray/ray_current_cluster is left behind), the dashboard and job API on 127.0.0.1, and token
auth on (started with RAY_AUTH_MODE=token, which its clients need too). Stopping
kills the head's own processes, those naming its temp dir or its GCS port and their children
(workers, a job's driver, a trial's vLLM), never another Ray on the machine: `ray stop --force`
would kill every Ray process here, including another study's embedded one.

`ray start --head` returns before the head's dashboard agent has registered: a job submitted in
that gap is refused with "No available agent to submit job, please try again later" (seen on a
loaded CI machine). `submit` retries that one refusal until its deadline.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Head:
    temp_dir: str
    gcs_port: int
    dashboard_port: int
    env: dict  # the environment its clients (`ray job ...`) run with

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"


def start(temp_dir: str, timeout: float = 120.0) -> Head:
    """`ray start --head` on free ports; raises RuntimeError with Ray's output if it fails."""
    gcs, dashboard = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token"}
    cmd = [str(RAY), "start", "--head", "--port", str(gcs), "--dashboard-port", str(dashboard),
           "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--temp-dir", temp_dir,
           "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
           "--disable-usage-stats"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"ray start --head failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    return Head(temp_dir, gcs, dashboard, env)


NO_AGENT = "No available agent to submit job"


def submit(head: Head, args: list[str], timeout: float = 120.0, **run_kw) -> subprocess.CompletedProcess:
    """`ray job submit --address <head> *args`, retried while the head has no job agent yet
    (every 2 s, up to `timeout`); returns the last attempt. `run_kw` goes to subprocess.run."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run([str(RAY), "job", "submit", "--address", head.address, *args], capture_output=True,
                              text=True, env=head.env, **run_kw)
        if done.returncode == 0 or NO_AGENT not in done.stdout + done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(2.0)


def add_node(head: Head, resources: dict, num_cpus: int = 1, env: dict | None = None, timeout: float = 120.0) -> None:
    """A second node of the head's cluster on this machine (`ray start --address`), with its own
    raylet and `resources`, started with `env` added (e.g. Ray's RAY_* settings); `stop(head)`
    stops it with the head."""
    cmd = [str(RAY), "start", "--address", f"127.0.0.1:{head.gcs_port}", "--num-cpus", str(num_cpus),
           "--resources", json.dumps(resources), "--object-store-memory", str(256 * 1024**2),
           "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()),
           "--disable-usage-stats"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**head.env, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"ray start --address failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")


def processes(head: Head) -> set[psutil.Process]:
    """The head's processes and all their children."""
    addr = re.compile(rf"^--(gcs[-_])?address=\S+:{head.gcs_port}$")
    roots = [p for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid()
             and any(head.temp_dir in a or addr.match(a) for a in (p.info["cmdline"] or []))]
    found = set(roots)
    for p in roots:
        try:
            found.update(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return found


def stop(head: Head, timeout: float = 20.0) -> set[psutil.Process]:
    """Kill the head's processes; returns those still there afterwards (empty when clean)."""
    procs = processes(head)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(procs), timeout=timeout)
    return set(alive) | processes(head)
