"""Token lengths from one of vLLM's length histograms: the fitted distribution the `observed`
workload draws from, and its quantiles (the ones the daemon prints and compares).

A length falls in a bucket with the bucket's share of the observations, then at a place inside
it. vLLM's token buckets are coarse (1, 2, 5, 10, 20, 50, ... up to max-model-len), so the place
is not uniform: it is the maximum-entropy choice that also matches the histogram's mean length
(`_sum / _count`), an exponential tilt exp(theta * u) over the position u in [0, 1] inside each
bucket, one theta for all buckets (theta = 0 is uniform). The +Inf bucket spans up to INF_SPAN
times the highest finite bound.

`quantile` inverts that same distribution, so a percentile printed is one the workload's draws
have. When the fit cannot reach the histogram's mean (the tilt at its limit, the mean beyond what
the buckets can hold: every request far above the top finite bound), a quantile that falls in
the +Inf bucket is not placed: `Length.unplaced` says it is only known to be at least that bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from optimizer.traffic.histogram import Histogram

INF_SPAN = 2.0  # the +Inf bucket reaches this many times the highest finite bound
THETA_LIMIT = 60.0
_PLACED = 0.02  # the fit's mean within 2% of the histogram's: it placed the lengths


def spans(h: Histogram) -> list[tuple[float, float, float, bool]]:
    """(first length, last length, share, is the +Inf bucket) per non-empty bucket: integers in (lower, upper]."""
    finite = [b for b in h.bounds if not math.isinf(b)]
    top = INF_SPAN * finite[-1] if finite else 1.0
    out = []
    for lower, upper, n in h.buckets():
        if n <= 0:
            continue
        first = math.floor(lower) + 1
        last = max(math.floor(top if math.isinf(upper) else upper), first)
        out.append((first, last, n / h.count, math.isinf(upper)))
    return out


def _tilted_mean(theta: float) -> float:
    """E[u] for a density proportional to exp(theta * u) on [0, 1]."""
    if abs(theta) < 1e-6:
        return 0.5
    return 1 / (1 - math.exp(-theta)) - 1 / theta


def _fitted_mean(buckets, theta: float) -> float:
    return sum(share * (first + (last - first) * _tilted_mean(theta)) for first, last, share, _ in buckets)


def fit_tilt(h: Histogram) -> float:
    """The theta whose placement gives the histogram's mean (clamped to what the buckets allow)."""
    buckets, target = spans(h), h.mean
    if target is None or not buckets:
        return 0.0
    lo, hi = -THETA_LIMIT, THETA_LIMIT
    if target <= _fitted_mean(buckets, lo):
        return lo
    if target >= _fitted_mean(buckets, hi):
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _fitted_mean(buckets, mid) < target else (lo, mid)
    return (lo + hi) / 2


def _place(r: float, theta: float) -> float:
    """The position u in [0, 1] inside a bucket at which the tilted CDF reaches r."""
    return r if abs(theta) < 1e-6 else math.log1p(r * math.expm1(theta)) / theta


def draw_lengths(h: Histogram, n: int, rng: random.Random, theta: float | None = None) -> list[int]:
    """n lengths distributed as the histogram says (see the module docstring)."""
    buckets = spans(h)
    if not buckets:
        return [1] * n
    theta = fit_tilt(h) if theta is None else theta
    shares = [s for _, _, s, _ in buckets]
    out = []
    for _ in range(n):
        first, last, _, _ = rng.choices(buckets, weights=shares)[0]
        out.append(max(1, round(first + (last - first) * _place(rng.random(), theta))))
    return out


@dataclass(frozen=True)
class Length:
    """A quantile of the fitted distribution; `unplaced`: only known to be at least `value`."""

    value: float
    unplaced: bool = False

    def text(self) -> str:
        return f">= {self.value:.0f} (top bucket)" if self.unplaced else f"{self.value:.0f}"


def placed(h: Histogram) -> bool:
    """The fit reaches the histogram's mean (within 2%): every quantile is placed."""
    buckets, target = spans(h), h.mean
    if target is None or not buckets:
        return True
    return abs(_fitted_mean(buckets, fit_tilt(h)) - target) <= _PLACED * target


def quantile(h: Histogram, q: float) -> Length | None:
    """The q-quantile of the fitted distribution (None without observations)."""
    buckets = spans(h)
    if not buckets:
        return None
    theta, before = fit_tilt(h), 0.0
    for first, last, share, top in buckets:
        if before + share >= q or (first, last) == buckets[-1][:2]:
            if top and not placed(h):
                return Length(first - 1, unplaced=True)
            r = min(max((q - before) / share, 0.0), 1.0)
            return Length(first + (last - first) * _place(r, theta))
        before += share
    return None
