"""Correcting a prediction with what was measured, and the band it is printed with.

The estimate is run for configurations that were also measured (a study's trials on its own
hardware, or a published row). Per metric, the correction is the geometric mean of measured /
predicted over those points, and the band comes from the spread of their log residuals, the
same log-scale statistic every comparison in this project uses (`measure/noise.py`'s
`next_point_band`, where one more point lands), at the 90% level the prior below is read at:

    band = t(n - 1, 90%) x sd(log residuals) x sqrt(1 + 1/n)

shown as +-(e^band - 1): the value's range is [v / e^band, v x e^band], positive always. With
fewer than three points the spread is not worth reading, so the band is the prior: the
estimate's 90th percentile error on the published rows it was never fitted on (`PRIOR`, from
bench/whatif_validation.py), the band of an estimate nothing measured has checked. With no
point at all the correction is 1 and the band is that prior.

A correction is fitted on one device with one estimator (the library or the roofline) and is
applied as far as it was measured to carry (`for_row`): in full on that device and estimator;
on another device TPOT and throughput carry over with the transfer error added to their band
(`TRANSFER`, the calibrated transfer's 90th percentile in bench/whatif_validation.py), while
TTFT does not (one device's TTFT ratio carried to another made it worse there: its load and TP
go with it, not the device); an estimate by the other estimator is not corrected at all.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from optimizer.measure.noise import next_point_band

METRICS = ("ttft_s", "tpot_s", "throughput")
# 90th percentile of |log(predicted / measured)| of the uncorrected estimate on the 18 published rows
# it was never fitted on (bench/whatif_validation.py, 2026-12-04; docs/what-if.md): factors of 8.7, 4.2
# and 4.7. Wide, and honest: 7 of those rows are a 2024 ROCm build serving a 405B model far below
# its datasheet, which nothing on the NVIDIA side predicts.
PRIOR = {"ttft_s": math.log(1 + 7.69), "tpot_s": math.log(1 + 3.15), "throughput": math.log(1 + 3.69)}
# 90th percentile of the calibrated transfer's TPOT error (one device's ratio carried to another):
# 35%. The published rows give no throughput beside it: TPOT's stands for it.
TRANSFER = {"tpot_s": math.log(1.35), "throughput": math.log(1.35)}
MIN_SPREAD_POINTS = 3  # fewer: two residuals' spread is too unstable to print (t at 90% and 1 df is 6.3)
LEVEL = 0.90  # the level PRIOR is read at


@dataclass(frozen=True)
class Calibration:
    factors: dict  # metric -> measured / predicted (geometric mean); 1.0 without points
    bands: dict  # metric -> half-width on the log scale
    points: dict  # metric -> how many measured points it rests on
    basis: str = ""  # what was measured, in words ("3 trials of study 'x' on h100")
    device: str = ""  # the device the points were measured on
    by: str = ""  # the estimator that predicted them: "library" or "roofline"

    def apply(self, metric: str, value: float) -> float:
        return value * self.factors.get(metric, 1.0)

    def percent(self, metric: str) -> float:
        """The band as +-x% (its upper side; the lower is v / (1 + x))."""
        return math.exp(self.bands[metric]) - 1

    def range(self, metric: str, value: float) -> tuple[float, float]:
        v, b = self.apply(metric, value), self.bands[metric]
        return v * math.exp(-b), v * math.exp(b)

    def for_row(self, device: str, by: str) -> "Calibration":
        """The correction as it applies to a prediction for `device` by the estimator `by`."""
        if not any(self.points.values()) or (device == self.device and by == self.by):
            return self
        if by != self.by:
            return none(f"{self.basis}, predicted by the {self.by} there: not applied to the {by}'s")
        factors = {**self.factors, "ttft_s": 1.0}
        bands = {"ttft_s": PRIOR["ttft_s"], **{m: math.hypot(self.bands[m], TRANSFER[m]) for m in TRANSFER}}
        return replace(self, factors=factors, bands=bands, basis=f"{self.basis}, carried to {device} (TTFT not)")


def fit(pairs: list[tuple[dict, dict]], basis: str = "", device: str = "", by: str = "") -> Calibration:
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
            bands[metric] = next_point_band(logs, LEVEL)
    return Calibration(factors, bands, points, basis, device, by)


def none(why: str) -> Calibration:
    """No measured point: no correction, the prior band; `why` says what is missing."""
    return fit([], why)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0
