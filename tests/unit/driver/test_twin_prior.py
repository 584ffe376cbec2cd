"""search/prior.py and its use in driver/launch.py (`search.prior: twin`): every proposed configuration
is predicted before it boots; one predicted to lose beyond the twin's own band on the study is told
PRUNED without a boot, and so is never the recommendation, a candidate or a reversion's evidence;
nothing is told without a boot until the twin's error on the study is known, so a twin that lies
only changes the boot order; screening's moves are queued best predicted first."""

import io
import math

import optuna
import pytest
from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.driver.launch import Running, launch
from optimizer.driver.plan import open_study, prepare
from optimizer.driver.progress import Progress
from optimizer.errors import ConfigError
from optimizer.record import of_trial
from optimizer.search import prior
from optimizer.search.prior import Predicted
from optimizer.twin.prediction import BAND_ONE_RUN
from optimizer.verdict.trials import ranked_feasible, savings

COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED


def config(tmp_path, tiny_model, **extra):
    return build_config({
        "study_name": "prior", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "precheck": False,
        "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
        "space": {"max-num-seqs": {"low": 4, "high": 64}}, "baseline": {"max-num-seqs": 8},
        "objective": {"name": "throughput"}, "search": {"prior": "twin", "screen": False},
        "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16], "long_input": [32, 64],
                     "output": [4, 8]}, **extra})


@pytest.fixture
def opened(tmp_path, tiny_model, booted):
    study, plan = open_study(prepare(config(tmp_path, tiny_model)))
    return study, plan, booted


def measured(study, value: float, predicted: float | None, seqs: int) -> None:
    """A finished trial the twin predicted (or not) before it ran (flags no sampled trial repeats)."""
    attrs = {"vllm_args": ["--max-num-seqs", str(seqs), "--seed", "7"], "metrics": {"output_throughput": value}}
    if predicted is not None:
        attrs["prior"] = Predicted(predicted, (0,)).as_dict()
    study.add_trial(optuna.trial.create_trial(
        state=COMPLETE, value=value, params={"max-num-seqs": seqs},
        distributions={"max-num-seqs": optuna.distributions.IntDistribution(4, 256, log=True)}, user_attrs=attrs))


def launched(study, plan, monkeypatch, predicted_value: float):
    monkeypatch.setattr(prior, "predict", lambda plan, params, runs=None: Predicted(predicted_value, (0,)))
    out = io.StringIO()
    got = launch(study, plan, None, Progress(Console(file=out, width=300)), None, 0)
    return got, out.getvalue()


def test_the_band_is_the_twins_own_error_on_the_study_and_unknown_before_three_trials(opened):
    study, _, _ = opened
    measured(study, 100.0, 110.0, 8)
    measured(study, 200.0, 190.0, 16)
    assert prior.band(study) is None  # two residuals: the twin's error here is not known yet
    measured(study, 50.0, None, 4)  # not predicted: says nothing about the twin
    assert prior.band(study) is None
    measured(study, 150.0, 153.0, 32)
    assert prior.band(study) == pytest.approx(math.expm1(math.log(110 / 100)))  # the largest of three
    measured(study, 151.0, 151.0, 40)
    assert prior.band(study) == pytest.approx(0.10)  # a perfect fourth does not narrow below what was seen
    assert prior.loses(Predicted(80.0, (0,)), 200.0, True, 0.10) is not None
    assert prior.loses(Predicted(190.0, (0,)), 200.0, True, 0.10) is None  # 209 at its best: may win
    assert prior.loses(Predicted(80.0, (0,), ("KV dtype fp8 never calibrated",)), 200.0, True, 0.10) is None


