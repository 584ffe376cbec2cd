"""What the study driver needs from an objective."""

from __future__ import annotations

import math
from typing import Protocol


class Objective(Protocol):
    name: str
    direction: str  # "maximize" or "minimize"
    metric: str  # the metric key it reads
    unit: str

    def score(self, metrics: dict[str, float]) -> float:
        """The value to tell Optuna for a completed trial; raises ValueError if it is not finite."""
        ...


def finite(value: float, what: str) -> float:
    if value is None or not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number ({value}): no request completed")
    return float(value)
