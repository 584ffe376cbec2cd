"""Throughput first (batch, offline): maximize output tokens per second.

Only requests that completed count, so a configuration that drops requests cannot win
by doing less work.
"""

from __future__ import annotations

from .base import Single, finite

ALLOWED = ("output_throughput", "total_token_throughput", "request_throughput")


class ThroughputObjective(Single):
    name = "throughput"
    direction = "maximize"
    unit = "tok/s"

    def __init__(self, metric: str | None = None, slos: tuple = ()):
        super().__init__(slos)
        if metric is not None and metric not in ALLOWED:
            raise ValueError(f"throughput objective: metric '{metric}' unknown; use one of {', '.join(ALLOWED)}")
        self.metric = metric or "output_throughput"
        if self.metric == "request_throughput":
            self.unit = "req/s"

    def score(self, metrics: dict[str, float]) -> float:
        return finite(metrics.get(self.metric), self.metric)
