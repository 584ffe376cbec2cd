"""driver/launch.py: a trial that proposes exactly the flags of a finished trial is told that
trial's outcome and noted `repeat_of`, never booted; a failed trial, the baseline and a new
configuration still boot; a repeat is never ranked beside its source."""

import io

import optuna
import pytest
from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.driver.launch import Running, launch
from optimizer.search.repeats import repeated_trial
from optimizer.driver.plan import open_study, prepare
from optimizer.driver.progress import Progress
from optimizer.verdict.trials import ranked_feasible

COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED


@pytest.fixture
def opened(tmp_path, tiny_model, booted):
    cfg = build_config({
        "study_name": "rep", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "precheck": False,
        "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
        "space": {"max-num-seqs": {"low": 4, "high": 8}}, "baseline": {"max-num-seqs": 4},
        "objective": {"name": "throughput", "slos": "tpot:50"},
        "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16], "long_input": [32, 64],
                     "output": [4, 8]},
    })
    study, plan = open_study(prepare(cfg))
    return study, plan, booted


def _launch(study, plan, params: dict):
    study.enqueue_trial(params)
    out = io.StringIO()
    got = launch(study, plan, None, Progress(Console(file=out, width=200)), None, 0)
    return got, out.getvalue()


def _finish(study, running: Running, value: float | None, tpot_excess: float = -1.0) -> None:
    t = running.trial
    t.set_user_attr("metrics", {"output_throughput": value})
    t.set_constraint("tpot_ms_p95", tpot_excess)
    if value is None:
        study.tell(t, state=PRUNED)
    else:
        study.tell(t, value)


def test_an_exact_repeat_is_told_the_finished_trials_outcome_without_a_boot(opened):
    study, plan, booted = opened
    first, _ = _launch(study, plan, {"max-num-seqs": 8})
    assert isinstance(first, Running) and booted == [{"max-num-seqs": 8}]
    _finish(study, first, 123.0, tpot_excess=-2.5)
    told, text = _launch(study, plan, {"max-num-seqs": 8})
    assert told == (COMPLETE, None) and booted == [{"max-num-seqs": 8}]  # no second boot
    repeat = study.get_trials()[-1]
    assert repeat.state == COMPLETE and repeat.value == 123.0 and repeat.user_attrs["repeat_of"] == first.trial.number
    assert repeat.constraints == {"tpot_ms_p95": -2.5} and repeat.user_attrs["metrics"] == {"output_throughput": 123.0}
    assert "phases_s" not in repeat.user_attrs and "startup" not in repeat.user_attrs  # it did not boot
    assert f"the same flags as trial {first.trial.number}" in text
    assert [t.number for t in ranked_feasible(study)] == [first.trial.number]  # ranked once
    assert repeated_trial(study, repeat.user_attrs["vllm_args"], 99).number == first.trial.number  # never a repeat's


def test_a_repeat_of_a_pruned_trial_is_pruned_and_other_flags_boot(opened):
    study, plan, booted = opened
    first, _ = _launch(study, plan, {"max-num-seqs": 5})
    _finish(study, first, None)
    assert _launch(study, plan, {"max-num-seqs": 5})[0] == (PRUNED, None)
    other, _ = _launch(study, plan, {"max-num-seqs": 6})
    assert isinstance(other, Running) and booted == [{"max-num-seqs": 5}, {"max-num-seqs": 6}]


def test_a_failed_trial_and_the_baseline_are_booted_again(opened):
    study, plan, booted = opened
    first, _ = _launch(study, plan, {"max-num-seqs": 7})
    study.tell(first.trial, state=optuna.trial.TrialState.FAIL)  # infra: retried, not a measurement
    assert isinstance(_launch(study, plan, {"max-num-seqs": 7})[0], Running)
    four, _ = _launch(study, plan, {"max-num-seqs": 4})  # the baseline's flags, measured by a sampled trial
    _finish(study, four, 50.0)
    study.enqueue_trial({"max-num-seqs": 4}, user_attrs={"baseline": True})
    baseline = launch(study, plan, None, Progress(Console(file=io.StringIO())), None, 0)
    assert isinstance(baseline, Running) and len(booted) == 4


