"""Production's SLO attainment: the share of the watched servers' requests that met each of the
study's SLOs in a window, read from their own latency histograms (traffic/window.py).

    ttft   vllm:time_to_first_token_seconds             a request's time to its first token
    tpot   vllm:request_time_per_output_token_seconds   a request's mean time per output token
           (a server without it: the inter-token histogram, per token)
    itl    vllm:inter_token_latency_seconds             each gap between two tokens (per token)
    e2el   vllm:e2e_request_latency_seconds             a request's end-to-end latency

The share at or under a limit is interpolated inside its bucket, as histogram_quantile places a
quantile; observations past the highest finite bucket count as missing any limit. An SLO is met
when its share reaches its percentile (`ttft:500` at p95: 95% of requests within 500 ms); the
error SLO is left out (the histograms hold no errors: rejected requests are counted apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.measure.slo import Slo
from optimizer.traffic.histogram import Histogram

SOURCES = {"ttft": ("ttft",), "tpot": ("tpot", "itl"), "itl": ("itl",), "e2el": ("e2e",)}
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}


@dataclass(frozen=True)
class Attained:
    slo: Slo
    share: float  # of the observations at or under the limit
    observations: float

    @property
    def met(self) -> bool:
        return self.share >= self.slo.percentile / 100

    def describe(self) -> str:
        return (f"{self.share:.0%} of requests meet {NAMES[self.slo.metric]} <= {self.slo.limit:g} ms "
                f"(p{self.slo.percentile} needs {self.slo.percentile}%)")

    def as_dict(self) -> dict:
        return {"limit_ms": self.slo.limit, "percentile": self.slo.percentile, "share": round(self.share, 4),
                "met": self.met, "observations": round(self.observations, 1)}


def share_at_most(h: Histogram, limit: float) -> float | None:
    """The share of `h`'s observations at or under `limit` (None without observations)."""
    if h.count <= 0:
        return None
    lower, before = 0.0, 0.0
    for upper, cum in zip(h.bounds, h.counts):
        if math.isinf(upper):
            return before / h.count  # past the highest finite bound: no limit is known to be met
        if limit <= upper:
            inside = (limit - lower) / (upper - lower) if upper > lower else 1.0
            return (before + max(cum - before, 0.0) * max(inside, 0.0)) / h.count
        lower, before = upper, cum
    return before / h.count


def attainment(latencies: dict[str, Histogram], slos: tuple[Slo, ...]) -> list[Attained]:
    """Each latency SLO's attainment in the window, where its histogram has observations."""
    out = []
    for slo in slos:
        h = next((latencies[k] for k in SOURCES.get(slo.metric, ()) if k in latencies and latencies[k].count > 0),
                 None)
        share = share_at_most(h, slo.limit / 1000) if h is not None else None
        if share is not None:
            out.append(Attained(slo, share, h.count))
    return out
