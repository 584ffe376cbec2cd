"""driver/confirm.py: the top configurations re-measured, a t-interval each, and 'no clear winner' on overlap."""

import math
import statistics

import optuna
import pytest

from optimizer.driver.confirm import ATTR, candidates, remeasure
from optimizer.measure.noise import interval, verdict


def study_with(values, direction="maximize", infeasible=()):
    study = optuna.create_study(direction=direction)
    for i, v in enumerate(values):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(i)])
        if i in infeasible:
            t.set_constraint("ttft_p95", 0.5)
        study.tell(t, v)
    return study


def test_interval_is_students_t():
    i = interval(0, [10.0, 12.0, 14.0])
    half = 4.303 * statistics.stdev([10.0, 12.0, 14.0]) / math.sqrt(3)
    assert i.mean == 12.0 and i.low == pytest.approx(12 - half) and i.high == pytest.approx(12 + half)
    one = interval(1, [5.0])
    assert math.isinf(one.low) and math.isinf(one.high)  # one value claims no precision


def test_candidates_are_the_best_feasible_distinct_configurations():
    study = study_with([5.0, 9.0, 7.0, 8.0], infeasible=(1,))
    assert [t.number for t in candidates(study, 2)] == [3, 2]
    assert [t.number for t in candidates(study_with([5.0, 1.0, 3.0], "minimize"), 2)] == [1, 2]
    assert candidates(study, 0) == []


def test_verdict_clear_only_without_overlap():
    a, b = interval(0, [10.0, 10.2, 9.9]), interval(1, [8.0, 8.1, 7.9])
    assert verdict([b, a], maximize=True) == (a, True)
    c = interval(2, [9.0, 11.0, 10.5])
    winner, clear = verdict([a, c], maximize=True)
    assert winner in (a, c) and not clear
    assert verdict([a, b], maximize=False)[0] == b


def test_remeasure_records_each_run_and_resumes(tmp_path):
    study = study_with([5.0, 9.0, 7.0])
    calls = []

    def measure(trial, k):
        calls.append((trial.number, k))
        if len(calls) == 2:
            raise KeyboardInterrupt  # interrupted after one run: it must be kept
        return trial.value + 0.1 * k

    with pytest.raises(KeyboardInterrupt):
        remeasure(study, top=2, repeats=2, measure=measure)
    kept = study.user_attrs[ATTR]["runs"]
    assert kept == {"1": {"values": [9.0, 9.1], "failed": 0}}

    calls.clear()
    record = remeasure(study, top=2, repeats=2, measure=lambda t, k: (calls.append((t.number, k)), t.value + 0.1 * k)[1])
    assert calls == [(1, 2), (2, 1), (2, 2)]  # only what was missing
    assert record["runs"]["1"]["values"] == [9.0, 9.1, 9.2] and record["runs"]["2"]["values"] == [7.0, 7.1, 7.2]
    assert record["winner"] == 1 and record["clear"] is True
    assert record["intervals"]["1"]["n"] == 3


def test_a_failed_remeasure_counts_as_a_run_but_not_a_value():
    study = study_with([5.0, 9.0])
    record = remeasure(study, top=1, repeats=2, measure=lambda t, k: None if k == 1 else 9.5)
    assert record["runs"]["1"] == {"values": [9.0, 9.5], "failed": 1}


def test_a_configuration_that_failed_a_remeasure_is_disqualified():
    study = study_with([100.0, 90.0])  # trial 0 looked best once
    record = remeasure(study, top=2, repeats=2,
                       measure=lambda t, k: None if t.number == 0 else 90.0 + k)
    assert record["winner"] == 1 and record["disqualified"] == [0]
    assert "0" not in record["intervals"]


def test_new_trials_make_the_confirmation_stale():
    from optimizer.report.confirmed import current_winner, settled

    study = study_with([5.0, 9.0])
    remeasure(study, top=1, repeats=1, measure=lambda t, k: t.value)
    assert settled(study, 1, 1) and current_winner(study) == 1
    t = study.ask()
    t.set_user_attr("vllm_args", ["--max-num-seqs", "99"])
    study.tell(t, 20.0)  # a raised budget found a better configuration
    assert not settled(study, 1, 1) and current_winner(study) is None
    assert not settled(study, 1, 2)  # other settings: not settled either


def test_the_baseline_is_re_measured_beside_the_top_but_never_made_the_winner():
    study = optuna.create_study(direction="minimize")
    for i, (v, base) in enumerate(((900.0, True), (300.0, False), (320.0, False))):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(16 * (i + 1))])
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, v)
    measured = []
    record = remeasure(study, top=2, repeats=1, measure=lambda t, k: (measured.append(t.number), t.value)[1])
    assert sorted(measured) == [0, 1, 2] and record["baseline"] == 0
    assert record["candidates"] == ["1", "2"] and "0" not in record["intervals"] and record["winner"] == 1
    assert record["runs"]["0"]["values"] == [900.0, 900.0]