def test_one_predicted_to_lose_is_pruned_without_a_boot_and_never_ranked(opened, monkeypatch):
    study, plan, booted = opened
    for value, pred, seqs in ((100.0, 101.0, 8), (120.0, 118.0, 16), (90.0, 92.0, 4)):
        measured(study, value, pred, seqs)
    state, failure = launched(study, plan, monkeypatch, 40.0)[0]
    t = study.trials[-1]
    assert state == PRUNED and failure.kind == "predicted_to_lose" and not booted
    assert failure.evidence.startswith("predicted, not booted: the twin puts it at 40 ")
    assert of_trial.prior(t)["value"] == 40.0 and of_trial.failure_kind(t) == "predicted_to_lose"
    assert t.number not in [r.number for r in ranked_feasible(study, True)]
    assert savings(study)["predicted"] == 1
    # within its band of the best measured (120): booted, the prediction kept on the trial
    got, out = launched(study, plan, monkeypatch, 117.0)
    assert isinstance(got, Running) and len(booted) == 1
    assert of_trial.prior(got.trial)["value"] == 117.0
    assert "twin: trial" in out and "predicted at 117 tok/s (its band +-5%)" in out


def test_nothing_is_told_without_a_boot_before_the_twin_has_shown_its_error(opened, monkeypatch):
    """No measured baseline to check the twin against, and two residuals: its error here is unknown."""
    study, plan, booted = opened
    measured(study, 100.0, 100.0, 8)
    measured(study, 120.0, 119.0, 16)
    got, out = launched(study, plan, monkeypatch, 1.0)  # predicted at 1% of the best: booted all the same
    assert isinstance(got, Running) and len(booted) == 1
    assert "its band here not known yet: booted" in out


@pytest.mark.parametrize("lie", [2.0, 0.5])
def test_a_twin_that_lies_consistently_only_changes_the_order(lie):
    """Step costs 2x off make every predicted throughput 0.5x (and 0.5x off, 2x): the residuals show it,
    the band covers it, and the best configuration is never told without a boot, whatever the order."""
    truth = {seqs: v for seqs, v in zip((4, 8, 16, 32, 64, 128), (50.0, 90.0, 140.0, 170.0, 160.0, 120.0))}
    for order in ((4, 8, 16, 32, 64, 128), (128, 64, 16, 8, 4, 32), (8, 4, 64, 128, 16, 32)):
        study = optuna.create_study(direction="maximize")
        pruned = []
        for seqs in order:
            predicted = Predicted(truth[seqs] / lie, (0,))
            best = max((t.value for t in study.get_trials(states=(COMPLETE,))), default=None)
            if prior.loses(predicted, best, True, prior.band(study)) is not None:
                pruned.append(seqs)
                continue
            measured(study, truth[seqs], predicted.value, seqs)
        assert 32 not in pruned  # the best
        assert max(t.value for t in study.get_trials(states=(COMPLETE,))) == 170.0


def test_screening_is_queued_best_predicted_first(opened, monkeypatch):
    _, plan, _ = opened
    values = {"max-num-seqs": {16: 50.0}, "gpu-memory-utilization": {0.5: 80.0}}

    def fake(plan, params, runs=None):
        for knob, by_value in values.items():
            if params.get(knob) in by_value:
                return Predicted(by_value[params[knob]], (0,))
        return None  # the twin cannot answer: keeps its place, after the predicted ones

    monkeypatch.setattr(prior, "predict", fake)
    moves = [("max-num-seqs", 16), ("kv-cache-dtype", "fp8"), ("gpu-memory-utilization", 0.5)]
    assert prior.order(plan, moves, {"max-num-seqs": 8}) == [
        ("gpu-memory-utilization", 0.5), ("max-num-seqs", 16), ("kv-cache-dtype", "fp8")]


def test_a_pareto_or_goodput_objective_is_refused_with_the_prior(tmp_path, tiny_model):
    with pytest.raises(ConfigError, match="search.prior: twin predicts one replayed value"):
        prepare(config(tmp_path, tiny_model, objective={"name": "pareto"}))


def test_a_twin_that_fails_is_said_and_the_configuration_boots(opened, monkeypatch):
    study, plan, booted = opened

    def broken(plan, params, runs=None):
        raise TypeError("a step cost it cannot read")

    monkeypatch.setattr(prior, "predict", broken)
    out = io.StringIO()
    got = launch(study, plan, None, Progress(Console(file=out, width=300)), None, 0)
    assert isinstance(got, Running) and len(booted) == 1
    assert "the twin could not predict trial 0 (TypeError: a step cost it cannot read): booted" in out.getvalue()


