"""Configurations queued ahead of the sampler: the baseline first and the configured warm starts,
and a configuration queued once more after a failure that says nothing about it."""

from __future__ import annotations

import optuna

from optimizer.config import flags
from optimizer.record import of_trial


def queue_first(study: optuna.Study, baseline: dict, warm_starts) -> None:
    """Queue the baseline first, then the configured warm starts (once per study)."""
    if any(of_trial.is_baseline(t) for t in study.get_trials(deepcopy=False)):
        return
    of_trial.enqueue_baseline(study, baseline)
    for params in warm_starts:
        of_trial.enqueue_configured(study, dict(params))


def queue_again(study: optuna.Study, trial, always: bool = False, reason: str = "") -> bool:
    """Queue a FAIL trial's configuration once more: an infrastructure fault says nothing
    about the configuration. Once per configuration, unless `always` (interrupted runs, a full disk)."""
    if not always and of_trial.retry_of(trial) is not None:
        return False
    ran = flags.from_cli_args(of_trial.vllm_args(trial))  # the rounded values it ran with
    params = {name: ran.get(name, value) for name, value in trial.params.items()}
    of_trial.enqueue_again(study, params, of_trial.roles(trial), trial.number, reason)
    return True
