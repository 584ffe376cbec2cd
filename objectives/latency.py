"""Latency first (interactive chat): minimize a tail latency, p95 TTFT by default.

`metric` picks the percentile the operator watches: `ttft_p95` (time to first token)
or `e2el_p95` (whole request), or any other latency percentile the replay reports.
"""

from __future__ import annotations

from .base import Single, finite

ALLOWED = tuple(f"{m}_p{q}" for m in ("ttft", "tpot", "itl", "e2el") for q in (50, 90, 95, 99))


def metric_key(metric: str) -> str:
    """'ttft_p95' -> 'ttft_ms_p95' (the key metrics.summarize writes)."""
    base, pct = metric.rsplit("_", 1)
    return f"{base}_ms_{pct}"


class LatencyObjective(Single):
    name = "latency"
    direction = "minimize"
    unit = "ms"

    def __init__(self, metric: str | None = None, slos: tuple = ()):
        super().__init__(slos)
        metric = metric or "ttft_p95"
        if metric not in ALLOWED:
            raise ValueError(f"latency objective: metric '{metric}' unknown; use one of {', '.join(ALLOWED)}")
        self.metric = metric

    def score(self, metrics: dict[str, float]) -> float:
        return finite(metrics.get(metric_key(self.metric)), self.metric)
