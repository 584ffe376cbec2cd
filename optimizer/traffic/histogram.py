"""Prometheus histograms and counters as vLLM exposes them: deltas between two reads, sums across
servers, and quantiles.

A histogram is its cumulative bucket counts (`le` upper bounds, the last +Inf), its `_sum` and
its `_count`. Counters only grow while a server lives; a value below the previous one means the
server restarted and counts from zero again, so the delta is the new value itself (what
Prometheus' `increase()` does). A histogram restarted when any of its counts went down.

`quantile` follows PromQL's `histogram_quantile`: the rank q*count falls in one bucket, the
value is interpolated linearly between that bucket's lower and upper bound (the first bucket's
lower bound is 0), and a rank in the +Inf bucket answers the highest finite bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def counter_delta(new: float, old: float | None) -> float:
    """How much a counter grew from `old` to `new`; a drop is a restart (the delta is `new`)."""
    if old is None:
        return 0.0
    return new - old if new >= old else new


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...]  # bucket upper bounds, ascending, the last math.inf
    counts: tuple[float, ...]  # cumulative counts, one per bound
    total: float = 0.0  # the `_sum`

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> "Histogram":
        return cls(tuple(bounds), (0.0,) * len(bounds), 0.0)

    def since(self, earlier: "Histogram | None") -> "Histogram":
        """The observations made after `earlier` was read; all of `self` after a restart (a count
        went down) or when there is no earlier read of the same buckets."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        if any(n < o for n, o in zip(self.counts, earlier.counts)) or self.total < earlier.total:
            return self
        return Histogram(self.bounds, tuple(n - o for n, o in zip(self.counts, earlier.counts)),
                         self.total - earlier.total)

    def on(self, bounds: tuple[float, ...]) -> "Histogram":
        """The same observations on a subset of this histogram's bounds (exact: counts are cumulative)."""
        at = dict(zip(self.bounds, self.counts))
        return Histogram(tuple(bounds), tuple(at[b] for b in bounds), self.total)

    def plus(self, other: "Histogram") -> "Histogram":
        """Both histograms' observations together, on the bounds they share (servers with another
        max-model-len have other token buckets; +Inf is always shared)."""
        if self.bounds != other.bounds:
            common = tuple(sorted(set(self.bounds) & set(other.bounds)))
            return self.on(common).plus(other.on(common))
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)), self.total + other.total)

    def buckets(self) -> list[tuple[float, float, float]]:
        """(lower, upper, observations) per bucket, non-cumulative; the first lower bound is 0."""
        out, lower, before = [], 0.0, 0.0
        for upper, cum in zip(self.bounds, self.counts):
            out.append((lower, upper, max(cum - before, 0.0)))
            lower, before = upper, cum
        return out

    def quantile(self, q: float) -> float | None:
        """PromQL's histogram_quantile(q); None without observations."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, before = 0.0, 0.0
        for upper, cum in zip(self.bounds, self.counts):
            if cum >= rank and cum > before:
                if math.isinf(upper):
                    return self._highest_finite()
                return lower + (upper - lower) * (rank - before) / (cum - before)
            lower, before = upper, cum
        return self._highest_finite()

    def _highest_finite(self) -> float:
        finite = [b for b in self.bounds if not math.isinf(b)]
        return finite[-1] if finite else math.nan

    def to_dict(self) -> dict:
        """Plain JSON: bounds with +Inf as the string "+Inf"."""
        return {"bounds": ["+Inf" if math.isinf(b) else b for b in self.bounds], "counts": list(self.counts),
                "sum": self.total}

    @classmethod
    def from_dict(cls, d: dict) -> "Histogram":
        bounds = tuple(math.inf if b == "+Inf" else float(b) for b in d["bounds"])
        return cls(bounds, tuple(float(c) for c in d["counts"]), float(d["sum"]))
