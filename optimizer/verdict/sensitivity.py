"""One-factor sensitivity, judged: the configuration it moves from (the one the study recommends),
the band where one more run of it lands 95% of the time, and whether a moved knob's run left it.

The band is on the one scale every comparison uses (measure/noise.py): the geometric mean of every
measurement of the best (the search's run, the confirmation's re-measurements, and the extra runs
taken for it) times exp(+- t s sqrt(1 + 1/n)), with s the noise of one run pooled over every
repeated run of the study. A moved knob, measured once, whose value falls inside the band did
nothing measurable on this machine.
"""

from __future__ import annotations

import optuna

from optimizer.errors import ConfigError
from optimizer.measure.noise import Estimate, estimate, pooled
from optimizer.verdict.recommendation import recommend


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    if len(study.directions) > 1:
        raise ConfigError("sensitivity: a Pareto study has no single best; it applies to single-objective studies")
    rec = recommend(study)  # the one the study recommends (verdict/recommendation.py)
    if rec is not None:
        return rec.trial
    try:
        return study.best_trial
    except ValueError:
        raise ConfigError(f"sensitivity: study '{study.study_name}' has no completed trial that met its SLOs; "
                          "run the study first") from None


def band(values: list[float], groups=()) -> Estimate:
    """Where one more run of the best lands 95% of the time (module docstring), its noise pooled
    over `values` and the study's other repeated runs (`groups`). No repeats anywhere: no band
    (None bounds)."""
    return estimate(-1, values, pooled([values, *groups]), one_run=True)


def effect(name: str, old, new, value: float | None, noise: Estimate, maximize: bool) -> dict:
    """One moved knob's row: its value, its ratio to the best's mean (> 1: better), and whether it
    left the noise band."""
    row = {"knob": name, "from": old, "to": new, "value": value, "n": len(noise.values),
           "band_low": noise.low, "band_high": noise.high, "best_mean": noise.mean}
    if value is None:
        return {**row, "ratio": None, "verdict": "failed"}
    ratio = None
    if noise.mean and (value or maximize):  # a zero latency has no ratio; a zero throughput has 0
        ratio = value / noise.mean if maximize else noise.mean / value
    better = (value > noise.mean) == maximize
    if noise.low is None:
        return {**row, "ratio": ratio, "verdict": ("better" if better else "worse") + " (no band: nothing measured twice)"}
    inside = noise.low <= value <= noise.high
    verdict = "within noise" if inside else ("better" if better else "worse")
    return {**row, "ratio": ratio, "verdict": verdict}
