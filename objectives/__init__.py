"""Objective plugins: each module holds one objective; `get_objective(spec)` picks one by name.

An objective says which way is better (`direction`), which metric it reads, and turns a
completed trial's metrics into the value Optuna optimizes. The study driver owns the
interface (`objectives.base.Objective`); this package only implements it.
"""

from __future__ import annotations

from .base import Objective
from .latency import LatencyObjective
from .throughput import ThroughputObjective

OBJECTIVES = {"throughput": ThroughputObjective, "latency": LatencyObjective}


def get_objective(name: str, metric: str | None = None) -> Objective:
    """The objective called `name`; raises ValueError (with the known names) otherwise."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective '{name}'; known: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name](metric)


__all__ = ["Objective", "OBJECTIVES", "get_objective"]
