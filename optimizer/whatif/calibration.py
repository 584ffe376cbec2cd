"""Correcting a prediction with what was measured, and the band it is printed with.

The estimate is run for configurations that were also measured (a study's trials on its own
hardware, or a published row). Per metric, the correction is the geometric mean of measured /
predicted over those points, and the band comes from the spread of their log residuals, the
same log-scale statistic every comparison in this project uses (measure/noise.py):

    band = t95(n - 1) x sd(log residuals) x sqrt(1 + 1/n)   (where one more point lands)

shown as +-(e^band - 1): the value's range is [v / e^band, v x e^band], positive always. With
fewer than three points the spread is not worth reading, so the band is the prior: the estimate's 90th
percentile error on the published rows it was never fitted on (`PRIOR`, from
bench/whatif_validation.py): the band of an estimate nothing measured has checked. With no
point at all the correction is 1 and the band is that prior, wider than any band the study's own
points print.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from optimizer.measure.noise import t95

METRICS = ("ttft_s", "tpot_s", "throughput")
# 90th percentile of |log(predicted / measured)| of the uncorrected estimate on the 18 published rows
# it was never fitted on (bench/whatif_validation.py, 2026-12-04; docs/what-if.md): factors of 8.7, 4.2
# and 4.7. Wide, and honest: half those rows are a 2024 ROCm build serving a 405B model far below its
# datasheet, which nothing on the NVIDIA side predicts.
PRIOR = {"ttft_s": math.log(1 + 7.66), "tpot_s": math.log(1 + 3.15), "throughput": math.log(1 + 3.69)}
MIN_SPREAD_POINTS = 3  # fewer: two residuals' spread is too unstable to print (t95 at 1 df is 12.7)


@dataclass(frozen=True)
class Calibration:
    factors: dict  # metric -> measured / predicted (geometric mean); 1.0 without points
    bands: dict  # metric -> half-width on the log scale
    points: dict  # metric -> how many measured points it rests on
    basis: str = ""  # what was measured, in words ("3 trials of study 'x' on h100")

    def apply(self, metric: str, value: float) -> float:
        return value * self.factors.get(metric, 1.0)

    def percent(self, metric: str) -> float:
        """The band as +-x% (its upper side; the lower is v / (1 + x))."""
        return math.exp(self.bands[metric]) - 1

    def range(self, metric: str, value: float) -> tuple[float, float]:
        v, b = self.apply(metric, value), self.bands[metric]
        return v * math.exp(-b), v * math.exp(b)


def fit(pairs: list[tuple[dict, dict]], basis: str = "") -> Calibration:
    """The correction and band from (measured, predicted) pairs of metric dicts; metrics either
    side lacks (or non-positive) are skipped for that pair."""
    factors, bands, points = {}, {}, {}
    for metric in METRICS:
        logs = [math.log(m[metric] / p[metric]) for m, p in pairs
                if _positive(m.get(metric)) and _positive(p.get(metric))]
        points[metric] = len(logs)
        if not logs:
            factors[metric], bands[metric] = 1.0, PRIOR[metric]
            continue
        factors[metric] = math.exp(statistics.fmean(logs))
        if len(logs) < MIN_SPREAD_POINTS:
            bands[metric] = PRIOR[metric]
        else:
            n = len(logs)
            bands[metric] = t95(n - 1) * statistics.stdev(logs) * math.sqrt(1 + 1 / n)
    return Calibration(factors, bands, points, basis)


def none(why: str) -> Calibration:
    """No measured point: no correction, the widened prior; `why` says what is missing."""
    return fit([], why)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0
