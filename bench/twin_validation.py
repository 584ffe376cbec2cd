"""How far to trust the twin: calibrate it on 2-3 stored real runs of a set, predict every other run
of the set, and compare with what the real server measured. Side by side in the same run: the
analytic estimate of `plan --what-if` (the roofline, its efficiencies fitted on the same runs) and
the naive predictor (the first calibration run's figures, assumed for every configuration).

The sets are the stored landscapes (bench/landscape.py; each run keeps every request's send,
first-token and end times, and the server's view):
    rag           48 runs, 1 GiB of KV, open loop 3 req/s of ~1,600-token RAG prompts (a CPU ~2.7x slower)
    rag-tight-kv  the same grid and workload in 128 MiB of KV at 4.5 req/s (vLLM preempts in bf16)
    quickstart    the quickstart's four knobs on its own chat workload, 32 in flight (12 runs)
    preempt       a 16 MiB KV pool under 16 chat requests in flight: preemption everywhere (8 runs)
and one measured after the bands were set, shown apart and never pooled into them (`--sets decode-heavy`):
    decode-heavy  the rag grid, 1 GiB of KV, 24 chat clients in a closed loop (48 points, each run 2-3 times)
    quickstart-probe, preempt-probe, rag-probe  those sets measured again, each run followed by its step probe;
                  the first calibration run's probe is fitted with it, as a study fits its baseline's

Calibration: the set's middle configuration, the same with an fp8 KV cache, and (rag sets and
quickstart) one more 16-bit run that differs in what matters most there (prefix caching off; a
small KV pool): at most 3 runs, one per KV dtype plus one. `--choices N` also fits N random valid
calibration choices (the same shape: 2 runs of one dtype and 1 of the other, or 1 and 1) and prints
the median of their errors, so the figure does not rest on a lucky pick.

Per metric: median and 90th-percentile |error| over the predicted runs; the Spearman rank
correlation of the configurations by the set's objective; whether the measured best is in the
twin's top 3; prefix-cache hit rate and preemption count differences. Where a set has repeated
runs (`landscape.py measure --repeats 3 --only ...`), the run-to-run spread of the same
configuration is printed beside: the measurement's own noise floor.

    .venv/bin/python bench/twin_validation.py [--sets rag,rag-tight-kv,quickstart,preempt] [--choices 10]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import landscape  # noqa: E402

METRICS = ("request_throughput", "ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50", "tpot_ms_p95", "e2el_ms_p95", "goodput")
# The objective each set's study would rank by, and the SLOs goodput counts (about half the
# requests of a middle configuration meet them, so goodput moves across the set).
SETS = {
    "rag": {"objective": ("output_throughput", "max"), "slos": "ttft:3000 tpot:100",
            "calibrate": ({"max-num-seqs": 16, "max-num-batched-tokens": 1024, "kv-cache-dtype": "auto",
                           "enable-prefix-caching": True},
                          {"max-num-seqs": 16, "max-num-batched-tokens": 1024, "kv-cache-dtype": "fp8",
                           "enable-prefix-caching": True},
                          {"max-num-seqs": 16, "max-num-batched-tokens": 1024, "kv-cache-dtype": "auto",
                           "enable-prefix-caching": False})},
    "rag-tight-kv": {"objective": ("output_throughput", "max"), "slos": "ttft:500 tpot:20", "calibrate": None},
    "quickstart": {"objective": ("ttft_ms_p95", "min"), "slos": "tpot:50 ttft:1000",
                   "calibrate": ({"max-num-seqs": 16, "gpu-memory-utilization": 0.5, "max-model-len": 8192,
                                  "kv-cache-dtype": "auto"},
                                 {"max-num-seqs": 16, "gpu-memory-utilization": 0.5, "max-model-len": 8192,
                                  "kv-cache-dtype": "fp8"},
                                 {"max-num-seqs": 16, "gpu-memory-utilization": "small", "max-model-len": 2560,
                                  "kv-cache-dtype": "auto"})},
    "preempt": {"objective": ("output_throughput", "max"), "slos": "ttft:4000 tpot:10",
                "calibrate": ({"max-num-seqs": 4, "kv-cache-dtype": "auto"}, {"max-num-seqs": 4, "kv-cache-dtype": "fp8"})},
}
SETS["rag-tight-kv"]["calibrate"] = SETS["rag"]["calibrate"]
# Measured after the bands were set: a set the twin was never tuned on (run it with --sets decode-heavy).
EXTRA_SETS = {"decode-heavy": {"objective": ("goodput", "max"), "slos": "ttft:6000 tpot:15",
                               "calibrate": ({"max-num-seqs": 16, "max-num-batched-tokens": 1024,
                                              "kv-cache-dtype": "auto", "enable-prefix-caching": True},
                                             {"max-num-seqs": 16, "max-num-batched-tokens": 1024,
                                              "kv-cache-dtype": "fp8", "enable-prefix-caching": True})},
              # the quickstart set measured again with the step probe after each run: calibrated as a study
              # calibrates, the first calibration run (the baseline) with its probe (--no-probe: without)
              "quickstart-probe": SETS["quickstart"], "preempt-probe": SETS["preempt"], "rag-probe": SETS["rag"]}


def spec(name: str) -> dict:
    """A set's objective, SLOs and calibration points, whether pooled into the bands or not."""
    return SETS[name] if name in SETS else EXTRA_SETS[name]