def _baseline(study, value: float) -> None:
    """The baseline's measured run (8 sequences)."""
    study.add_trial(optuna.trial.create_trial(
        state=COMPLETE, value=value, params={"max-num-seqs": 8},
        distributions={"max-num-seqs": optuna.distributions.IntDistribution(4, 256, log=True)},
        user_attrs={"baseline": True, "vllm_args": ["--max-num-seqs", "8"], "metrics": {"output_throughput": value}}))


def _twin(monkeypatch, baseline: float, other: float, outside=()):
    """A stand-in twin: `baseline` for the baseline's 8 sequences, `other` for whatever the sampler proposes."""
    monkeypatch.setattr(prior, "predict", lambda plan, params, runs=None: (  # equal values: the same schedule
        Predicted(baseline, (0,), schedule=f"s{baseline}") if params["max-num-seqs"] == 8
        else Predicted(other, (0,), outside, schedule=f"s{other}")))


def _launch(study, plan):
    return launch(study, plan, None, Progress(Console(file=io.StringIO(), width=300)), None, 0)


def test_before_any_residual_the_validated_band_prunes_a_clear_loser_anchored_on_the_baseline(opened, monkeypatch):
    """The twin reproduces the baseline's run (100 predicted, 100 measured): its validated one-run band
    (throughput 16%) holds, and a configuration it puts at half the baseline is not booted; one at
    0.92x is. Anchored: a twin at 2x on the baseline's run halves what it says of the others."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    _twin(monkeypatch, 100.0, 50.0)
    state, failure = _launch(study, plan)
    assert state == PRUNED and failure.kind == "predicted_to_lose" and not booted
    band = BAND_ONE_RUN["output_throughput"]
    assert f"the twin puts it at 50 ({50 * (1 + band):.4g} at best, its band +-{band:.0%})" in failure.evidence
    assert of_trial.prior(study.trials[-1])["anchor_error"] == 0.0
    _twin(monkeypatch, 100.0, 92.0)
    assert isinstance(_launch(study, plan), Running) and len(booted) == 1
    assert prior.anchored(Predicted(120.0, (0,)), Predicted(200.0, (0,)), 100.0).value == 60.0


def test_a_twin_that_misses_the_baselines_own_run_prunes_nothing_before_its_residuals(opened, monkeypatch):
    """Predicted 2x the baseline's measured value: it is not trusted before its residuals say so, so
    even a configuration it puts at a fifth of the best boots (a lying twin only changes the order)."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    _twin(monkeypatch, 200.0, 40.0)
    assert isinstance(_launch(study, plan), Running) and booted


def test_one_the_twin_schedules_as_the_baseline_is_not_booted_and_screening_holds_it(opened, monkeypatch):
    """The same predicted value as the baseline's, exactly (a larger KV pool that never fills): told
    PRUNED as predicted_same, never ranked; outside the envelope (fp8 never calibrated) it boots."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    _twin(monkeypatch, 100.0, 100.0)
    state, failure = _launch(study, plan)
    assert state == PRUNED and failure.kind == "predicted_same" and not booted
    assert "the twin schedules it step for step as trial 0 (the baseline), measured at 100" in failure.evidence
    assert study.trials[-1].number not in [r.number for r in ranked_feasible(study, True)]
    assert savings(study)["predicted"] == 1
    _twin(monkeypatch, 100.0, 100.0, outside=("KV dtype fp8 never calibrated",))
    assert isinstance(_launch(study, plan), Running)


def test_a_batch_past_the_calibrations_is_never_predicted_to_lose_but_may_be_the_same(opened, monkeypatch):
    """Outside the envelope only for its batch (what such a step costs is extrapolated): a
    configuration the twin puts at half the baseline boots; one it schedules step for step as the
    baseline is still told predicted_same, priced alike whatever that price, and the console says so
    without "booted"."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    batch = ("a running batch of 32 is more than 1.25x the largest a calibration run held (8): what more sequences "
             "in a step cost is extrapolated",)
    _twin(monkeypatch, 100.0, 50.0, outside=batch)
    assert isinstance(_launch(study, plan), Running) and len(booted) == 1
    _twin(monkeypatch, 100.0, 100.0, outside=batch)
    out = io.StringIO()
    state, failure = launch(study, plan, None, Progress(Console(file=out, width=400)), None, 0)
    assert state == PRUNED and failure.kind == "predicted_same" and len(booted) == 1
    line = next(x for x in out.getvalue().splitlines() if "twin: trial" in x)
    assert line.endswith(f"outside its envelope ({batch[0]}))"), line


