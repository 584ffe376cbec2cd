"""The daemon's forecast against measurement: when the traffic changes, does production's
configuration still hold the SLOs? (daemon/forecast.py)

Generation 1 is a one-trial study of the quickstart's baseline flags (eager, to keep the boot
short) on traffic A: the quickstart's chat workload as an open-loop Poisson stream at `--rate`.
Its stored run calibrates the twin, exactly as the daemon's next generation does. Then, for each
new traffic below, the daemon's own `forecast` predicts the baseline on it, nothing booted; and
the same flags, booted once, replay that traffic for the measurement:

    A x0.5, A x2, A x3      the same requests, slower or faster
    short chat              short prompts and outputs, 3x A's rate
    long documents          60% of prompts 1,024-2,048 tokens
    long answers            outputs of 256-512 tokens

Prints, per traffic: p95 TTFT and p95 TPOT predicted (with the band) and measured, the |error|
(log scale), and the verdict on the SLOs (`--slos`) predicted and measured; then the line the
daemon prints for each forecast.

    .venv/bin/python bench/daemon_forecast.py [--rate 3] [--slos "ttft:300 tpot:50"] [--requests 64]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _traffics(quick: dict, rate: float, n: int) -> dict:
    a = {**quick["workload"], "requests": n, "warmup_requests": 4, "arrival": {"process": "poisson", "rate": rate}}
    new = {
        "A x0.5": {**a, "arrival": {"process": "poisson", "rate": rate / 2}},
        "A x2": {**a, "arrival": {"process": "poisson", "rate": 2 * rate}},
        "A x3": {**a, "arrival": {"process": "poisson", "rate": 3 * rate}},
        "short chat": {**a, "long_share": 0.0, "short_input": [16, 64], "output": [16, 64],
                       "arrival": {"process": "poisson", "rate": 3 * rate}},
        "long documents": {**a, "long_share": 0.6, "long_input": [1024, 2048]},
        "long answers": {**a, "output": [256, 512]},
    }
    # Each traffic its own prompts (seed): one booted server replays them all, and a prompt replayed
    # again would hit its prefix cache, where a trial's fresh server would not.
    return {name: {**w, "seed": a["seed"] + 1 + i} for i, (name, w) in enumerate(new.items())}, a


def _config(root: Path, name: str, model: str, baseline: dict, workload: dict, slos: str) -> dict:
    return {"study_name": name, "storage": f"sqlite:///{root / 'trials.db'}", "artifacts_dir": str(root / "artifacts"),
            "n_trials": 1, "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
            "baseline": baseline, "space": {"max-num-seqs": {"low": 4, "high": 128}}, "workload": workload,
            "objective": {"name": "latency", "metric": "ttft_p95", "slos": slos},
            "early_stop": {"enabled": False}, "confirm": {"top": 0, "minimal": False},
            "engine": {"extra_args": ["--enforce-eager"]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--slos", default="ttft:300 tpot:50")
    p.add_argument("--requests", type=int, default=64)
    ns = p.parse_args()

    from optimizer.config.schema import build_config
    from optimizer.daemon.forecast import forecast
    from optimizer.driver.plan import prepare
    from optimizer.engine.tiny_model import write_tiny_model
    from optimizer.engine.vllm import VllmServer
    from optimizer.measure.metrics import summarize
    from optimizer.measure.replay import run_replay
    from optimizer.measure.slo import holds
    from optimizer.testing.memory import memory_fraction

    root = Path(tempfile.mkdtemp(prefix="forecast-"))
    quick = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    model = str(write_tiny_model(root / "tiny"))
    baseline = {**quick["baseline"], "gpu-memory-utilization": memory_fraction(1.0)}
    traffics, a = _traffics(quick, ns.rate, ns.requests)
    path = root / "g1.yaml"
    path.write_text(yaml.safe_dump(_config(root, "g1", model, baseline, a, ns.slos)))
    subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)], check=True, cwd=root,
                   stdout=subprocess.DEVNULL)
    g1 = prepare(build_config(yaml.safe_load(path.read_text())))
    rows = []
    with VllmServer(model, g1.server_args(baseline), root / "measure.log") as srv:
        run_replay(srv.base_url, model, g1.workload.warmup, len(g1.workload.warmup))
        for name, workload in traffics.items():
            plan = prepare(build_config(_config(root, f"g2-{name.replace(' ', '-')}", model, baseline, workload,
                                                ns.slos)))
            f = forecast(g1, plan, "the baseline", baseline)
            real = summarize(run_replay(srv.base_url, model, plan.workload.requests, None))
            slos = tuple(s for s in plan.objective.slos if s.metric != "error")
            rows.append((name, f, real, "holds" if holds(slos, real) else "breaks"))
    print(f"generation 1: traffic A ({ns.requests} chat requests, Poisson {ns.rate:g} req/s), the quickstart's "
          f"baseline flags, eager; calibrated on {rows[0][1].calibrated_on}; SLOs {ns.slos}")
    print(f"{'new traffic':<16} {'p95 TTFT ms: forecast [band]':>30} {'measured':>9} {'|err|':>6} "
          f"{'p95 TPOT: forecast':>19} {'measured':>9} {'|err|':>6}  verdict: forecast / measured")
    errors, right = [], 0
    for name, f, real, verdict in rows:
        cells = []
        for m in ("ttft_ms_p95", "tpot_ms_p95"):
            v, lo, hi = f.metrics[m]
            e = 100 * abs(math.log(v / real[m])) if v and real.get(m) else math.nan
            cells.append((v, lo, hi, real.get(m), e))
        errors.append(cells[0][4])
        right += f.verdict == verdict
        (tv, tlo, thi, tr, te), (pv, _, _, pr, pe) = cells
        print(f"{name:<16} {f'{tv:.0f} [{tlo:.0f}, {thi:.0f}]':>30} {tr:9.0f} {te:5.0f}% {pv:19.1f} {pr:9.1f} "
              f"{pe:5.0f}%  {f.verdict}{'' if f.sure else ' (unsure)'} / {verdict}")
    print(f"verdict right in {right} of {len(rows)}; p95 TTFT |error| median {statistics.median(errors):.0f}%, "
          f"largest {max(errors):.0f}%")
    print("the daemon's console line for each forecast:")
    for name, f, _, _ in rows:
        print(f"  {name}: {f.describe()}")


if __name__ == "__main__":
    main()
