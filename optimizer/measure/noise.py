"""Run-to-run noise, and the one statistic every comparison in this project uses: values on a
log scale, the noise of one run pooled over every configuration measured more than once.

Ratios are taken on a log scale: a latency that doubles is as far from the reference as one that
halves, one stalled run (these machines stall 1-3 s at random) does not swamp the mean, and an
interval mapped back is a ratio or a range of positive values, never a negative bound. The
noise of one run is pooled over every configuration measured more than once (the same spread
for all, as repeated runs show within ~2x of each other), so a configuration measured once
still gets an interval from the others' repeats.

- `estimate`: one configuration's geometric mean and the 95% range of that mean (or, with
  `one_run`, where one more run lands);
- `ratio`: two configurations' geometric means divided, with the 95% interval;
- `rank`: the best of several, and whether it is clear: every other is measurably worse (the
  interval of other / best lies wholly on the worse side of 1).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Noise:
    """The standard deviation of log(value) for one run, and its degrees of freedom."""

    sd: float
    df: int

    @property
    def t(self) -> float:
        return t95(self.df)

    def as_dict(self) -> dict:
        return {"sd": self.sd, "df": self.df}


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


def geomean(values) -> float:
    """The geometric mean of positive values (the centre every comparison here uses); one value is
    itself, exactly."""
    values = list(values)
    return values[0] if len(set(values)) == 1 else math.exp(statistics.fmean(math.log(v) for v in values))


@dataclass(frozen=True)
class Estimate:
    """One configuration's measured runs: their geometric mean and its 95% range (None bounds:
    no repeated run anywhere, so no noise to judge by)."""

    trial: int
    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": len(self.values)}


def estimate(trial: int, values, noise: Noise | None, one_run: bool = False) -> Estimate:
    """The geometric mean of `values` (positive) and the 95% range the pooled `noise` gives it: of the
    mean, or with `one_run` of where one more run lands (sqrt(1/n + 1) instead of sqrt(1/n))."""
    values = tuple(values)
    mean = geomean(values)
    if noise is None:
        return Estimate(trial, values, mean, None, None)
    half = noise.t * noise.sd * math.sqrt(1 / len(values) + (1 if one_run else 0))
    return Estimate(trial, values, mean, mean * math.exp(-half), mean * math.exp(half))


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


@dataclass(frozen=True)
class Ranking:
    """The best configuration, each other's ratio to it, and whether the best is clear."""

    winner: int | None
    clear: bool
    ratios: dict  # trial -> Ratio (other / winner); empty without noise
    alone: bool = False  # only one configuration was compared: clear by default, nothing beaten


def rank(groups: dict, noise: Noise | None, maximize: bool) -> Ranking:
    """The best of `groups` (trial -> positive values) by geometric mean; clear when every other is
    measurably worse than it with the pooled `noise` (never clear without noise)."""
    if not groups:
        return Ranking(None, False, {})
    order = sorted(groups, key=lambda n: geomean(groups[n]), reverse=maximize)
    best = order[0]
    if len(order) == 1:
        return Ranking(best, True, {}, alone=True)
    if noise is None:
        return Ranking(best, False, {})
    ratios = {n: ratio(groups[n], groups[best], noise) for n in order[1:]}
    return Ranking(best, all(r.worse(maximize) for r in ratios.values()), ratios)


def settled(values, leader, noise: Noise | None, maximize: bool) -> bool:
    """`values` are already measurably worse than `leader`'s: more runs of them cannot make them win."""
    return noise is not None and bool(values) and ratio(values, leader, noise).worse(maximize)


def t95(df: int) -> float:
    """The two-sided 95% Student's t quantile for `df` degrees of freedom; between tabled values the
    next lower df's (a wider interval, never a narrower one)."""
    return t_quantile(df, 0.95)


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided Student's t quantile at `level` (0.95 or 0.90) for `df` degrees of freedom;
    between tabled values the next lower df's."""
    table = {0.95: T95, 0.90: T90}[level]
    return table[max(k for k in table if k <= max(1, df))]


def next_point_band(logs, level: float = 0.95) -> float:
    """The half-width, on the log scale, of where one more point lands, from the spread of `logs`
    (two or more): t(n - 1) x sd x sqrt(1 + 1/n), as `estimate(one_run=True)` gives a run."""
    logs = list(logs)
    n = len(logs)
    return t_quantile(n - 1, level) * statistics.stdev(logs) * math.sqrt(1 + 1 / n)


# Two-sided 95% Student's t quantiles by degrees of freedom (n - 1); 1000 stands for the normal's 1.96.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980, 1000: 1.960}
# Two-sided 90% quantiles: the what-if band's level (whatif/calibration.py); 1000 stands for 1.645.
T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671, 1000: 1.645}
