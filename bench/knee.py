"""The knee `plan` predicts against one measured rate sweep, on the quickstart's workload.

A one-trial study of the quickstart's baseline (the tiny model, its 96-request chat workload, 32
in flight; eager, to keep the boot short: the twin is calibrated on and compared with the same
server) gives the run the twin is calibrated on. Then the same configuration is booted once and
the workload's requests are replayed as an open-loop Poisson stream (twin/peak/tails.py open_loop) at
rising rates, a share of the measured saturation each, its prefix cache emptied before each rate
(vLLM's dev-mode /reset_prefix_cache, as a goodput trial's rate search does: the same prompts
again would hit the cache, where a fresh server, and the twin, would not); the twin predicts the
same rates. The knee is where p95 TTFT crosses the SLO (`--slo-ms`): measured, by log-linear interpolation between
the two sweep points around the crossing; predicted, by the twin's bisection (twin/peak/tails.py).
Prints each rate's measured and predicted p95 TTFT, the two knees and their ratio.

    .venv/bin/python bench/knee.py [--slo-ms 300] [--shares 0.3,0.5,0.6,0.7,0.8,0.9,1.0,1.1]
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


def _crossing(points: list[tuple[float, float]], limit: float) -> float | None:
    """The rate where p95 TTFT first reaches `limit`, log-linear between the sweep points around it."""
    for (r0, t0), (r1, t1) in zip(points, points[1:]):
        if t0 <= limit < t1:
            return r0 + (r1 - r0) * (math.log(limit) - math.log(t0)) / (math.log(t1) - math.log(t0))
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slo-ms", type=float, default=300.0)
    p.add_argument("--shares", default="0.3,0.5,0.6,0.7,0.8,0.9,1.0,1.1")
    ns = p.parse_args()

    from optimizer.config.schema import load_config
    from optimizer.driver.plan import prepare
    from optimizer.engine.vllm import VllmServer
    from optimizer.measure.metrics import summarize
    from optimizer.measure.replay import run_replay
    from optimizer.measure.slo import parse_slos
    from optimizer.trial.rate_search import at_rate
    from optimizer.trial.stages import reset_prefix_cache
    from optimizer.twin.from_study import calibrate, stored_runs
    from optimizer.twin.server import TwinServer
    from optimizer.twin.peak.tails import open_loop, tails

    root = Path(tempfile.mkdtemp(prefix="knee-"))
    plan = prepare(load_config(str(one_trial_study(root, "knee"))))
    runs = stored_runs(plan.artifacts)
    cal = calibrate(plan, runs)
    params = runs[0].params
    twin = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, runs[0].log_text, cal.kv_calibration)
    slos = parse_slos(f"ttft:{ns.slo_ms:g}")
    predicted = tails(twin, cal.cost, plan.workload.requests, 1.0, slos)
    stream = open_loop(plan.workload.requests)
    rates = [float(s) * predicted.ceiling for s in ns.shares.split(",")]
    sweep = []
    with VllmServer(plan.model.source, plan.server_args(params), root / "sweep.log",
                    env={"VLLM_SERVER_DEV_MODE": "1"}) as srv:
        run_replay(srv.base_url, plan.model.source, plan.workload.warmup, len(plan.workload.warmup))
        for rate in rates:
            if not reset_prefix_cache(srv.base_url):
                raise RuntimeError("the server refused to empty its prefix cache")
            real = summarize(run_replay(srv.base_url, plan.model.source, at_rate(stream, rate), None))
            sim = summarize(twin.run(at_rate(stream, rate), None, cal.cost).result)
            sweep.append((rate, real["ttft_ms_p95"], sim["ttft_ms_p95"], real["request_throughput"]))
    print(f"the quickstart's workload ({len(stream)} requests, Poisson), its baseline flags, eager; twin calibrated "
          f"on trial 0 (closed loop, {runs[0].params['max-num-seqs']} sequences); SLO p95 TTFT {ns.slo_ms:g} ms")
    print(f"{'rate':>8} {'measured p95 TTFT':>18} {'twin p95 TTFT':>14} {'measured req/s':>15}")
    for rate, real, sim, thr in sweep:
        print(f"{rate:8.2f} {real:18.0f} {sim:14.0f} {thr:15.2f}")
    measured = _crossing([(r, t) for r, t, _, _ in sweep], ns.slo_ms)
    print(f"knee: twin {predicted.knee:.2f} req/s (saturation {predicted.ceiling:.2f}); measured "
          + (f"{measured:.2f} req/s; twin / measured = {predicted.knee / measured:.2f}" if measured else
             "not crossed within the sweep"))


if __name__ == "__main__":
    main()
