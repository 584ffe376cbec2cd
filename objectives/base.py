"""What the study driver needs from an objective.

A single objective has a `direction` and `score()` returns one number; a multi-objective
one (Pareto) has `directions` and `score()` returns one number per direction. `mode` says
how a trial measures: `replay` (the workload once) or `goodput` (a rate search inside the
trial). `slos` are constraints for replay objectives (a trial that misses them is COMPLETE
with its violation) and the definition of "good" for goodput.
"""

from __future__ import annotations

import math
from typing import Protocol


class Objective(Protocol):
    name: str
    direction: str  # "maximize" or "minimize" (the first of `directions` for a multi-objective)
    directions: tuple[str, ...]
    metric: str  # the metric key it reads (comma-separated for a multi-objective)
    unit: str
    mode: str  # "replay" or "goodput"
    slos: tuple

    def score(self, metrics: dict[str, float]) -> float | list[float]:
        """The value(s) to tell Optuna for a completed trial; raises ValueError if not finite."""
        ...


def finite(value: float, what: str) -> float:
    if value is None or not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number ({value}): no request completed")
    return float(value)


class Single:
    """Defaults shared by the single-objective plugins."""

    mode = "replay"
    multi = False

    def __init__(self, slos: tuple = ()):
        self.slos = tuple(slos)

    @property
    def directions(self) -> tuple[str, ...]:
        return (self.direction,)
