"""The sampler that draws each configuration after the queued ones: Optuna's TPE."""

from __future__ import annotations

import optuna


def sampler(seed: int, trials_so_far: int, multi: bool) -> optuna.samplers.BaseSampler:
    """TPE with a constant liar (trials started side by side are kept apart), four random draws
    first, and one joint density over the knobs (multivariate) for a single objective, as Optuna 5
    does by default, said here so a change of Optuna's default cannot change the search
    (docs/search.md). Seeded, but not the same seed on every resume (`trials_so_far` added): that
    would replay the same first draws."""
    return optuna.samplers.TPESampler(seed=seed + trials_so_far, constant_liar=True,
                                      n_startup_trials=4, multivariate=not multi)
