"""The rate one replica carries with every SLO holding, found by replaying the study's own workload
through the twin at rising rates, as the goodput search does on a real server (trial/rate_search.py).

First everything at once (the saturation probe: its request throughput is the ceiling), then a
bisection between 0 and that ceiling on whether each SLO, at its own percentile, holds on the
simulated records: `PROBES` simulations, a few seconds. With no SLOs the capacity is the ceiling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.measure.metrics import summarize
from optimizer.measure.slo import holds
from optimizer.trial.rate_search import at_rate

PROBES = 8


@dataclass(frozen=True)
class Capacity:
    rate: float  # requests/s one replica carries with the SLOs holding (0: none does)
    ceiling: float  # requests/s at saturation
    metrics: dict  # the simulated metrics at `rate` (at the ceiling when no rate holds)


def capacity(server, cost, requests, slos: tuple, probes: int = PROBES) -> Capacity:
    """The highest rate within the ceiling / 2^probes at which the twin's `slos` hold."""
    sat = summarize(server.run(at_rate(requests, math.inf), None, cost).result)
    ceiling = sat["request_throughput"]
    if not slos:
        return Capacity(ceiling, ceiling, sat)
    if holds(slos, sat):
        return Capacity(ceiling, ceiling, sat)
    lo, hi, best = 0.0, ceiling, None
    for _ in range(probes):
        mid = (lo + hi) / 2
        m = summarize(server.run(at_rate(requests, mid), None, cost).result)
        if holds(slos, m):
            lo, best = mid, m
        else:
            hi = mid
    return Capacity(lo, ceiling, best or sat) if best is not None else Capacity(0.0, ceiling, sat)
