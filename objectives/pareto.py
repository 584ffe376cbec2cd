"""Throughput and latency at once: a multi-objective study (output tokens/s up, a tail latency
down, p95 TTFT by default). There is no single best: the study's Pareto front is the set of
trials no other trial beats on both, and the report lists it.

`metric` names the latency side (`ttft_p95`, `e2el_p95`, ...). TPE handles multiple
objectives natively; early stopping is off (there is no one "best so far" to lose to).
"""

from __future__ import annotations

from .base import finite
from .latency import ALLOWED, metric_key


class ParetoObjective:
    name = "pareto"
    directions = ("maximize", "minimize")
    direction = "maximize"
    unit = "tok/s, ms"
    mode = "replay"
    multi = True

    def __init__(self, metric: str | None = None, slos: tuple = ()):
        latency = metric or "ttft_p95"
        if latency not in ALLOWED:
            raise ValueError(f"pareto objective: latency metric '{latency}' unknown; use one of {', '.join(ALLOWED)}")
        self.latency = latency
        self.metric = f"output_throughput,{latency}"
        self.slos = tuple(slos)

    def score(self, metrics: dict[str, float]) -> list[float]:
        return [finite(metrics.get("output_throughput"), "output_throughput"),
                finite(metrics.get(metric_key(self.latency)), self.latency)]
