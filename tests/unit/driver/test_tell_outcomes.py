"""outcome.tell for issue 4's outcomes: SLO constraints (COMPLETE, infeasible), early stops
(PRUNED, not a failure of the configuration), Pareto (two values), and TPE learning from
constraints (Optuna 5 reads trial.set_constraint without a constraints_func)."""

import optuna
import pytest

from objectives import get_objective
from optimizer.driver import tell as outcome
from optimizer.measure.slo import parse_slos
from optimizer.report.summary import summarize_study
from optimizer.trial.spec import TrialResult

FAST = {"ttft_ms_p95": 120.0, "tpot_ms_p95": 30.0, "output_throughput": 900.0, "error_rate": 0.0}
SLOW_TPOT = {"ttft_ms_p95": 80.0, "tpot_ms_p95": 75.0, "output_throughput": 1200.0, "error_rate": 0.0}


def tell(study, metrics, objective, **extra):
    trial = study.ask()
    trial.set_user_attr("vllm_args", ["--max-num-seqs", str(trial.number)])
    return outcome.tell(study, trial, TrialResult(trial.number, None, metrics, **extra), objective)


def test_missing_an_slo_is_complete_with_its_violation_and_never_the_best(tmp_path):
    obj = get_objective("latency", "ttft_p95", parse_slos("tpot:50"))
    study = optuna.create_study(direction="minimize")
    state, _ = tell(study, FAST, obj)
    assert state == optuna.trial.TrialState.COMPLETE
    state, _ = tell(study, SLOW_TPOT, obj)  # faster TTFT, but TPOT 75 > 50
    assert state == optuna.trial.TrialState.COMPLETE
    t0, t1 = study.trials
    assert t0.constraints == {"tpot_p95": pytest.approx(-0.4)} and t0.user_attrs["feasible"] is True
    assert t1.constraints == {"tpot_p95": pytest.approx(0.5)} and t1.user_attrs["feasible"] is False
    assert study.best_trial.number == 0  # the infeasible one has the lower TTFT but does not count
    assert summarize_study(study, "/m", tmp_path).best.number == 0


def test_only_infeasible_trials_means_no_best_and_says_so(tmp_path):
    obj = get_objective("latency", "ttft_p95", parse_slos("tpot:50"))
    study = optuna.create_study(direction="minimize")
    tell(study, SLOW_TPOT, obj)
    s = summarize_study(study, "/m", tmp_path)
    assert s.best is None and s.infeasible_only


def test_goodput_slos_are_its_definition_not_constraints():
    obj = get_objective("goodput", slos=parse_slos("ttft:500"))
    study = optuna.create_study(direction="maximize")
    state, _ = tell(study, {**FAST, "goodput_rate": 3.0}, obj)
    assert state == optuna.trial.TrialState.COMPLETE and study.trials[0].constraints == {}
    assert study.trials[0].value == 3.0


def test_early_stop_is_pruned_with_its_reason():
    obj = get_objective("latency")
    study = optuna.create_study(direction="minimize")
    early = {"by": "driver", "reason": "5 of 24 planned requests already took longer", "finished": 6,
             "planned": 24, "saved_s": 12.5}
    state, judged = tell(study, FAST, obj, early_stop=early)
    assert state == optuna.trial.TrialState.PRUNED
    t = study.trials[0]
    assert t.user_attrs["failure_kind"] == "early_stopped" and t.user_attrs["early_stop"] == early
    assert judged.failure.evidence.startswith("cannot win")


def test_pareto_tells_two_values_and_reports_the_front(tmp_path):
    obj = get_objective("pareto")
    study = optuna.create_study(directions=list(obj.directions))
    trade_off = {**FAST, "output_throughput": 1200.0, "ttft_ms_p95": 200.0}  # more tokens/s, slower first token
    dominated = {**FAST, "output_throughput": 800.0, "ttft_ms_p95": 130.0}  # worse than FAST on both
    for m in (FAST, trade_off, dominated):
        assert tell(study, m, obj)[0] == optuna.trial.TrialState.COMPLETE
    assert study.trials[0].values == [900.0, 120.0]
    s = summarize_study(study, "/m", tmp_path)
    assert sorted(t.number for t in s.front) == [0, 1] and s.best is None
    assert s.yaml_path.name == "pareto_front.yaml" and "max-num-seqs: 1" in s.yaml_path.read_text()


def _late_feasible_share(slos) -> float:
    obj = get_objective("throughput", slos=slos)
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=8))
    late = []
    for i in range(40):
        trial = study.ask()
        x = trial.suggest_float("x", 0, 1)
        # throughput grows with x, but TTFT breaks a 100 ms SLO above x = 0.3
        metrics = {**FAST, "output_throughput": 1000 * x, "ttft_ms_p95": 50 + 200 * x}
        outcome.tell(study, trial, TrialResult(trial.number, None, metrics), obj)
        if i >= 20:
            late.append(x)
    return sum(x <= 0.3 for x in late) / len(late)


def test_tpe_learns_the_feasible_region_from_constraints():
    """Optuna 5's TPE reads the constraints outcome.tell sets (no constraints_func): with the SLO
    it keeps proposing feasible points; without, it chases throughput into the infeasible region."""
    with_slo, without = _late_feasible_share(parse_slos("ttft:100")), _late_feasible_share(())
    assert with_slo >= 0.5 and without <= 0.2, (with_slo, without)


def test_a_run_cut_because_its_slo_was_lost_is_complete_and_infeasible():
    obj = get_objective("latency", "ttft_p95", parse_slos("ttft:400 tpot:50"))
    study = optuna.create_study(direction="minimize")
    tell(study, FAST, obj)
    partial = {**FAST, "ttft_ms_p95": 380.0}  # the partial p95 is not over yet, but the SLO is lost
    early = {"by": "slo", "reason": "5 of 64 planned requests already missed p95 TTFT <= 400 ms", "finished": 20,
             "planned": 64, "saved_s": 30.0}
    state, _ = tell(study, partial, obj, early_stop=early)
    assert state == optuna.trial.TrialState.COMPLETE
    t = study.trials[1]
    assert t.constraints["ttft_p95"] > 0 and t.constraints["tpot_p95"] < 0
    assert t.user_attrs["value_from_partial_run"] is True and t.user_attrs["feasible"] is False
    assert study.best_trial.number == 0


def test_failed_requests_are_judged_by_an_error_slo_when_there_is_one():
    from optimizer.measure.replay import RequestRecord

    ok = RequestRecord("a", 0, 0, 0.1, 0.5, (0.1, 0.5), 10, 2, 2, True, 200)
    bad = RequestRecord("b", 0, 0, None, None, (), 10, 0, 2, False, 500, "boom")
    records = (ok,) * 49 + (bad,)
    metrics = {**FAST, "requests": 50.0, "completed": 49.0, "error_rate": 0.02}
    for slos, state in (("ttft:500", optuna.trial.TrialState.PRUNED),  # no error SLO: unscored
                        ("ttft:500 error:5", optuna.trial.TrialState.COMPLETE)):  # 2% <= 5%: scored
        study = optuna.create_study(direction="minimize")
        got, _ = tell(study, metrics, get_objective("latency", slos=parse_slos(slos)), records=records)
        assert got == state, slos
