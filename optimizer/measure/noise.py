"""Run-to-run noise: the 95% interval of repeated measurements of one configuration, and the
verdict it gives on a ranking (a clear winner, or intervals that overlap).
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
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) * spread
    return Interval(trial, tuple(values), mean, mean - half, mean + half)


def verdict(intervals: list[Interval], maximize: bool) -> tuple[Interval | None, bool]:
    """The winner (best mean) and whether it is clear (its interval overlaps no other's)."""
    if not intervals:
        return None, False
    ranked = sorted(intervals, key=lambda i: -i.mean if maximize else i.mean)
    winner = ranked[0]
    return winner, all(not winner.overlaps(other) for other in ranked[1:])


# Two-sided 95% Student's t quantiles by degrees of freedom (n - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
