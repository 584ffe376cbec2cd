"""The knobs an asked trial runs: a queued configuration as it was queued, or the sampler's draws
around the knobs screening holds at the baseline's value."""

from __future__ import annotations

from optimizer.config.space import SearchSpace
from optimizer.record import of_trial
from optimizer.search.suggest import suggest


def trial_params(trial, space: SearchSpace, baseline: dict, held: set[str] = frozenset()) -> dict:
    """The knobs a trial runs: the baseline's (a screening trial: with its one knob moved), or the
    sampler's draws with the `held` knobs at the baseline's value (search/screening.py) and the
    baseline's knobs the space does not search."""
    if of_trial.is_baseline(trial) or of_trial.is_screen(trial):
        fixed = {**baseline, **(getattr(trial, "_fixed_params", None) or {})}
        params = suggest(trial, space, only=set(fixed))
        return {**fixed, **params}  # baseline knobs outside the space still reach vLLM
    searched = {d.knob.name for d in space.dims}
    kept = {k: baseline[k] for k in held if baseline.get(k) is not None}
    outside = {k: v for k, v in baseline.items() if k not in searched and v is not None}  # not searched: the baseline's
    return {**outside, **kept, **suggest(trial, space, only=searched - set(kept))}
