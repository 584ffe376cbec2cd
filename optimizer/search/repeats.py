"""A configuration the sampler proposes again: an exact repeat of a finished trial (the same vLLM
flags, likely once values run on ladders) is told that trial's outcome without a boot and noted
`repeat_of`; it does not count against the budget, and a streak of them is convergence
(search/convergence.py)."""

from __future__ import annotations

import optuna

from optimizer.record import of_trial
from optimizer.verdict.trials import FINISHED


def repeated_trial(study: optuna.Study, vllm_args, number: int) -> optuna.trial.FrozenTrial | None:
    """The first finished trial (COMPLETE or PRUNED, not itself a repeat) that ran exactly `vllm_args`."""
    args = list(vllm_args)
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        if t.number != number and not of_trial.is_repeat(t) and of_trial.vllm_args(t) == args:
            return t
    return None


def tell_repeat(study: optuna.Study, trial: optuna.Trial, source: optuna.trial.FrozenTrial, budget: int):
    """Tell `trial` the outcome `source` had (its values and constraints, or PRUNED); returns the state.
    `budget` (the n_trials in force) is kept with it: a raised budget starts a new convergence streak."""
    of_trial.mark_repeat(trial, source, budget)  # what it measured and how it was judged, not how it booted
    for key, value in (source.constraints or {}).items():
        trial.set_constraint(key, value)
    if source.state == optuna.trial.TrialState.COMPLETE:
        study.tell(trial, source.values, skip_if_finished=True)
    else:
        study.tell(trial, state=source.state, skip_if_finished=True)
    return source.state
