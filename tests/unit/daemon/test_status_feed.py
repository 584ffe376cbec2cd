"""daemon/status_feed.py: what the status API shows follows the driver's events on a real study."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from rich.console import Console

from objectives import get_objective
from optimizer.daemon.status_api import StatusState
from optimizer.daemon.status_feed import StatusProgress, best_of, masked, trial_counts
from optimizer.engine.failures import Failure
from optimizer.measure.slo import parse_slos
from optimizer.trial.spec import TrialResult


def _study(direction="maximize"):
    return optuna.create_study(direction=direction)


def _complete(study, value, args, infeasible=False):
    t = study.ask()
    t.set_user_attr("vllm_args", args)
    if infeasible:
        t.storage.set_trial_system_attr(t._trial_id, "constraints", (1.0,))
    study.tell(t, value)


def test_best_is_the_best_feasible_trial_with_its_command():
    study = _study()
    obj = get_objective("throughput", None, ())
    _complete(study, 100.0, ["--max-num-seqs", "8"])
    _complete(study, 300.0, ["--max-num-seqs", "64"], infeasible=True)  # faster, but misses an SLO
    _complete(study, 200.0, ["--max-num-seqs", "32"])
    best = best_of(study, obj, "/models/m")
    assert best["number"] == 2 and best["value"] == 200.0 and best["direction"] == "maximize"
    assert best["command"] == "vllm serve /models/m --max-num-seqs 32"


def test_best_minimizes_a_latency_and_is_none_before_any_trial():
    study = _study("minimize")
    obj = get_objective("latency", "ttft_p95", parse_slos("tpot:50"))
    assert best_of(study, obj, "m") is None
    _complete(study, 900.0, [])
    _complete(study, 300.0, ["--max-num-seqs", "4"])
    assert best_of(study, obj, "m")["number"] == 1


def test_counts_cover_every_state():
    study = _study()
    _complete(study, 1.0, [])
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    study.tell(study.ask(), state=optuna.trial.TrialState.PRUNED)
    study.ask()
    study.enqueue_trial({})
    assert trial_counts(study) == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 1, "RUNNING": 1, "WAITING": 1}


def test_the_password_never_reaches_the_status():
    assert masked("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert masked("sqlite:////tmp/trials.db") == "sqlite:////tmp/trials.db"


def test_events_move_the_state():
    state = StatusState()
    progress = StatusProgress(Console(file=open("/dev/null", "w")), state, generation=3)
    study = _study()
    obj = get_objective("throughput", None, ())
    plan = SimpleNamespace(
        cfg=SimpleNamespace(study_name="s", n_trials=4, early_stop=SimpleNamespace(enabled=False, stages=4), search=SimpleNamespace(screen=False, prior="none"),
                            confirm=SimpleNamespace(top=0, repeats=0), precheck=True, ray=SimpleNamespace(address=None)),
        storage_url="postgresql://u:pw@h/db", objective=obj,
        model=SimpleNamespace(source="/m", layers=2, kv_bytes_per_token=lambda: 2048),
        device=SimpleNamespace(kind="gpu"), workload=SimpleNamespace(description="w", notes=(), content_hash=lambda: "ab" * 32),
        space=SimpleNamespace(dims=(), notes=()))
    progress.opened(plan, study, 0)
    snap = state.snapshot()
    assert (snap["state"], snap["generation"], snap["n_trials"], snap["storage"]) == ("tuning", 3, 4, "postgresql://u:***@h/db")
    trial = study.ask()
    progress.trial_started(trial.number, 1, 4, {"max-num-seqs": 8}, True)
    progress.phase(trial.number, "replaying", 12.0)
    snap = state.snapshot()
    assert snap["running"]["number"] == 0 and snap["running"]["phase"] == "replaying"
    assert snap["trials"]["RUNNING"] == 1
    trial.set_user_attr("vllm_args", ["--max-num-seqs", "8"])
    study.tell(trial, 50.0)
    result = TrialResult(0, None, {"output_throughput": 50.0, "ttft_ms_p95": 1.0, "tpot_ms_p95": 1.0,
                                   "error_rate": 0.0}, {"startup_s": 1.0})
    progress.trial_done(study, 0, result, optuna.trial.TrialState.COMPLETE, obj)
    snap = state.snapshot()
    assert snap["running"] is None and snap["trials"]["COMPLETE"] == 1 and snap["best"]["value"] == 50.0
    progress.waiting_disk("/a", "No space left on device")
    assert state.snapshot()["state"] == "waiting_disk" and "No space" in state.snapshot()["last_error"]
    progress.disk_back("/a")
    assert state.snapshot()["state"] == "tuning" and state.snapshot()["last_error"] is None
    failed = TrialResult(1, Failure("infra", "disk: x", "free space"), {}, {})
    t2 = study.ask()
    study.tell(t2, state=optuna.trial.TrialState.FAIL)
    progress.trial_done(study, t2.number, failed, optuna.trial.TrialState.FAIL, obj)
    assert state.snapshot()["trials"]["FAIL"] == 1


def test_parallel_trials_are_all_listed_while_they_run():
    state = StatusState()
    progress = StatusProgress(Console(file=open("/dev/null", "w")), state)
    study = _study()
    obj = get_objective("throughput", None, ())
    progress._study = study
    a, b = study.ask(), study.ask()
    progress.trial_started(a.number, 1, 4, {"max-num-seqs": 8}, True)
    progress.trial_started(b.number, 2, 4, {"max-num-seqs": 16}, False)
    progress.phase(a.number, "replaying", 70.0)
    snap = state.snapshot()
    assert [(t["number"], t["phase"]) for t in snap["running_trials"]] == [(0, "replaying"), (1, "queued")]
    assert snap["running"]["number"] == 1  # the newest
    study.tell(a, 10.0)
    progress.trial_done(study, a.number, TrialResult(0, None, {"output_throughput": 10.0, "ttft_ms_p95": 1.0,
                                                               "tpot_ms_p95": 1.0, "error_rate": 0.0}, {}),
                        optuna.trial.TrialState.COMPLETE, obj)
    snap = state.snapshot()
    assert [t["number"] for t in snap["running_trials"]] == [1] and snap["running"]["number"] == 1


def test_a_repeat_never_shows_as_running_and_counts_as_finished():
    state = StatusState()
    progress = StatusProgress(Console(file=open("/dev/null", "w")), state)
    study = _study()
    progress._study = study
    _complete(study, 10.0, ["--max-num-seqs", "8"])
    t = study.ask()
    study.tell(t, 10.0)  # told the finished trial's value (driver/launch.py), never booted nor started
    progress.repeated(study, t.number, {"max-num-seqs": 8}, 0, optuna.trial.TrialState.COMPLETE)
    snap = state.snapshot()
    assert snap["running_trials"] == [] and snap["running"] is None and snap["trials"]["COMPLETE"] == 2


def test_the_status_feed_takes_every_progress_event_as_the_driver_sends_it():
    """StatusProgress overrides Progress's events: each override takes the same parameters (a
    driver call with a new argument once crashed the daemon at its first trial)."""
    import inspect

    from optimizer.driver.progress import Progress

    for name, fn in vars(StatusProgress).items():
        if callable(fn) and not name.startswith("_") and name in vars(Progress):
            assert list(inspect.signature(fn).parameters) == list(inspect.signature(getattr(Progress, name)).parameters), name