def test_the_reports_name_a_repeat_and_count_it_as_saved(opened, tmp_path):
    from optimizer.report.console import print_report
    from optimizer.report.summary import savings_text
    from optimizer.verdict.trials import savings

    study, plan, _ = opened
    first, _ = _launch(study, plan, {"max-num-seqs": 8})
    _finish(study, first, 123.0)
    _launch(study, plan, {"max-num-seqs": 8})
    assert savings(study)["repeats"] == 1 and "1 repeat(s) of a measured configuration" in savings_text(savings(study))
    out = io.StringIO()
    print_report(study, plan.model.source, tmp_path / "art", plan.objective, Console(file=out, width=250))
    assert f"repeat of {first.trial.number}" in out.getvalue()


def test_repeats_are_not_counted_in_n_trials_and_a_run_of_them_ends_the_search(opened):
    from optimizer.driver.study import _Trials
    from optimizer.search.convergence import CONVERGED_AFTER, repeat_streak, search_over
    from optimizer.verdict.trials import finished_count

    study, plan, booted = opened  # max-num-seqs 4..8 on the ladder: two configurations in all
    for seqs in (4, 8):
        running, _ = _launch(study, plan, {"max-num-seqs": seqs})
        _finish(study, running, float(seqs))
    _launch(study, plan, {"max-num-seqs": 8})
    assert finished_count(study) == 2 and repeat_streak(study) == 1 and not search_over(study, plan.cfg.n_trials)
    out = io.StringIO()
    trials = _Trials(study, plan, None, Progress(Console(file=out, width=200)), None, 1)
    trials.launch_while_room()  # every draw is a repeat: it stops at CONVERGED_AFTER in a row, not at n_trials
    assert trials.running == [] and len(booted) == 2 and finished_count(study) == 2 < plan.cfg.n_trials
    assert repeat_streak(study) == CONVERGED_AFTER and search_over(study, plan.cfg.n_trials)
    assert len(study.trials) == 2 + CONVERGED_AFTER and "not counted in n_trials" in out.getvalue()
    fresh, _ = _launch(study, plan, {"max-num-seqs": 6})  # a new configuration boots and ends the streak
    _finish(study, fresh, 6.0)
    assert repeat_streak(study) == 0 and finished_count(study) == 3


def test_raising_n_trials_after_the_search_converged_lets_it_go_on(opened):
    from dataclasses import replace

    from optimizer.driver.study import _Trials
    from optimizer.search.convergence import CONVERGED_AFTER, repeat_streak, search_over

    study, plan, booted = opened
    for seqs in (4, 8):
        running, _ = _launch(study, plan, {"max-num-seqs": seqs})
        _finish(study, running, float(seqs))
    _Trials(study, plan, None, Progress(Console(file=io.StringIO())), None, 1).launch_while_room()
    assert search_over(study, plan.cfg.n_trials)  # converged under its budget: a resume stops here
    raised = replace(plan, cfg=plan.cfg.model_copy(update={"n_trials": plan.cfg.n_trials + 4}))
    assert repeat_streak(study, raised.cfg.n_trials) == 0 and not search_over(study, raised.cfg.n_trials)
    before = len(study.trials)
    _Trials(study, raised, None, Progress(Console(file=io.StringIO())), None, 1).launch_while_room()
    assert len(study.trials) == before + CONVERGED_AFTER and len(booted) == 2  # a new streak, all repeats here
    assert search_over(study, raised.cfg.n_trials) and repeat_streak(study) == 2 * CONVERGED_AFTER


def test_a_repeat_stored_without_its_budget_does_not_hold_a_raised_search(opened):
    from optimizer.search.convergence import CONVERGED_AFTER, repeat_streak

    study, plan, _ = opened
    running, _ = _launch(study, plan, {"max-num-seqs": 4})
    _finish(study, running, 4.0)
    for _ in range(CONVERGED_AFTER):  # as a study before repeats kept their budget stored them
        t = study.ask()
        t.set_user_attr("repeat_of", running.trial.number)
        study.tell(t, 4.0)
    assert repeat_streak(study) == CONVERGED_AFTER and repeat_streak(study, plan.cfg.n_trials) == 0


def test_every_open_stamps_whether_the_drivers_cpu_runs_fp8_kv(opened):
    from dataclasses import replace

    study, plan, _ = opened
    assert study.user_attrs["fp8_kv"] is plan.device.fp8_kv
    moved = replace(plan, device=replace(plan.device, fp8_kv=not plan.device.fp8_kv))  # resumed on another CPU
    reopened, _ = open_study(moved)
    assert reopened.user_attrs["fp8_kv"] is (not plan.device.fp8_kv)
