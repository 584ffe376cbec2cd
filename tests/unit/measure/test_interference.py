"""measure/interference.py and driver/measure_once.py: a run other processes disturbed is named,
measured again, and never counted when every try was disturbed."""

from types import SimpleNamespace

import pytest

from optimizer.driver import measure_once as once
from optimizer.measure.interference import disturbance
from optimizer.trial.spec import TrialResult

QUIET = {"seconds": 12.0, "others_busy": 0.05, "others": []}
BUSY = {"seconds": 12.0, "others_busy": 0.48,
        "others": [{"pid": 4242, "label": "python -c while True: pass", "cores": 0.95}]}


def test_a_run_whose_cores_went_to_others_is_disturbed_and_says_by_whom():
    assert disturbance(QUIET) == "" and disturbance(None) == "" and disturbance({}) == ""
    assert disturbance({**BUSY, "seconds": 1.0}) == ""  # too short a window to say
    why = disturbance(BUSY)
    assert why.startswith("other processes took 48% of its cores' time while it was measured")
    assert "pid 4242 (python -c while True: pass) 0.95 core" in why and why.endswith("using the machine")


class _Progress:
    def __init__(self):
        self.notes = []

    def note(self, text):
        self.notes.append(text)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """measure_once with its Ray task replaced by results handed out in turn (`cpus`: each run's replay_cpu)."""
    def run(cpus):
        results = iter(TrialResult(7, None, {"output_throughput": 100.0 + i}, replay_cpu=c) for i, c in enumerate(cpus))
        calls = []
        monkeypatch.setattr(once, "make_spec", lambda *a, **k: SimpleNamespace(number=7))
        monkeypatch.setattr(once, "run_task", lambda *a: calls.append(1) or next(results))
        monkeypatch.setattr(once, "store_trial", lambda *a: None)
        plan = SimpleNamespace(device=SimpleNamespace(fp8_kv=True), artifacts=tmp_path,
                               objective=SimpleNamespace(score=lambda m: m["output_throughput"], mode="replay",
                                                         slos=(), metric="output_throughput"))
        monkeypatch.setattr(once.outcome, "unscored_errors", lambda result, objective: False)
        progress = _Progress()
        value = once.measure_once(plan, {"max-num-seqs": 8}, 7, "trial-1/confirm-1", None, progress, None)
        return value, len(calls), progress.notes
    return run


def test_a_disturbed_re_measurement_is_measured_again_and_the_clean_run_counts(measured):
    value, runs, notes = measured([BUSY, QUIET])
    assert (value, runs) == (101.0, 2)
    assert len(notes) == 1 and notes[0].startswith("trial-1/confirm-1: disturbed (other processes took 48%")
    assert notes[0].endswith("measured again, not pooled")
    assert measured([QUIET]) == (100.0, 1, [])


def test_disturbed_on_every_try_it_is_not_counted_and_says_what_to_do(measured):
    value, runs, notes = measured([BUSY] * once.DISTURBED_TRIES)
    assert value is None and runs == once.DISTURBED_TRIES
    assert notes[-1].startswith(f"trial-1/confirm-1: disturbed on all {once.DISTURBED_TRIES} tries")
    assert "not counted; stop what else runs on the machine and run again" in notes[-1]


def test_a_disturbed_search_trials_line_says_so_and_a_quiet_one_says_nothing():
    import io

    import optuna
    from rich.console import Console

    from objectives import get_objective
    from optimizer.driver.progress import Progress

    study = optuna.create_study(direction="maximize")
    for v in (100.0, 101.0):
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=v))
    out = io.StringIO()
    progress = Progress(Console(file=out, width=300))
    metrics = {"output_throughput": 100.0, "ttft_ms_p95": 1.0, "tpot_ms_p95": 1.0, "error_rate": 0.0}
    for n, cpu in ((0, BUSY), (1, QUIET)):
        progress.trial_done(study, n, TrialResult(n, None, metrics, {"startup_s": 1.0}, replay_cpu=cpu),
                            optuna.trial.TrialState.COMPLETE, get_objective("throughput"))
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("    disturbed: other processes took 48% of its cores' time") and len(lines) == 3
