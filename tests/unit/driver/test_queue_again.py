"""Infrastructure faults are retried with the same configuration (once), and an interrupted
or abandoned baseline is measured on the next run, not lost."""

import optuna

from optimizer.driver.recovery import recover
from optimizer.search.enqueue import queue_again

FAIL = optuna.trial.TrialState.FAIL


def _failed_baseline(study):
    study.enqueue_trial({"x": 3}, user_attrs={"baseline": True})
    trial = study.ask()
    trial.suggest_int("x", 0, 10)
    study.tell(trial, state=FAIL)
    return trial


def test_a_failed_baseline_is_queued_again_with_its_role_and_params():
    study = optuna.create_study()
    first = _failed_baseline(study)
    assert queue_again(study, first) is True
    retry = study.ask()
    assert retry.suggest_int("x", 0, 10) == 3
    assert retry.user_attrs["baseline"] is True and retry.user_attrs["retry_of"] == first.number


def test_a_retry_that_fails_again_is_not_retried_unless_interrupted():
    study = optuna.create_study()
    queue_again(study, _failed_baseline(study))
    retry = study.ask()
    retry.suggest_int("x", 0, 10)
    study.tell(retry, state=FAIL)
    assert queue_again(study, retry) is False
    assert queue_again(study, retry, always=True) is True


def test_recover_fails_running_trials_of_a_dead_driver_and_queues_them():
    study = optuna.create_study()
    study.enqueue_trial({"x": 7}, user_attrs={"baseline": True})
    left = study.ask()
    left.suggest_int("x", 0, 10)  # the driver died here: the trial stays RUNNING
    assert recover(study) == 1
    assert study.trials[left.number].state == FAIL
    again = study.ask()
    assert again.suggest_int("x", 0, 10) == 7 and again.user_attrs["baseline"] is True
