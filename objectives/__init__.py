"""Objective plugins: each module holds one objective; `get_objective(name, ...)` picks one.

An objective says which way is better (`direction`, or `directions` for Pareto), which
metric it reads, how a trial measures (`mode`), and turns a completed trial's metrics into
the value(s) Optuna optimizes. The study driver owns the interface (`objectives.base`).
"""

from __future__ import annotations

from .base import Objective
from .fleet import FleetObjective
from .goodput import GoodputObjective
from .latency import LatencyObjective
from .pareto import ParetoObjective
from .throughput import ThroughputObjective

OBJECTIVES = {"throughput": ThroughputObjective, "latency": LatencyObjective, "goodput": GoodputObjective,
              "pareto": ParetoObjective, "fleet": FleetObjective}


def get_objective(name: str, metric: str | None = None, slos: tuple = (), fleet=None) -> Objective:
    """The objective called `name` (`fleet`: the config's objective.fleet, for the fleet objective);
    raises ValueError (with the known names) otherwise."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective '{name}'; known: {', '.join(OBJECTIVES)}")
    if fleet is not None and name != "fleet":
        raise ValueError(f"objective.fleet is for the fleet objective, not '{name}'; set name: fleet or drop it")
    return FleetObjective(metric, slos, fleet) if name == "fleet" else OBJECTIVES[name](metric, slos)


__all__ = ["Objective", "OBJECTIVES", "get_objective"]
