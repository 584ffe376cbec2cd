"""driver/confirm.py: the top configurations re-measured, a t-interval each, and 'no clear winner' on overlap."""

import math
import statistics

import optuna
import pytest

from optimizer.driver.confirm import candidates, remeasure
from optimizer.record.remeasured import CONFIRMATION as ATTR
from optimizer.measure.noise import estimate, pooled, rank


def study_with(values, direction="maximize", infeasible=()):
    study = optuna.create_study(direction=direction)
    for i, v in enumerate(values):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(i)])
        if i in infeasible:
            t.set_constraint("ttft_p95", 0.5)
        study.tell(t, v)
    return study


def test_an_estimate_is_a_geometric_mean_with_a_positive_log_scale_range():
    # Two runs 467.64 ms apart on average once printed a linear t-interval of [-932.94, 1868.22].
    values = [357.4, 577.9]
    e = estimate(0, values, pooled([values]))
    assert e.mean == pytest.approx(math.sqrt(357.4 * 577.9))
    assert 0 < e.low < e.mean < e.high
    assert e.mean / e.low == pytest.approx(e.high / e.mean)  # symmetric on the log scale
    sd = statistics.stdev([math.log(v) for v in values])
    assert math.log(e.high / e.mean) == pytest.approx(12.706 * sd / math.sqrt(2))
    assert estimate(1, [5.0], None).low is None  # no repeats anywhere: no range claimed


def test_a_configuration_measured_once_gets_the_noise_of_the_others_repeats():
    noise = pooled([[100.0, 110.0], [50.0, 52.0, 49.0]])
    one = estimate(2, [80.0], noise)
    assert one.mean == pytest.approx(80.0) and 0 < one.low < 80.0 < one.high
    assert math.log(one.high / 80.0) == pytest.approx(noise.t * noise.sd)


def test_candidates_are_the_best_feasible_distinct_configurations():
    study = study_with([5.0, 9.0, 7.0, 8.0], infeasible=(1,))
    assert [t.number for t in candidates(study, 2)] == [3, 2]
    assert [t.number for t in candidates(study_with([5.0, 1.0, 3.0], "minimize"), 2)] == [1, 2]
    assert candidates(study, 0) == []


def test_the_winner_is_clear_only_when_every_other_is_measurably_worse():
    noise = pooled([[10.0, 10.4, 9.8], [8.0, 8.2, 7.9]])
    far = rank({"0": [10.0, 10.4, 9.8], "1": [8.0, 8.2, 7.9]}, noise, maximize=True)
    assert far.winner == "0" and far.clear and far.ratios["1"].worse(maximize=True)
    close = rank({"0": [10.0, 10.4, 9.8], "2": [9.8, 10.1]}, noise, maximize=True)
    assert close.winner == "0" and not close.clear and close.ratios["2"].includes_one()
    assert rank({"0": [10.0], "1": [8.0]}, None, maximize=True).clear is False  # no noise: never clear
    alone = rank({"3": [5.0]}, noise, maximize=False)
    assert alone.winner == "3" and alone.clear and alone.alone
    assert rank({"0": [10.0, 10.4, 9.8], "1": [8.0, 8.2, 7.9]}, noise, maximize=False).winner == "1"


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
    assert calls == [(1, 2)]  # only what was missing; trial 2 (7.0) is already measurably worse: not booted
    assert record["runs"]["1"]["values"] == [9.0, 9.1, 9.2]
    assert record["runs"]["2"] == {"values": [7.0], "failed": 0, "settled": "1"}
    assert record["winner"] == 1 and record["clear"] is True
    assert record["intervals"]["1"]["n"] == 3 and record["intervals"]["2"]["n"] == 1
    assert record["ratios"]["2"]["high"] < 1 and record["noise"]["df"] == 2


def test_a_close_runner_up_is_measured_and_the_verdict_follows_the_pooled_noise():
    study = study_with([9.0, 9.3, 9.1])  # maximize: trial 1 leads by a hair
    wobble = {1: [9.5, 8.9], 2: [8.8, 9.4]}
    calls = []
    record = remeasure(study, top=2, repeats=2,
                       measure=lambda t, k: (calls.append((t.number, k)), wobble[t.number][k - 1])[1])
    assert calls == [(1, 1), (1, 2), (2, 1), (2, 2)]  # nothing settled: every run made
    assert record["clear"] is False and record["ratios"]["2"]["low"] < 1 < record["ratios"]["2"]["high"]


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
    from optimizer.verdict.confirmed import current_winner, settled

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
    for i, (v, base) in enumerate(((380.0, True), (300.0, False), (320.0, False))):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(16 * (i + 1))])
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, v)
    measured = []
    again = {0: 370.0, 1: 330.0, 2: 305.0}  # ~7% noise: the baseline's 1.2x is within it
    record = remeasure(study, top=2, repeats=1, measure=lambda t, k: (measured.append(t.number), again[t.number])[1])
    assert measured == [1, 2, 0] and record["baseline"] == 0
    assert record["candidates"] == ["1", "2"] and "0" not in record["intervals"] and record["winner"] in (1, 2)
    assert record["runs"]["0"]["values"] == [380.0, 370.0]


def test_a_baseline_already_measurably_worse_is_not_booted_again():
    study = optuna.create_study(direction="minimize")
    for i, (v, base) in enumerate(((9000.0, True), (300.0, False), (350.0, False))):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(16 * (i + 1))])
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, v)
    again = {1: 310.0, 2: 340.0}
    measured = []
    record = remeasure(study, top=2, repeats=1, measure=lambda t, k: (measured.append(t.number), again[t.number])[1])
    assert measured == [1, 2]  # 30x worse than the leader with df 2: the gain needs no second baseline run
    assert record["runs"]["0"]["settled"] == "1" and record["runs"]["0"]["values"] == [9000.0]


def test_a_confirmation_stored_with_the_earlier_statistic_is_read_with_this_one():
    from optimizer.verdict.confirmed import current_winner, read, settled

    study = study_with([5.0, 9.0, 8.9], direction="maximize")
    old = {"runs": {"1": {"values": [9.0, 8.0], "failed": 0}, "2": {"values": [8.9, 8.7], "failed": 0}},
           "repeats": 1, "top": 2, "candidates": ["1", "2"], "baseline": None, "disqualified": [],
           "intervals": {"1": {"mean": 8.5, "low": -3.9, "high": 20.9, "n": 2}}, "winner": 1, "clear": False}
    study.set_user_attr(ATTR, old)
    record = read(study)
    assert record.noise["df"] == 2 and all(ci["low"] > 0 for ci in record.intervals.values())
    assert record.winner == 2 and record.current  # 8.80 against 8.49: the geometric means decide
    assert current_winner(study) == 2 and not settled(study, 2, 1)  # the next run stores it again, no boot
    assert study.user_attrs[ATTR] == old  # reading writes nothing
    calls = []
    remeasure(study, top=2, repeats=1, measure=lambda t, k: calls.append(t.number))
    assert calls == [] and settled(study, 2, 1)
