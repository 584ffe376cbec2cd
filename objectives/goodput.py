"""SLO-bounded goodput (chat and agent fleets): maximize the request rate a server carries
while every SLO holds, e.g. p95 TTFT <= 500 ms and p95 TPOT <= 50 ms.

Each trial searches that rate on its one booted server (optimizer/trial/rate_search.py) and
records the output tokens/s at it (`goodput_output_throughput`). A configuration that
holds the SLOs at no rate scores 0. The workload must be open loop: a closed loop fixes
the concurrency, not the rate.
"""

from __future__ import annotations

from .base import Single, finite


class GoodputObjective(Single):
    name = "goodput"
    direction = "maximize"
    unit = "req/s"
    mode = "goodput"
    metric = "goodput_rate"

    def __init__(self, metric: str | None = None, slos: tuple = ()):
        if not slos:
            raise ValueError("goodput objective: needs SLOs, e.g. slos: 'ttft:500 tpot:50' (ms) or --slo")
        if metric not in (None, "goodput_rate"):
            raise ValueError(f"goodput objective: metric '{metric}' unknown; it reads goodput_rate")
        super().__init__(slos)

    def score(self, metrics: dict[str, float]) -> float:
        return finite(metrics.get("goodput_rate"), "goodput_rate")