@dataclass
class Context:
    name: str
    plan: object
    slos: tuple
    rows: list  # repeat-0 runs
    repeats: dict  # key -> [rows] for configurations measured more than once


def context(name: str) -> Context:
    from optimizer.config.schema import build_config
    from optimizer.driver.plan import prepare
    from optimizer.measure.slo import parse_slos

    (ROOT / "artifacts").mkdir(exist_ok=True)
    plan = prepare(build_config(landscape.config(name)))
    runs = list(landscape.load(name).values())
    rows = [r for r in runs if not r.get("repeat") and r["ok"]]
    repeats: dict = {}
    for r in runs:
        if r["ok"]:
            repeats.setdefault(landscape.key(r["params"]), []).append(r)
    return Context(name, plan, parse_slos(spec(name)["slos"]), rows, {k: v for k, v in repeats.items() if len(v) > 1})


def flags_of(ctx: Context, row: dict) -> dict:
    return dict(row.get("flags") or {**row["params"], **landscape.fixed(ctx.name)})


def records_of(row: dict):
    from optimizer.measure.replay import RequestRecord

    out = []
    for i, (sent, first, end, prompt, output, ok) in enumerate(row["requests"]):
        out.append(RequestRecord(f"req-{i}", sent, sent, first, end, (), prompt, output, output, bool(ok), 200))
    return out


def measured(ctx: Context, row: dict) -> dict:
    from optimizer.measure.slo import good_requests

    m = dict(row["metrics"])
    m["goodput"] = good_requests(ctx.slos, records_of(row)) / m["duration_s"]
    return m


def _device(row: dict):
    from optimizer.engine.device import Device, NodeMemory, read_node_memory

    total = row.get("node_memory_bytes") or read_node_memory().total
    return Device("cpu", 0, NodeMemory(total, total))


def twin_server(ctx: Context, row: dict, kv_cal=None, exact: bool = False):
    """The twin of `row`'s server: its pool from its own log when `exact` (a calibration run), else
    from --kv-cache-memory-bytes or the memory fraction with the calibration runs' KV calibration."""
    from optimizer.twin.server import TwinServer

    log = f"CPU KV cache size: {row['kv_cache_tokens']:,} tokens" if exact and row.get("kv_cache_tokens") else ""
    return TwinServer.from_flags(ctx.plan.model, ctx.plan.server_args(flags_of(ctx, row)), _device(row), log, kv_cal)


def measured_run(ctx: Context, row: dict):
    """A stored run as a calibration run of its own twin server (its pool from its log)."""
    from optimizer.twin.fit import MeasuredRun

    times = [(q[0], q[1], q[2], q[4], q[5]) for q in row["requests"]]
    return MeasuredRun(landscape.key(row["params"]), twin_server(ctx, row, exact=True), ctx.plan.workload.requests, times)


PROBE = {"use": True}  # fit the first calibration run's step probe where the set stored one (--no-probe: not)


def probe_runs(ctx: Context, row: dict, run) -> list:
    """The step probe a stored run sent after its replay, as calibration runs of its server (a study
    fits its baseline's the same way: twin/from_study.py); none where the run stored no probe."""
    from optimizer.twin import probe

    if not row.get("probe") or not PROBE["use"]:
        return []
    groups = probe.for_server(ctx.plan.workload, ctx.plan.server_args(flags_of(ctx, row)), ctx.plan.model.max_positions)
    return probe.measured_runs("run", run.server, groups, row["probe"])


