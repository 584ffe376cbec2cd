"""measure/validity.py: a replay the client could not keep, or whose tokens the server disputes, is replay_invalid
and told FAIL (retried, never scored)."""

import optuna
import pytest

from objectives import get_objective
from optimizer.driver import tell as outcome
from optimizer.measure.replay import RequestRecord
from optimizer.measure.validity import check, send_rate_ratio, token_mismatch
from optimizer.trial.spec import TrialResult
from optimizer.workload import Request, Workload

LAG, RATIO = 10.0, 0.95


def workload(offsets, concurrency=None, after=None) -> Workload:
    after = after or [None] * len(offsets)
    reqs = tuple(Request(f"r{i}", (5,) * 10, 4, o, a) for i, (o, a) in enumerate(zip(offsets, after)))
    return Workload("t", reqs, (), concurrency)


def records(sent, ok=None, prompt=10, output=4) -> tuple[RequestRecord, ...]:
    ok = ok or [True] * len(sent)
    return tuple(RequestRecord(f"r{i}", s, s, s + 0.01, s + 0.05, (s + 0.01, s + 0.05), prompt,
                               output if good else 0, 4, good, 200 if good else 500)
                 for i, (s, good) in enumerate(zip(sent, ok)))


GOOD_SERVER = {"prompt_tokens": 40.0, "generation_tokens": 16.0}
W = workload([0.0, 1.0, 2.0, 3.0])
ON_TIME = records([0.0, 1.0, 2.0, 3.0])


def test_everything_in_order_is_valid():
    metrics = {"schedule_lag_p50_ms": 2.0, "send_rate_ratio": send_rate_ratio(W, ON_TIME)}
    assert metrics["send_rate_ratio"] == pytest.approx(1.0)
    assert check(W, ON_TIME, metrics, GOOD_SERVER, LAG, RATIO) is None
    assert check(W, ON_TIME, {"schedule_lag_p50_ms": LAG}, GOOD_SERVER, LAG, RATIO) is None  # at the limit


def test_lag_above_the_threshold_is_invalid():
    f = check(W, ON_TIME, {"schedule_lag_p50_ms": 25.0}, GOOD_SERVER, LAG, RATIO)
    assert f.kind == "replay_invalid" and "25.0 ms" in f.evidence and "10 ms" in f.evidence
    assert "trial_cpus" in f.remedy


def test_send_rate_below_the_minimum_is_invalid():
    late = records([0.0, 1.25, 2.5, 3.75])  # 3 s of schedule sent over 3.75 s: 80% of the rate
    ratio = send_rate_ratio(W, late)
    assert ratio == pytest.approx(0.8)
    f = check(W, late, {"schedule_lag_p50_ms": 1.0, "send_rate_ratio": ratio}, GOOD_SERVER, LAG, RATIO)
    assert f.kind == "replay_invalid" and "80.0%" in f.evidence
    assert check(W, late, {"send_rate_ratio": ratio}, GOOD_SERVER, LAG, 0.75) is None


def test_token_mismatch_is_invalid_and_names_both_counts():
    server = {"prompt_tokens": 40.0, "generation_tokens": 17.0}  # the client saw 4 x 10 prompt, 4 x 4 output
    f = check(W, ON_TIME, {}, server, LAG, RATIO)
    assert f.kind == "replay_invalid"
    assert "sent 40 prompt tokens and asked for 16 output tokens" in f.evidence and "40 / 17" in f.evidence
    assert token_mismatch(W, ON_TIME, GOOD_SERVER) is None


def test_prompt_token_mismatch_is_invalid_too():
    f = check(W, ON_TIME, {}, {"prompt_tokens": 41.0, "generation_tokens": 16.0}, LAG, RATIO)
    assert f.kind == "replay_invalid" and "40 prompt" in f.evidence and "41 / 16" in f.evidence


def test_failed_requests_skip_the_token_cross_check():
    recs = records([0.0, 1.0, 2.0, 3.0], ok=[True, False, True, True])
    assert check(W, recs, {}, {"prompt_tokens": 0.0, "generation_tokens": 0.0}, LAG, RATIO) is None
    assert check(W, ON_TIME, {}, {}, LAG, RATIO) is None  # no server snapshot: nothing to compare


def test_send_rate_ratio_is_none_for_a_closed_loop_or_too_few_requests():
    assert send_rate_ratio(workload([0.0] * 4, concurrency=2), ON_TIME) is None
    assert send_rate_ratio(workload([0.0, 1.0]), records([0.0, 5.0])) is None
    assert send_rate_ratio(workload([0.0, 0.0, 0.0]), records([0.0, 0.0, 0.0])) is None  # nothing scheduled


def test_send_rate_ratio_ignores_requests_that_wait_for_a_reply():
    # r1 and r3 follow earlier replies: their send times depend on the server, not the schedule
    w = workload([0.0, 0.5, 1.0, 0.5, 2.0], after=[None, "r0", None, "r2", None])
    recs = records([0.0, 9.0, 1.0, 30.0, 2.0])
    assert send_rate_ratio(w, recs) == pytest.approx(1.0)


def test_replay_invalid_is_told_fail_with_its_kind():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    metrics = {"output_throughput": 123.0, "schedule_lag_p50_ms": 50.0}
    failure = check(W, ON_TIME, metrics, GOOD_SERVER, LAG, RATIO)
    result = TrialResult(trial.number, failure, metrics=metrics, records=ON_TIME)
    state, judged = outcome.tell(study, trial, result, get_objective("throughput"))
    assert state == optuna.trial.TrialState.FAIL and judged.failure.kind == "replay_invalid"
    t = study.trials[0]
    assert t.state == optuna.trial.TrialState.FAIL and t.value is None  # never scored
    assert t.user_attrs["failure_kind"] == "replay_invalid" and "50.0 ms" in t.user_attrs["evidence"]


def test_a_valid_replay_is_scored():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    metrics = {"output_throughput": 123.0, "schedule_lag_p50_ms": 1.0}
    result = TrialResult(trial.number, check(W, ON_TIME, metrics, GOOD_SERVER, LAG, RATIO), metrics=metrics,
                         records=ON_TIME)
    state, _ = outcome.tell(study, trial, result, get_objective("throughput"))
    assert state == optuna.trial.TrialState.COMPLETE and study.trials[0].value == 123.0
