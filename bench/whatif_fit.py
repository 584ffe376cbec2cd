"""Fit the roofline's efficiencies (whatif/roofline.py: bandwidth, compute, per-layer and per
all-reduce costs) on published measurements, and print them with the rows they rest on.

Fitted on the rows of bench/data/published_vllm.csv that aiconfigurator's authors measured
(H100, H200, B200; dense and mixture-of-experts models; closed loops at a fixed concurrency):
the grid's point with the smallest median |log(predicted / measured)| over TTFT and TPOT
together. The other rows are never fitted on: bench/whatif_validation.py reports on them.

    .venv/bin/python bench/whatif_fit.py [--leave-out MODEL]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif_rows import Case, cases  # noqa: E402

from optimizer.whatif import roofline  # noqa: E402
from optimizer.whatif.roofline import Efficiency  # noqa: E402

GRID = {
    # within what kernels reach: HBM reads to 90% of the datasheet, dense matmuls to 80% of the peak
    "bandwidth": [0.5 + 0.05 * i for i in range(9)],  # 0.5 .. 0.9
    "compute": [0.3 + 0.1 * i for i in range(6)],  # 0.3 .. 0.8
    "layer_s": [i * 10e-6 for i in range(7)],  # 0 .. 60 us
    "allreduce_s": [0.0, 10e-6, 20e-6],
    "queued": [0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0],
    "request_s": [0.0, 10e-3, 20e-3, 30e-3, 40e-3],
}


def fitting_rows(leave_out: str | None = None) -> list[Case]:
    return [c for c in cases() if c.library_rows and not c.skip and c.model != leave_out]


def errors(rows: list[Case], eff: Efficiency, prepared: dict) -> list[float]:
    out = []
    for c in rows:
        arch, device = prepared[c.index]
        e = roofline.estimate(arch, device, c.serving, c.load, eff)
        if not e.fits:
            out += [math.inf, math.inf]
            continue
        for key, value in (("ttft_s", e.ttft_s), ("tpot_s", e.tpot_s)):
            if key in c.measured:
                out.append(abs(math.log(value / c.measured[key])))
    return out


def fit(rows: list[Case]) -> tuple[Efficiency, float]:
    prepared = {c.index: (c.arch(), c.spec()) for c in rows}
    best, score = None, math.inf
    for values in itertools.product(*GRID.values()):
        eff = Efficiency(*values)
        s = statistics.median(errors(rows, eff, prepared))
        if s < score:
            best, score = eff, s
    return best, score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leave-out", help="fit without this model's rows (the CSV's model id)")
    ns = ap.parse_args()
    rows = fitting_rows(ns.leave_out)
    t = time.monotonic()
    eff, score = fit(rows)
    print(f"fitted on {len(rows)} rows ({', '.join(sorted({c.model.split('/')[-1] for c in rows}))}) "
          f"in {time.monotonic() - t:.0f} s")
    print(f"bandwidth {eff.bandwidth:.2f}  compute {eff.compute:.2f}  layer {eff.layer_s * 1e6:.0f} us  "
          f"all-reduce {eff.allreduce_s * 1e6:.0f} us  queued {eff.queued:.2f}  request {eff.request_s * 1e3:.0f} ms  median |log error| {score:.3f} ({math.exp(score) - 1:.0%})")
    prepared = {c.index: (c.arch(), c.spec()) for c in rows}
    for c in rows:
        arch, device = prepared[c.index]
        e = roofline.estimate(arch, device, c.serving, c.load, eff)
        m = c.measured
        print(f"  {c.label:<58} TTFT {e.ttft_s * 1e3:7.1f} vs {m['ttft_s'] * 1e3:7.1f} ms   "
              f"TPOT {e.tpot_s * 1e3:6.2f} vs {m['tpot_s'] * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