def calibrate(ctx: Context, chosen: list[dict]):
    from optimizer.config import kv_fit
    from optimizer.twin.fit import fit

    runs, kv_cal = [], None
    for i, row in enumerate(chosen):
        runs.append(measured_run(ctx, row))
        if i == 0:  # the baseline: the one run of a study that sends the probe
            runs += probe_runs(ctx, row, runs[0])
        if row.get("kv_cache_tokens"):
            c = kv_fit.Calibration.from_log(ctx.plan.model, _device(row), flags_of(ctx, row),
                                            f"CPU KV cache size: {row['kv_cache_tokens']:,} tokens")
            kv_cal = c if kv_cal is None else kv_cal.merge(c)
    return fit(runs), kv_cal


def predict_twin(ctx: Context, row: dict, cost, kv_cal) -> tuple[dict, dict]:
    from optimizer.twin.prediction import predict

    server = twin_server(ctx, row, kv_cal)
    sim = server.run(ctx.plan.workload.requests, ctx.plan.workload.concurrency, cost)
    p = predict(sim, ctx.slos)
    return {**p.metrics, "goodput": p.goodput}, p.server


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / den if den else math.nan


def objective_value(ctx: Context, m: dict) -> float:
    """Larger is better: the set's objective, with a broken SLO constraint (quickstart's TPOT) ranked last."""
    metric, direction = spec(ctx.name)["objective"]
    value = m[metric] if direction == "max" else -m[metric]
    if ctx.name.startswith("quickstart") and m.get("tpot_ms_p95", 0) > 50:
        value -= 1e9
    return value


POOLED: dict = {k: [] for k in METRICS}  # every twin |error| of the prescribed calibrations, for the bands
# The same errors split by the envelope's batch rule (twin/envelope.py): a prediction running more
# sequences at once than any calibration run held, by more than a quarter, against the others.
BATCH_SPLIT: dict = {side: {k: [] for k in METRICS} for side in ("inside", "outside")}


def _p90(e: list[float]) -> float:
    e = sorted(e)
    return e[min(len(e) - 1, math.ceil(0.9 * len(e)) - 1)]


def errors(pred: list[dict], meas: list[dict], pool: dict | None = None) -> dict:
    out = {}
    for k in METRICS:
        e = sorted(abs(p[k] / m[k] - 1) for p, m in zip(pred, meas) if m.get(k) and p.get(k) is not None
                   and math.isfinite(p[k]))
        if pool is not None:
            pool[k] += e
        out[k] = (statistics.median(e), _p90(e)) if e else (math.nan, math.nan)
    return out


@dataclass
class Outcome:
    twin: dict
    naive: dict
    analytic: dict
    rho: dict
    top3: dict
    pick: dict  # the measured objective of each predictor's top pick, as a ratio to the measured best
    prefix: float
    preempt: float
    fit_s: float
    predict_s: float
    n: int
    by_batch: dict = field(default_factory=dict)  # signed_by_batch of the twin's predictions
    rho_mean: float | None = None  # the twin's Spearman against each configuration's mean over its runs
    top3_mean: bool | None = None  # the best by that mean in the twin's top 3


SIGNED = ("request_throughput", "tpot_ms_p50")


def signed_by_batch(params: list[dict], preds: list[dict], meas: list[dict]) -> dict:
    """{(max-num-seqs, KV dtype family): the predictions' geometric-mean ratio to the measured, minus 1, of
    each SIGNED metric}. A bias the |error| medians hide: a step's fixed and per-sequence costs split
    wrongly shows as errors of opposite sign at batches below and above the calibration's."""
    from optimizer.twin.step_cost import is_fp8  # noqa: PLC0415

    groups: dict = {}
    for p, x, m in zip(params, preds, meas):
        family = "fp8" if is_fp8(p.get("kv-cache-dtype")) else "16-bit"
        logs = [math.log(x[k] / m[k]) if (x.get(k) or 0) > 0 and (m.get(k) or 0) > 0 else None for k in SIGNED]
        groups.setdefault((p.get("max-num-seqs") or 0, family), []).append(logs)
    return {g: tuple(math.exp(statistics.fmean(got)) - 1 if (got := [v[i] for v in rows if v[i] is not None]) else math.nan
                     for i in range(len(SIGNED)))
            for g, rows in sorted(groups.items())}


