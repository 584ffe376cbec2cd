"""A trial whose Ray worker died: Ray's memory monitor -> the configuration's fault (pruned);
anything else -> infrastructure (FAIL)."""

import optuna

from objectives import get_objective
from optimizer import outcome
from optimizer.trial import lost_trial_result


class OutOfMemoryError(Exception):  # same name as ray.exceptions.OutOfMemoryError
    pass


class WorkerCrashedError(Exception):
    pass


def test_memory_monitor_kill_while_starting_is_oom_startup():
    r = lost_trial_result(7, OutOfMemoryError("Task was killed due to the node running low on memory."), "starting")
    assert r.failure.kind == "oom_startup" and "gpu-memory-utilization" in r.failure.remedy
    assert "running low on memory" in r.failure.evidence


def test_memory_monitor_kill_under_load_is_oom_runtime():
    assert lost_trial_result(7, OutOfMemoryError("x"), "replaying").failure.kind == "oom_runtime"


def test_other_losses_are_infra_and_told_fail():
    study = optuna.create_study()
    trial = study.ask()
    r = lost_trial_result(trial.number, WorkerCrashedError("worker died"), "starting")
    state = outcome.tell(study, trial, r, get_objective("throughput"))
    assert state == optuna.trial.TrialState.FAIL
    assert study.trials[0].user_attrs["failure_kind"] == "infra"


def test_oom_is_told_pruned_so_tpe_learns_from_it():
    study = optuna.create_study()
    trial = study.ask()
    state = outcome.tell(study, trial, lost_trial_result(trial.number, OutOfMemoryError("x"), "starting"),
                         get_objective("throughput"))
    assert state == optuna.trial.TrialState.PRUNED
