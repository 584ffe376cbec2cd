"""The tails one replica shows at a planned rate, and its knee, predicted by the twin calibrated on
the study's own runs: nothing booted.

The study's own requests are replayed through the twin as an open-loop stream at the rate: an
open-loop workload keeps its schedule's shape (a trace's gaps, a burst), rescaled to the rate as
the goodput search does on a real server (trial/rate_search.py at_rate); a closed-loop workload,
which has no schedule, gets Poisson arrivals (vLLM's benchmark default), seeded. The tails are
that simulated run's TTFT and TPOT p95 and p99, each with the twin's band (twin/prediction.py).

The knee is the highest rate at which p95 TTFT stays within the TTFT SLO, found as the twin's
capacity is (twin/peak/capacity.py: the saturation probe's throughput as the ceiling, then a bisection).
A plan that loads each replica at r of a knee at k sits (k - r) / k below it: that, not only the
headroom's share of the measured rate, is how far a replica is from its queue blowing up.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from optimizer.measure.metrics import summarize
from optimizer.measure.slo import Slo
from optimizer.trial.rate_search import at_rate, nominal_rate
from optimizer.twin.peak.capacity import capacity
from optimizer.workload.arrivals import rate_schedule

TAILS = ("ttft_ms_p95", "ttft_ms_p99", "tpot_ms_p95", "tpot_ms_p99")
SEED = 0


@dataclass(frozen=True)
class Tails:
    rate: float  # requests/s one replica receives
    metrics: dict  # the simulated run's metrics at that rate
    bands: dict = field(default_factory=dict)  # metric -> (low, high)
    knee: float | None = None  # requests/s at which p95 TTFT reaches the SLO (None: no TTFT SLO to reach)
    ceiling: float = math.nan  # requests/s at saturation
    slo: Slo | None = None  # the TTFT SLO the knee is taken against
    requests: int = 0  # how many requests each simulated run replays
    server: dict = field(default_factory=dict)  # the simulated run's server view at that rate (running peak...)
    outside: tuple = ()  # why the prediction lies outside the twin's validated envelope (twin/envelope.py)

    @property
    def below_knee(self) -> float | None:
        """How far below the knee the planned rate sits, as a share of the knee (negative: past it)."""
        return None if not self.knee else (self.knee - self.rate) / self.knee


def open_loop(requests: tuple, seed: int = SEED) -> tuple:
    """The requests with an open-loop schedule to rescale: their own when they have one, else Poisson
    arrivals at 1 request/s in their order (requests that follow another keep following it)."""
    if nominal_rate(requests) is not None:
        return requests
    roots = [i for i, r in enumerate(requests) if r.after is None]
    offsets = iter(rate_schedule(len(roots), 1.0, 1.0, random.Random(seed)))
    return tuple(replace(r, offset_s=next(offsets)) if r.after is None else r for r in requests)


def ttft_slo(slos: tuple) -> Slo | None:
    """The TTFT SLO a knee is taken against (its own percentile), if the SLOs have one."""
    return next((s for s in slos if s.metric == "ttft"), None)


def tails(server, cost, requests: tuple, rate: float, slos: tuple = (), band=None, knee=None) -> Tails:
    """The twin's run of `requests` at `rate` requests/s (module docstring), and, with a TTFT SLO among
    `slos`, the knee. `band(metric, value)` gives a prediction's (low, high). `knee`: the capacity
    against the TTFT SLO alone (or none), when the caller has it already."""
    stream = open_loop(requests)
    sim = server.run(at_rate(stream, rate), None, cost)
    metrics = summarize(sim.result)
    bands = {m: band(m, metrics[m]) for m in TAILS if band is not None and m in metrics}
    slo = ttft_slo(slos)
    cap = knee if knee is not None else capacity(server, cost, stream, (slo,) if slo is not None else ())
    return Tails(rate, metrics, bands, cap.rate if slo is not None else None, cap.ceiling, slo, len(requests),
                 sim.server)