def validate(ctx: Context, chosen: list[dict], analytic: bool = True, pool: dict | None = None) -> Outcome:
    from bench_analytic import AnalyticFit  # noqa: PLC0415

    t = time.monotonic()
    fitted, kv_cal = calibrate(ctx, chosen)
    fit_s = time.monotonic() - t
    keys = {landscape.key(r["params"]) for r in chosen}
    dtypes = {r["params"]["kv-cache-dtype"] for r in chosen}  # a dtype no run calibrated is outside the envelope
    targets = [r for r in ctx.rows if landscape.key(r["params"]) not in keys and r["params"]["kv-cache-dtype"] in dtypes]
    t = time.monotonic()
    preds, servers = zip(*(predict_twin(ctx, r, fitted.cost, kv_cal) for r in targets))
    predict_s = time.monotonic() - t
    meas = [measured(ctx, r) for r in targets]
    base = measured(ctx, chosen[0])
    naive = [base] * len(targets)
    ana = AnalyticFit(ctx, chosen, sys.modules[__name__]).predict_all(targets) if analytic else naive
    out = {}
    for label, p in (("twin", preds), ("naive", naive), ("analytic", ana)):
        vals_p = [objective_value(ctx, x) for x in p]
        vals_m = [objective_value(ctx, x) for x in meas]
        best = max(range(len(meas)), key=lambda i: vals_m[i])
        top = sorted(range(len(p)), key=lambda i: -vals_p[i])[:3]
        metric = spec(ctx.name)["objective"][0]
        ratio = meas[top[0]][metric] / meas[best][metric]
        out[label] = (errors(p, meas, pool if label == "twin" else None), spearman(vals_p, vals_m), best in top, ratio)
    rho_mean, top3_mean = _against_means(ctx, targets, [objective_value(ctx, x) for x in preds])
    if pool is not None:
        _split_by_batch(ctx, chosen, fitted.cost, preds, servers, meas)
    prefix = max(abs(s["prefix_cache_hit_rate"] - r["server"]["prefix_cache_hit_rate"]) for s, r in zip(servers, targets))
    preempt = max(abs(s["preemptions"] - r["server"]["preemptions"]) for s, r in zip(servers, targets))
    return Outcome(out["twin"][0], out["naive"][0], out["analytic"][0], {k: v[1] for k, v in out.items()},
                   {k: v[2] for k, v in out.items()}, {k: v[3] for k, v in out.items()}, prefix, preempt, fit_s, predict_s,
                   len(targets), signed_by_batch([r["params"] for r in targets], list(preds), meas), rho_mean, top3_mean)


def _against_means(ctx: Context, targets: list, vals_p: list) -> tuple[float | None, bool | None]:
    """The twin's Spearman against each predicted configuration's objective averaged over all its runs,
    and whether the best by that average is in its top 3: the ranking with the run-to-run noise averaged
    down. (None, None) unless every predicted configuration was measured more than once."""
    runs = [ctx.repeats.get(landscape.key(r["params"])) for r in targets]
    if not all(runs):
        return None, None
    vals_m = [statistics.fmean(objective_value(ctx, measured(ctx, x)) for x in rs) for rs in runs]
    best = max(range(len(vals_m)), key=lambda i: vals_m[i])
    return spearman(vals_p, vals_m), best in sorted(range(len(vals_p)), key=lambda i: -vals_p[i])[:3]


def _split_by_batch(ctx: Context, chosen: list[dict], cost, preds, servers, meas) -> None:
    """Each prediction's errors into BATCH_SPLIT, by the batch rule against the calibration's largest
    batch as `simulate` takes it (from_study.Calibrated.largest_batch: the larger of the run's sampled
    running peak and the twin's own run of it at its send times)."""
    from optimizer.twin.envelope import BATCH_FACTOR

    held = 0.0
    for row in chosen:
        sim = twin_server(ctx, row, exact=True).run(ctx.plan.workload.requests, None, cost,
                                                    send_times=[q[0] for q in row["requests"]])
        held = max(held, sim.server["running_peak"], row["server"].get("running_peak") or 0)
    for p, s, m in zip(preds, servers, meas):
        side = "outside" if s["running_peak"] > held * BATCH_FACTOR else "inside"
        for k in METRICS:
            if m.get(k) and p.get(k) is not None and math.isfinite(p[k]):
                BATCH_SPLIT[side][k].append(abs(p[k] / m[k] - 1))


def chosen_rows(ctx: Context, specs) -> list[dict]:
    rows = []
    for spec in specs:
        match = [r for r in ctx.rows if all(r["params"].get(k) == v for k, v in spec.items())]
        if not match:
            raise SystemExit(f"{ctx.name}: no stored run matches the calibration point {spec}")
        rows.append(match[0])
    return rows


