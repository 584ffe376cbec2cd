"""A trial whose Ray worker died: Ray's memory monitor -> the configuration's fault (pruned);
anything else -> infrastructure (FAIL)."""

import optuna

from objectives import get_objective
from optimizer.driver import tell as outcome
from optimizer.trial.spec import lost_trial_result


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
    state, _ = outcome.tell(study, trial, r, get_objective("throughput"))
    assert state == optuna.trial.TrialState.FAIL
    assert study.trials[0].user_attrs["failure_kind"] == "infra"


def test_oom_is_told_pruned_so_tpe_learns_from_it():
    study = optuna.create_study()
    trial = study.ask()
    state, _ = outcome.tell(study, trial, lost_trial_result(trial.number, OutOfMemoryError("x"), "starting"),
                         get_objective("throughput"))
    assert state == optuna.trial.TrialState.PRUNED


def test_a_run_with_failed_requests_is_pruned_not_scored():
    from optimizer.measure.replay import RequestRecord
    from optimizer.trial.spec import TrialResult

    ok = RequestRecord("a", 0, 0, 0.1, 0.5, (0.1, 0.5), 10, 2, 2, True, 200)
    bad = RequestRecord("b", 0, 0, None, None, (), 10, 0, 2, False, 400, "too long")
    study = optuna.create_study()
    trial = study.ask()
    result = TrialResult(trial.number, None, {"output_throughput": 4.0}, records=(ok, bad))
    state, judged = outcome.tell(study, trial, result, get_objective("throughput"))
    assert state == optuna.trial.TrialState.PRUNED
    assert judged.failure.kind == "request_errors" and "1 of 2 requests failed" in judged.failure.evidence


def test_the_lost_servers_note_says_what_the_driver_found_only_for_a_dead_worker():
    import ray

    from optimizer.driver import poll

    died = ray.exceptions.WorkerCrashedError()
    assert poll.lost_server_note(died, poll.GONE).endswith("had already stopped with it (nothing left to reap)")
    assert poll.lost_server_note(died, poll.REAPED).endswith("was still running, and the driver stopped it")
    assert poll.lost_server_note(died, "unknown") is None  # never heard of a server: nothing to say
    raised = ray.exceptions.RayTaskError("run_trial", "Traceback ...", ValueError("a bug"))
    assert poll.lost_server_note(raised, poll.GONE) is None  # the task stopped its own server
