"""A configuration drawn from the search space: each dimension asked of an Optuna trial."""

from __future__ import annotations

from optimizer.config.round_values import round_draw
from optimizer.config.space import SearchSpace, active


def suggest(trial, space: SearchSpace, only: set[str] | None = None) -> dict:
    """Ask an Optuna trial for each dimension (only those in `only`, when given), in knob order;
    a knob whose condition the draws so far fail is not asked (REQUIRES). Drawn values come back
    rounded as an operator writes them (config/round_values.py); Optuna keeps the drawn ones."""
    params = {}
    given = getattr(trial, "_fixed_params", None) or {}  # enqueued values run as written (Optuna 5 keeps them there)
    for d in space.dims:
        name = d.knob.name
        if (only is not None and name not in only) or not active(name, params):
            continue
        if d.knob.has_choices:
            params[name] = trial.suggest_categorical(name, list(d.choices))
        elif d.knob.kind == "int":
            params[name] = trial.suggest_int(name, int(d.low), int(d.high), log=d.log)
        else:
            # step 0.01: a fraction with more digits is not a different configuration
            params[name] = trial.suggest_float(name, d.low, d.high, step=None if d.log else 0.01, log=d.log)
        if name not in given:
            params[name] = round_draw(name, params[name], d.low, d.high, space.block, d.ladder)
    return params
