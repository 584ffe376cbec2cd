"""Throughput first (batch, offline): maximize output tokens per second.

Only requests that completed count, so a configuration that drops requests cannot win
by doing less work.
"""

from __future__ import annotations

from .base import finite


class ThroughputObjective:
    name = "throughput"
    direction = "maximize"
    unit = "tok/s"

    def __init__(self, metric: str | None = None):
        allowed = ("output_throughput", "total_token_throughput", "request_throughput")
        if metric is not None and metric not in allowed:
            raise ValueError(f"throughput objective: metric '{metric}' unknown; use one of {', '.join(allowed)}")
        self.metric = metric or "output_throughput"
        if self.metric == "request_throughput":
            self.unit = "req/s"

    def score(self, metrics: dict[str, float]) -> float:
        return finite(metrics.get(self.metric), self.metric)
