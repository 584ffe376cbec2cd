"""The twin's speed: 12,000 chat requests (10 minutes of traffic at 20 req/s, Poisson) through
vLLM's own scheduler on one core, against the 600 s the same traffic takes to replay for real.

The step costs are round numbers of a server that keeps up with the load: `--step-ms` a step (3 by
default: a small model on a fast GPU; 12 is an 8B model's decode step on an H100-class GPU), 0.1 ms
a decoding sequence, 10 us a prompt token. The twin's own cost is per engine step (vLLM's
schedule() and update_from_output()), so a faster server takes more steps for the same traffic and
longer to simulate. Prints the wall time, the engine steps and requests per second of wall time,
and the ratio to the traffic's own duration; then, as the reference in the same run, the same
replay calling vLLM's scheduler on every step (no decode stretches, twin/decode_stretch.py), and
whether the two agree exactly.

    .venv/bin/python bench/twin_speed.py [--requests 12000] [--rate 20] [--step-ms 3] [--core 1] [--no-reference]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=12000)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--core", type=int, default=os.cpu_count() - 1)
    p.add_argument("--no-reference", action="store_true", help="skip the every-step reference run")
    ns = p.parse_args()
    os.sched_setaffinity(0, {ns.core})

    from optimizer.config.model_info import load_model_info
    from optimizer.config.schema import build_config
    from optimizer.driver.plan import load_workload
    from optimizer.measure.metrics import summarize
    from optimizer.twin.server import TwinServer
    from optimizer.twin.step_cost import LinearStepCost

    cfg = build_config({"model": {"path": str(ROOT / "models" / "tiny-llama"), "tiny": True},
                        "workload": {"scenario": "chat", "seed": 1, "requests": ns.requests, "warmup_requests": 0,
                                     "long_share": 0.1, "arrival": {"process": "poisson", "rate": ns.rate}}})
    t = time.monotonic()
    model, workload = load_workload(cfg)
    made = time.monotonic() - t
    model = load_model_info(model.source, "bfloat16")
    server = TwinServer.from_flags(model, ["--max-model-len", "8192", "--kv-cache-memory-bytes", str(4 << 30)])
    cost = LinearStepCost((ns.step_ms / 1000, 1e-5, 1e-6, 1e-4, 1e-5, 1e-5, 1e-5, 1e-6, 1e-5, 1e-5), 0.002)
    t = time.monotonic()
    sim = server.run(workload.requests, workload.concurrency, cost)
    wall = time.monotonic() - t
    m = summarize(sim.result)
    traffic = max(r.offset_s for r in workload.requests)
    print(f"{ns.requests:,} requests over {traffic:.0f} s of traffic ({ns.rate:g} req/s), one core ({ns.core}), "
          f"{ns.step_ms:g} ms a step:")
    print(f"  simulated in {wall:.2f} s: {sim.steps:,} engine steps ({sim.steps / wall:,.0f} a second), "
          f"{ns.requests / wall:,.0f} requests a second; {traffic / wall:.0f}x faster than replaying it for real")
    print(f"  (the workload's materialization, outside the twin: {made:.1f} s)")
    print(f"  the simulated server: {m['request_throughput']:.1f} req/s, TPOT p50 {m['tpot_ms_p50']:.1f} ms, "
          f"TTFT p95 {m['ttft_ms_p95']:.0f} ms, running peak {sim.server['running_peak']}")
    if ns.no_reference:
        return
    t = time.monotonic()
    ref = server.run(workload.requests, workload.concurrency, cost, stretches=False)
    ref_wall = time.monotonic() - t
    agree = ref.result == sim.result and ref.server == sim.server and ref.steps == sim.steps
    print(f"  reference, vLLM's scheduler called on every step: {ref_wall:.2f} s ({ref_wall / wall:.2f}x the time); "
          f"results {'identical' if agree else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