def furthest_batch(ctx: Context, chosen: list[dict]) -> dict:
    """The stored run whose running peak lies furthest (by ratio) from every chosen run's; the first such."""
    peaks = [r["server"]["running_peak"] for r in chosen]
    return max((r for r in ctx.rows if r not in chosen),
               key=lambda r: min(abs(math.log(r["server"]["running_peak"] / p)) for p in peaks))


def random_choice(ctx: Context, rng: random.Random, like: list[dict]) -> list[dict]:
    """A calibration of the same shape as `like`: as many runs of each KV dtype, picked at random."""
    out = []
    for row in like:
        dtype = row["params"]["kv-cache-dtype"]
        pool = [r for r in ctx.rows if r["params"]["kv-cache-dtype"] == dtype and r not in out]
        out.append(rng.choice(pool))
    return out


def noise_floor(ctx: Context) -> dict | None:
    """Per metric, over every configuration measured more than once: the median |log ratio| of its
    runs to their geometric mean, as a relative spread (exp - 1); and, under `repeat_predicts`, the
    median |error| of predicting each run by the geometric mean of the configuration's other runs:
    what booting the same configuration again predicts, an error measured like the twin's."""
    if not ctx.repeats:
        return None
    spread = {k: [] for k in METRICS}
    again = {k: [] for k in METRICS}
    for runs in ctx.repeats.values():
        ms = [measured(ctx, r) for r in runs]
        for k in METRICS:
            vals = [m[k] for m in ms if m.get(k)]
            if len(vals) > 1:
                mean = statistics.fmean(math.log(v) for v in vals)
                spread[k] += [abs(math.log(v) - mean) for v in vals]
                for i, v in enumerate(vals):
                    others = statistics.fmean(math.log(x) for j, x in enumerate(vals) if j != i)
                    again[k].append(abs(math.exp(others) / v - 1))
    return {k: (math.expm1(statistics.median(v)) if v else math.nan) for k, v in spread.items()} | {
        "repeat_predicts": {k: (statistics.median(v) if v else math.nan) for k, v in again.items()},
        "configurations": len(ctx.repeats), "runs": sum(len(v) for v in ctx.repeats.values())}


def noise_spearman(ctx: Context, draws: int = 200) -> float | None:
    """The Spearman a perfect predictor would reach against one run of each configuration, on this
    set's noise: each configuration's objective moved by the repeats' own spread (the standard
    deviation of log(run / its configuration's mean)), median over `draws` seeded draws. Where
    many configurations tie, this is the ceiling, not 1."""
    if not ctx.repeats:
        return None
    metric, direction = spec(ctx.name)["objective"]
    sign = 1 if direction == "max" else -1
    logs = []
    for runs in ctx.repeats.values():
        vals = [measured(ctx, r)[metric] for r in runs]
        if len(vals) > 1 and all(v > 0 for v in vals):
            mean = statistics.fmean(math.log(v) for v in vals)
            logs += [math.log(v) - mean for v in vals]
    if len(logs) < 3:
        return None
    sigma = statistics.pstdev(logs)
    truth = [measured(ctx, r)[metric] for r in ctx.rows]
    rng = random.Random(0)
    return statistics.median(spearman([sign * t for t in truth], [sign * t * math.exp(rng.gauss(0, sigma)) for t in truth])
                             for _ in range(draws))


