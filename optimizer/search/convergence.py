"""When the search is over: the budget spent, or the sampler converged (it keeps proposing
configurations already measured)."""

from __future__ import annotations

import optuna

from optimizer.record import of_trial
from optimizer.verdict.trials import FINISHED, finished_count

# The search is over when the sampler proposes this many configurations in a row that were
# already measured: it has converged (on the measured landscape, bench/search_efficiency.py,
# stopping there found what searching on found, after a median 20 of 48 boots).
CONVERGED_AFTER = 8


def repeat_streak(study: optuna.Study, n_trials: int | None = None) -> int:
    """How many of the last finished trials, in a row, were repeats. With `n_trials`, only repeats
    told under a budget at least that large count (a repeat stored without one counts under none):
    raising `n_trials` after the search converged starts a new streak, so the search goes on."""
    streak = 0
    for t in sorted(study.get_trials(deepcopy=False, states=FINISHED), key=lambda t: -t.number):
        if not of_trial.is_repeat(t) or (n_trials is not None and of_trial.budget(t) < n_trials):
            break
        streak += 1
    return streak


def converged(study: optuna.Study, n_trials: int) -> bool:
    """The sampler has converged: CONVERGED_AFTER repeats in a row under this budget."""
    return repeat_streak(study, n_trials) >= CONVERGED_AFTER


def search_over(study: optuna.Study, n_trials: int) -> bool:
    """The budget is spent, or the sampler has converged."""
    return finished_count(study) >= n_trials or converged(study, n_trials)