def test_before_three_residuals_the_band_is_never_narrower_than_an_error_already_seen(opened, monkeypatch):
    """The validated band is 16% for throughput; a first residual of 66% widens it (a configuration at
    0.7x of the best, prunable under 16%, now boots)."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    measured(study, 100.0, 166.0, 16)  # predicted 166, measured 100
    pred = prior.anchored(Predicted(70.0, (0,)), Predicted(100.0, (0,)), 100.0)
    assert prior.band(study, plan, pred) == pytest.approx(0.66)
    _twin(monkeypatch, 100.0, 70.0)
    assert isinstance(_launch(study, plan), Running)


def test_one_the_twin_schedules_as_a_measured_trial_is_not_booted(opened, monkeypatch):
    """64 sequences where 32 are ever in flight schedule exactly as 32: the twin's value is trial 1's
    own prediction, so it is told PRUNED as the same as trial 1, at trial 1's measured value."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    _twin(monkeypatch, 100.0, 130.0)
    first = _launch(study, plan)
    assert isinstance(first, Running)
    study.tell(first.trial, 140.0)
    state, failure = _launch(study, plan)
    assert state == PRUNED and failure.kind == "predicted_same" and len(booted) == 1
    assert f"as trial {first.trial.number}, measured at 140" in failure.evidence


def test_the_same_schedule_counts_only_where_nothing_but_the_schedulers_limits_differ(opened):
    """On a CPU 16 sequences scheduled as the baseline's 8 are the same configuration; on a GPU the
    sequence limit also sizes the CUDA graphs captured, so it is not; a KV dtype never is; a screening
    move is compared with the baseline only; and another schedule is never the same."""
    from dataclasses import replace

    study, plan, _ = opened
    _baseline(study, 100.0)
    same, base = Predicted(100.0, (0,), schedule="s"), Predicted(100.0, (0,), schedule="s")
    assert prior.same_schedule(study, plan, same, {"max-num-seqs": 16}, base, True).number == 0
    gpu = replace(plan, device=replace(plan.device, kind="cuda"))
    assert prior.same_schedule(study, gpu, same, {"max-num-seqs": 16}, base, True) is None
    assert prior.same_schedule(study, gpu, same, {"max-num-seqs": 8, "max-model-len": 4096}, base, True).number == 0
    assert prior.same_schedule(study, plan, same, {"max-num-seqs": 8, "kv-cache-dtype": "fp8"}, base, True) is None
    assert prior.same_schedule(study, plan, Predicted(100.0, (0,), schedule="t"), {"max-num-seqs": 16}, base,
                               True) is None
    asked = study.ask()  # a measured trial the twin predicted before it booted
    of_trial.write_prior(asked, Predicted(140.0, (0,), schedule="u").as_dict())
    study.tell(asked, 140.0)
    other = Predicted(140.0, (0,), schedule="u")
    assert prior.same_schedule(study, plan, other, {"max-num-seqs": 8}, base, True) is None  # screening: the baseline only
    assert prior.same_schedule(study, plan, other, {"max-num-seqs": 8}, base, False).number == asked.number


def test_without_a_band_nothing_is_the_same_either(opened, monkeypatch):
    """A twin that misses the baseline's own run (2x) is not trusted to say two configurations are alike."""
    study, plan, booted = opened
    _baseline(study, 100.0)
    _twin(monkeypatch, 200.0, 200.0)
    assert isinstance(_launch(study, plan), Running) and booted