def show(ctx: Context, o: Outcome, chosen: list[dict], spread: dict | None) -> None:
    print(f"\n== {ctx.name}: calibrated on {len(chosen)} run(s), {o.n} predicted; fit {o.fit_s:.1f} s, "
          f"{o.n} predictions {o.predict_s:.1f} s")
    for i, r in enumerate(chosen):
        probed = " and its step probe" if i == 0 and r.get("probe") and PROBE["use"] else ""
        print(f"   calibration: {r['params']}{probed}{' (' + r['cpu'] + ')' if r.get('cpu') else ''}")
    head = f"   {'metric':<20}{'twin med':>9}{'p90':>7}{'analytic':>10}{'p90':>7}{'naive':>8}{'p90':>7}"
    print(head + ("  run-to-run  a repeat" if spread else ""))
    for k in METRICS:
        line = f"   {k:<20}" + "".join(f"{a:>9.1%}{b:>7.1%}" for a, b in (o.twin[k], o.analytic[k], o.naive[k]))
        if spread:
            line += f"  {spread[k]:>9.1%}  {spread['repeat_predicts'][k]:>7.1%}"
        print(line)
    print(f"   Spearman by {spec(ctx.name)['objective'][0]}: twin {o.rho['twin']:.2f}, analytic "
          f"{o.rho['analytic']:.2f}, naive {o.rho['naive']:.2f}; measured best in top 3: twin {o.top3['twin']}, "
          f"analytic {o.top3['analytic']}; each one's top pick measured {o.pick['twin']:.2f}x / "
          f"{o.pick['analytic']:.2f}x the measured best's {spec(ctx.name)['objective'][0]}")
    print(f"   prefix-cache hit rate: max |difference| {o.prefix:.3f}; preemptions: max |difference| {o.preempt:.0f}")
    print("   the twin's signed error by max-num-seqs and KV dtype (throughput, TPOT p50): " + "; ".join(
        f"{seqs} {family} {t:+.1%}, {u:+.1%}" for (seqs, family), (t, u) in o.by_batch.items()))
    if spread:
        print(f"   run-to-run: {spread['configurations']} configurations, {spread['runs']} runs (the spread around "
              "their mean; `a repeat`: each run predicted by the mean of its configuration's other runs)")
        if o.rho_mean is not None:
            print(f"   against each configuration's mean over its runs: Spearman {o.rho_mean:.2f}; the best by that "
                  f"mean in the twin's top 3: {o.top3_mean}")
        ceiling = noise_spearman(ctx)
        if ceiling is not None:
            print(f"   Spearman a perfect predictor reaches against one run of each configuration, on this noise: "
                  f"{ceiling:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join([*SETS, *EXTRA_SETS])}")
    p.add_argument("--choices", type=int, default=0, help="also fit N random calibration choices of the same shape")
    p.add_argument("--no-analytic", action="store_true")
    p.add_argument("--no-probe", action="store_true", help="leave out the step probe a set's runs stored")
    p.add_argument("--furthest-batch", action="store_true", help="calibrate on the first two calibration runs and the "
                   "stored run whose running peak lies furthest from theirs (a rule tried for `simulate`, not kept)")
    p.add_argument("--one-run", action="store_true", help="calibrate on the first calibration run alone (the baseline: "
                   "what `simulate` has after one boot); its pooled 90th percentiles are the one-run bands")
    ns = p.parse_args()
    PROBE["use"] = not ns.no_probe
    for name in ns.sets.split(","):
        ctx = context(name)
        if not ctx.rows:
            print(f"\n== {name}: no stored runs (bench/landscape.py measure --landscape {name})")
            continue
        chosen = chosen_rows(ctx, spec(name)["calibrate"])
        if ns.one_run:
            chosen = chosen[:1]
        elif ns.furthest_batch:
            chosen = chosen[:2] + [furthest_batch(ctx, chosen[:2])]
        pool = None if name in EXTRA_SETS else POOLED  # a set measured after the bands stays out of them
        show(ctx, validate(ctx, chosen, not ns.no_analytic, pool), chosen, noise_floor(ctx))
        if ns.choices:
            rng = random.Random(0)
            outs = [validate(ctx, random_choice(ctx, rng, chosen), analytic=False) for _ in range(ns.choices)]
            print(f"   over {ns.choices} random calibration choices, the median of each figure:")
            for k in METRICS:
                print(f"   {k:<20}{statistics.median(o.twin[k][0] for o in outs):>9.1%}"
                      f"{statistics.median(o.twin[k][1] for o in outs):>7.1%}")
            print(f"   Spearman median {statistics.median(o.rho['twin'] for o in outs):.2f}; measured best in top 3 "
                  f"in {sum(o.top3['twin'] for o in outs)} of {ns.choices}")
    if not POOLED["request_throughput"]:
        return
    print(f"\n== pooled over the sets ({len(POOLED['request_throughput'])} predictions): the twin's median and "
          "90th-percentile |error|, the band simulate prints (twin/prediction.py BAND)")
    for k, e in POOLED.items():
        if e:
            print(f"   {k:<20}{statistics.median(e):>9.1%}{_p90(e):>7.1%}")
    inside, outside = BATCH_SPLIT["inside"], BATCH_SPLIT["outside"]
    if inside["request_throughput"] and outside["request_throughput"]:
        print(f"\n   split by the envelope's batch rule: {len(inside['request_throughput'])} predictions inside, "
              f"{len(outside['request_throughput'])} running a batch past the calibration's (median |error|)")
        for k in METRICS:
            if inside[k] and outside[k]:
                print(f"   {k:<20}{statistics.median(inside[k]):>9.1%}{statistics.median(outside[k]):>9.1%}")


if __name__ == "__main__":
    main()
