"""Run-to-run noise: the 95% interval of repeated measurements of one configuration, the
verdict it gives on a ranking (a clear winner, or intervals that overlap), and the ratio of two
configurations with its interval.

Ratios are taken on a log scale: a latency that doubles is as far from the reference as one that
halves, and one stalled run (these machines stall 1-3 s at random) does not swamp the mean. The
noise of one run is pooled over every configuration measured more than once (the same spread
for all, as the confirmation's repeated runs show within ~2x of each other).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    trial: int
    values: tuple[float, ...]
    mean: float
    low: float
    high: float

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high


def interval(trial: int, values: list[float], one_run: bool = False) -> Interval:
    """Mean and 95% t-interval of `values`: of their mean, or with `one_run` of where one more run
    lands (a prediction interval, sqrt(1 + 1/n) instead of sqrt(1/n)). A single value: an interval
    of zero width is not claimed; low/high are -inf/inf."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(trial, tuple(values), mean, -math.inf, math.inf)
    spread = math.sqrt(1 + 1 / len(values)) if one_run else 1 / math.sqrt(len(values))
    half = t95(len(values) - 1) * statistics.stdev(values) * spread
    return Interval(trial, tuple(values), mean, mean - half, mean + half)


def verdict(intervals: list[Interval], maximize: bool) -> tuple[Interval | None, bool]:
    """The winner (best mean) and whether it is clear (its interval overlaps no other's)."""
    if not intervals:
        return None, False
    ranked = sorted(intervals, key=lambda i: -i.mean if maximize else i.mean)
    winner = ranked[0]
    return winner, all(not winner.overlaps(other) for other in ranked[1:])


@dataclass(frozen=True)
class Noise:
    """The standard deviation of log(value) for one run, and its degrees of freedom."""

    sd: float
    df: int

    @property
    def t(self) -> float:
        return t95(self.df)


def pooled(groups) -> Noise | None:
    """The noise of one run, pooled over `groups` (repeated runs of one configuration each; groups
    with fewer than two positive values say nothing about it). None when no group says anything."""
    squares, df = 0.0, 0
    for values in groups:
        logs = [math.log(v) for v in values if v is not None and v > 0]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    return Noise(math.sqrt(squares / df), df) if df else None


@dataclass(frozen=True)
class Ratio:
    """values / reference (geometric means) with its 95% interval."""

    ratio: float
    low: float
    high: float

    def includes_one(self) -> bool:
        return self.low <= 1.0 <= self.high

    def worse(self, maximize: bool) -> bool:
        """The whole interval is on the worse side of 1 (values measurably worse than the reference)."""
        return self.high < 1.0 if maximize else self.low > 1.0

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high}


def ratio(values, reference, noise: Noise) -> Ratio:
    """How many times `reference` the `values` are, with the 95% interval the pooled `noise` gives
    (Welch is not needed: both sides share the one pooled spread). Positive values only."""
    a, b = [math.log(v) for v in values], [math.log(v) for v in reference]
    d = statistics.fmean(a) - statistics.fmean(b)
    half = noise.t * noise.sd * math.sqrt(1 / len(a) + 1 / len(b))
    return Ratio(math.exp(d), math.exp(d - half), math.exp(d + half))


def t95(df: int) -> float:
    """The two-sided 95% Student's t quantile for `df` degrees of freedom; between tabled values the
    next lower df's (a wider interval, never a narrower one)."""
    return T95[max(k for k in T95 if k <= max(1, df))]


# Two-sided 95% Student's t quantiles by degrees of freedom (n - 1); 1000 stands for the normal's 1.96.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980, 1000: 1.960}
