"""fleet/capacity.py and report/capacity.py: the best configuration's measured rate -> replicas and GPUs for a peak load."""

import io
import math

import optuna
import pytest
from rich.console import Console

from optimizer.cli import plan as plan_command
from optimizer.cli.entry import parser
from optimizer.driver import confirm
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.errors import ConfigError
from optimizer.measure.slo import parse_slos
from optimizer.verdict import confirmed
from optimizer.fleet.capacity import Measurement, measurement_from_study, plan
from optimizer.report.capacity import describe

GOODPUT = "goodput:goodput_rate slos p95 TTFT <= 500 ms"


def tokens(value=12000.0, per_request=2000.0, **kw) -> Measurement:
    return Measurement(kw.pop("trial", 3), "total_token_throughput", value, "tokens/s", per_request, **kw)


def covers(p) -> bool:
    """The plan carries the demand with its headroom, and one replica fewer would not."""
    m, usable = p.measurement, 1 - p.headroom
    need = max(p.peak_qps / (m.requests_per_s * usable), p.demand_tokens_per_s / (m.tokens_per_s * usable))
    return p.replicas >= need - 1e-9 and (p.replicas == 1 or p.replicas - 1 < need - 1e-9)


# --- the arithmetic ----------------------------------------------------------------------------


def test_the_issues_example_50_qps_of_2000_tokens():
    p = plan(tokens(12000.0), peak_qps=50, tokens_per_request=2000, headroom=0.3)
    assert p.demand_tokens_per_s == 100_000
    assert p.replicas_for_tokens == math.ceil(100_000 / 8400) == 12
    assert (p.replicas, p.gpus) == (12, 12)
    assert covers(p)
    tp2 = plan(tokens(12000.0, tensor_parallel_size=2, gpus_per_replica=2), 50, 2000, 0.3)
    assert (tp2.replicas, tp2.gpus) == (12, 24)


def test_more_headroom_means_more_replicas():
    counts = [plan(tokens(12000.0), 50, 2000, h).replicas for h in (0.0, 0.3, 0.5, 0.8)]
    assert counts == [9, 12, 17, 42] and counts == sorted(counts)


def test_an_exact_fit_is_not_rounded_up_by_float_error():
    # 3000 * (1 - 0.9) is 299.99999999999994 in floats: 3000 / that would ceil to 11
    p = plan(tokens(3000.0, per_request=1000.0), peak_qps=3, tokens_per_request=1000, headroom=0.9)
    assert p.replicas == 10


def test_a_small_demand_still_needs_one_replica():
    assert plan(tokens(12000.0), peak_qps=0.01, tokens_per_request=1500, headroom=0.3).replicas == 1


def test_a_request_rate_measurement_plans_both_ways():
    m = Measurement(5, "goodput_rate", 6.0, "req/s", 2000.0, slo_bounded=True, slos="p95 TTFT <= 500 ms")
    assert (m.requests_per_s, m.tokens_per_s) == (6.0, 12000.0)
    p = plan(m, peak_qps=50, tokens_per_request=2000, headroom=0.3)
    assert (p.replicas_for_requests, p.replicas_for_tokens, p.binding) == (12, 12, "both")
    assert covers(p)


def test_lighter_requests_bind_on_the_request_rate():
    # 500-token requests need only 3 replicas' worth of tokens/s, but a replica was seen to carry
    # 6 req/s, not 24: the request rate binds
    p = plan(tokens(12000.0), peak_qps=50, tokens_per_request=500, headroom=0.3)
    assert (p.replicas_for_requests, p.replicas_for_tokens) == (12, 3)
    assert (p.replicas, p.binding) == (12, "req/s") and covers(p)


def test_heavier_requests_bind_on_the_token_rate():
    p = plan(Measurement(5, "goodput_rate", 6.0, "req/s", 2000.0, slo_bounded=True), 50, 3000, 0.3)
    assert (p.replicas_for_requests, p.replicas_for_tokens) == (12, 18)
    assert (p.replicas, p.binding) == (18, "tokens/s") and covers(p)


# --- warnings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("planned, extrapolates", [(2000, False), (4000, False), (1000, False),
                                                   (4001, True), (999, True), (200, True)])
def test_planning_far_from_the_measured_request_size_is_warned(planned, extrapolates):
    p = plan(tokens(12000.0, slo_bounded=True, slos="p95 TTFT <= 500 ms"), 50, planned, 0.3)
    warned = [w for w in p.warnings if "extrapolates" in w]
    assert bool(warned) == extrapolates
    if warned:
        assert "measured on 2,000 tokens/request" in warned[0]


def test_a_measurement_without_slos_promises_no_latency():
    p = plan(tokens(12000.0), 50, 2000, 0.3)
    assert p.warnings == ("throughput at saturation, not under SLOs: latency at this load is not promised "
                          "(give the study SLOs, or check them here with --slo)",)
    assert plan(tokens(12000.0, slo_bounded=True, slos="p95 TTFT <= 500 ms"), 50, 2000, 0.3).warnings == ()


def test_a_trial_that_missed_its_slos_is_warned_as_such():
    p = plan(tokens(12000.0, trial=4, slos="p95 TTFT <= 500 ms"), 50, 2000, 0.3)
    assert p.warnings == ("trial 4 missed its SLOs (p95 TTFT <= 500 ms): latency at this load is not promised",)


def test_a_cpu_measurement_is_warned_for_a_gpu_plan():
    p = plan(tokens(12000.0, slo_bounded=True, device="cpu"), 50, 2000, 0.3)
    assert any("measured on CPU" in w for w in p.warnings)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("peak, per_request, headroom, flag", [
    (0, 2000, 0.3, "--peak-qps"), (-5, 2000, 0.3, "--peak-qps"), (math.nan, 2000, 0.3, "--peak-qps"),
    (math.inf, 2000, 0.3, "--peak-qps"), (50, 0, 0.3, "--tokens-per-request"),
    (50, -1, 0.3, "--tokens-per-request"), (50, 2000, -0.1, "--headroom"), (50, 2000, 1.0, "--headroom"),
    (50, 2000, 1.5, "--headroom"), (50, 2000, math.nan, "--headroom"),
])
def test_bad_inputs_name_the_flag_in_one_line(peak, per_request, headroom, flag):
    with pytest.raises(ConfigError) as exc:
        plan(tokens(), peak, per_request, headroom)
    assert str(exc.value).startswith(flag) and "\n" not in str(exc.value)


# --- describe ------------------------------------------------------------------------------------


def test_describe_names_the_trial_metric_replicas_gpus_headroom_and_warnings():
    m = Measurement(7, "goodput_rate", 6.0, "req/s", 2000.0, tensor_parallel_size=2, gpus_per_replica=2, runs=3)
    lines = describe(plan(m, 50, 2000, 0.3))
    text = "\n".join(lines)
    assert lines[0] == "Demand at peak: 50 req/s x 2,000 tokens/request = 100,000 tokens/s"
    assert "trial 7, goodput_rate = 6 req/s (the mean of 3 re-measured runs; not under SLOs)" in text
    assert "12,000 tokens/s at the measured 2,000 tokens/request" in text
    assert "Headroom 30%: each replica planned at 4.2 req/s, 8,400 tokens/s" in text
    assert "Replicas: 12 (" in text and "GPUs: 24 (12 replica(s) x 2 GPU(s); tensor-parallel-size 2)" in text
    assert lines[-1].startswith("warning: throughput at saturation")
    assert "one run" in "\n".join(describe(plan(tokens(), 50, 2000, 0.3)))


# --- from a study --------------------------------------------------------------------------------


def metrics(total=12000.0, requests=6.0, **extra) -> dict:
    return {"total_token_throughput": total, "request_throughput": requests, "output_throughput": total / 4,
            "ttft_ms_p50": 90.0, "ttft_ms_p95": 300.0, "ttft_ms_p99": 650.0, "tpot_ms_p50": 20.0,
            "tpot_ms_p95": 40.0, "error_rate": 0.0, **extra}


def add(study, value, m, args=("--max-num-seqs", "32"), baseline=False, state=None, constraints=None, values=None):
    attrs = {"metrics": m, "vllm_args": list(args)} | ({"baseline": True} if baseline else {})
    study.add_trial(optuna.trial.create_trial(
        state=state or optuna.trial.TrialState.COMPLETE, value=None if values or state else value, values=values,
        user_attrs=attrs, constraints=constraints))


def throughput_study(objective="throughput:output_throughput"):
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("objective", objective)
    study.set_user_attr("device", "gpu")
    add(study, 2000.0, metrics(8000.0, 4.0), baseline=True)
    add(study, 3000.0, metrics(12000.0, 6.0), args=("--max-num-seqs", "64", "--tensor-parallel-size", "2"))
    add(study, 2500.0, metrics(10000.0, 5.0))
    return study


def test_a_throughput_study_plans_on_the_best_trials_total_tokens():
    m = measurement_from_study(throughput_study())
    assert (m.trial, m.metric, m.value, m.unit) == (1, "total_token_throughput", 12000.0, "tokens/s")
    assert m.tokens_per_request == 2000.0  # 12000 tokens/s over 6 req/s
    assert (m.tensor_parallel_size, m.gpus_per_replica) == (2, 2)
    assert (m.slo_bounded, m.remeasured, m.device) == (False, False, "gpu")
    p = plan(m, 50, 2000, 0.3)
    assert (p.replicas, p.gpus) == (12, 24)


def test_parallel_sizes_come_from_short_flags_and_multiply():
    study = optuna.create_study(direction="maximize")
    add(study, 1.0, metrics(), args=("-tp", "2", "--pipeline_parallel_size", "2", "--max-num-seqs", "8"))
    m = measurement_from_study(study)
    assert (m.tensor_parallel_size, m.gpus_per_replica) == (2, 4)


def test_a_goodput_study_plans_on_the_slo_bounded_request_rate():
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("objective", GOODPUT)
    add(study, 3.0, metrics(7000.0, 3.5, goodput_rate=3.0, capacity_rps=9.0, goodput_rps=2.8), baseline=True)
    add(study, 5.0, metrics(10000.0, 5.0, goodput_rate=5.0, capacity_rps=11.0, goodput_rps=4.7,
                            goodput_output_throughput=2500.0))
    m = measurement_from_study(study)
    assert (m.trial, m.metric, m.value, m.unit) == (1, "goodput_rate", 5.0, "req/s")
    assert (m.slo_bounded, m.slos, m.tokens_per_request) == (True, "p95 TTFT <= 500 ms", 2000.0)
    p = plan(m, 50, 2000, 0.3)
    assert p.replicas == math.ceil(50 / (5.0 * 0.7)) == 15 and p.warnings == ()


def test_a_goodput_trial_that_held_the_slos_at_no_rate_is_refused():
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("objective", GOODPUT)
    add(study, 0.0, metrics(goodput_rate=0.0, capacity_rps=9.0))
    with pytest.raises(ConfigError, match="held the SLOs .* at no request rate"):
        measurement_from_study(study)


def test_a_replay_run_that_met_its_slo_constraints_is_slo_bounded():
    study = throughput_study("throughput:output_throughput slos p95 TTFT <= 500 ms")
    add(study, 5000.0, metrics(20000.0, 10.0), constraints={"ttft_p95": 0.4})  # best value, SLOs missed
    add(study, 3500.0, metrics(14000.0, 7.0), constraints={"ttft_p95": -0.2})
    m = measurement_from_study(study)
    assert (m.trial, m.slo_bounded, m.slos) == (4, True, "p95 TTFT <= 500 ms")
    missed = measurement_from_study(study, trial_number=3)
    assert (missed.trial, missed.slo_bounded) == (3, False)
    assert "trial 3 missed its SLOs" in plan(missed, 50, 2000).warnings[0]


def test_a_confirmed_winner_is_planned_on_its_re_measured_mean():
    study = throughput_study()
    reruns = {1: [2400.0, 2400.0], 2: [2700.0, 2800.0], 0: [2000.0, 2000.0]}  # trial 1 was a lucky run
    confirm.remeasure(study, top=3, repeats=2, measure=lambda t, k: reruns[t.number][k - 1])
    assert study.best_trial.number == 1 and confirmed.current_winner(study) == 2
    m = measurement_from_study(study)
    assert (m.trial, m.runs, m.remeasured) == (2, 3, True)
    # trial 2's output_throughput is the geometric mean of 2500, 2700, 2800; its total tokens/s scale with it
    assert m.value == pytest.approx(10000.0 * (2500.0 * 2700.0 * 2800.0) ** (1 / 3) / 2500.0)
    assert m.tokens_per_request == 2000.0


def test_a_latency_studys_confirmation_does_not_scale_the_rate():
    study = optuna.create_study(direction="minimize")
    study.set_user_attr("objective", "latency:ttft_p95")
    add(study, 300.0, metrics(12000.0, 6.0))
    add(study, 250.0, metrics(9000.0, 4.5))
    confirm.remeasure(study, top=2, repeats=1, measure=lambda t, k: t.value * 2)
    m = measurement_from_study(study)
    assert (m.trial, m.value, m.runs, m.other_runs) == (1, 9000.0, 1, 2)
    text = "\n".join(describe(plan(m, 50, 2000, 0.3)))
    # re-measured, but for latency: the plan says so instead of "one run"
    assert "(its search run; its 2 re-measured runs measured ttft_p95, not the rate;" in text
    assert "one run" not in text


def test_an_explicit_trial_is_planned_on():
    m = measurement_from_study(throughput_study(), trial_number=2)
    assert (m.trial, m.value, m.tensor_parallel_size) == (2, 10000.0, 1)


def test_a_pareto_study_needs_a_front_member_named():
    study = optuna.create_study(directions=["minimize", "maximize"])
    study.set_user_attr("objective", "pareto:ttft_p95,output_throughput")
    add(study, None, metrics(), values=[300.0, 3000.0])
    add(study, None, metrics(16000.0, 8.0), values=[500.0, 4000.0])
    with pytest.raises(ConfigError, match="--trial N"):
        measurement_from_study(study)
    assert measurement_from_study(study, trial_number=1).value == 16000.0


@pytest.mark.parametrize("number, message", [(9, "has trials 0 to 3"), (3, "it is PRUNED")])
def test_an_explicit_trial_must_exist_and_be_complete(number, message):
    study = throughput_study()
    add(study, None, metrics(), state=optuna.trial.TrialState.PRUNED)
    with pytest.raises(ConfigError, match=message):
        measurement_from_study(study, trial_number=number)


def test_a_trial_without_the_rates_is_refused_in_one_line():
    study = optuna.create_study(direction="maximize")
    add(study, 3000.0, {"output_throughput": 3000.0})
    with pytest.raises(ConfigError) as exc:
        measurement_from_study(study)
    assert "recorded no total_token_throughput and request_throughput" in str(exc.value)
    assert "--trial N" in str(exc.value) and "\n" not in str(exc.value)


def test_a_study_without_a_usable_trial_is_refused():
    study = optuna.create_study(direction="maximize")
    add(study, None, metrics(), state=optuna.trial.TrialState.PRUNED)
    with pytest.raises(ConfigError, match="no completed trial"):
        measurement_from_study(study)
    add(study, 3000.0, metrics(), constraints={"ttft_p95": 0.5})
    with pytest.raises(ConfigError, match="no trial met the SLOs"):
        measurement_from_study(study)


def test_asked_slos_that_the_run_met_bound_the_plan():
    m = measurement_from_study(throughput_study(), slos=parse_slos("ttft:500 tpot:50"))
    assert (m.slo_bounded, m.slos) == (True, "p95 TTFT <= 500 ms, p95 TPOT <= 50 ms")
    assert plan(m, 50, 2000).warnings == ()


@pytest.mark.parametrize("asked, message", [
    ("ttft_p99:500", r"--slo p99 TTFT <= 500 ms: trial 1 measured 650 ms"),
    ("tpot_p99:50", r"--slo p99 TPOT <= 50 ms: trial 1 recorded no tpot_p99; "
                    r"use a percentile it recorded \(p50, p95\)"),
])
def test_asked_slos_the_run_missed_or_did_not_record_are_refused(asked, message):
    with pytest.raises(ConfigError, match=message):
        measurement_from_study(throughput_study(), slos=parse_slos(asked))


# --- the command ---------------------------------------------------------------------------------


def run_plan(argv):
    out = io.StringIO()
    code = plan_command.main(parser().parse_args(["plan", *argv]), Console(file=out, width=300))
    return code, out.getvalue().splitlines()


def test_the_command_plans_from_a_stored_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.set_user_attr(RECORD_KEY, RECORD_VERSION)  # as the tool stamps its studies
    study.set_user_attr("objective", GOODPUT)
    add(study, 5.0, metrics(10000.0, 5.0, goodput_rate=5.0))
    config = tmp_path / "study.yaml"
    config.write_text(f"study_name: s\nstorage: {url}\nmodel: {{path: /models/any}}\n")
    code, lines = run_plan(["--config", str(config), "--peak-qps", "50", "--tokens-per-request", "2000"])
    assert code == 0
    assert lines[3].startswith("Replicas: 15 ") and lines[4].startswith("GPUs: 15 ")
    assert "trial 0, goodput_rate = 5 req/s" in lines[1] and not any(x.startswith("warning") for x in lines)
    _, flags = run_plan(["--storage", url, "--study-name", "s", "--model", "/models/any", "--peak-qps", "50",
                         "--tokens-per-request", "2000", "--headroom", "0.5"])
    assert flags[3].startswith("Replicas: 20 ")


def test_the_command_never_creates_a_missing_study(tmp_path):
    db = tmp_path / "trials.db"
    argv = ["--storage", f"sqlite:///{db}", "--study-name", "nope", "--model", "m", "--peak-qps", "50",
            "--tokens-per-request", "2000"]
    with pytest.raises(ConfigError, match=r"no study database at .*: run `python -m optimizer run` first"):
        run_plan(argv)
    assert not db.exists()
    optuna.create_study(study_name="other", storage=f"sqlite:///{db}")
    with pytest.raises(ConfigError, match="no study 'nope'"):
        run_plan(argv)
    assert optuna.study.get_all_study_names(f"sqlite:///{db}") == ["other"]


def test_the_command_checks_its_flags_before_opening_the_study(tmp_path):
    db = tmp_path / "trials.db"
    with pytest.raises(ConfigError, match="^--headroom"):
        run_plan(["--storage", f"sqlite:///{db}", "--peak-qps", "50", "--tokens-per-request", "2000",
                  "--headroom", "1"])
    assert not db.exists()


def test_plan_lists_each_measured_topology_on_its_best_trial_fewest_devices_first():
    from optimizer.fleet.capacity import topology_plans
    from optimizer.report.capacity import describe_topologies

    study = optuna.create_study(direction="minimize")
    study.set_user_attr("objective", "fleet:fleet_devices peak 20 req/s, headroom 20% slos p95 TTFT <= 500 ms")
    dist = optuna.distributions.CategoricalDistribution([1, 2])

    def add(tp, dp, rate, ttft):
        metrics = {"goodput_rate": rate, "request_throughput": rate, "total_token_throughput": rate * 200,
                   "ttft_ms_p95": ttft}
        study.add_trial(optuna.trial.create_trial(
            params={"tensor-parallel-size": tp, "data-parallel-size": dp}, value=1.0,
            distributions={"tensor-parallel-size": dist, "data-parallel-size": dist},
            user_attrs={"metrics": metrics, "vllm_args": ["--tensor-parallel-size", str(tp),
                                                          "--data-parallel-size", str(dp)]}))

    add(1, 1, 10.0, 250.0)
    add(1, 1, 12.0, 400.0)  # the same topology, more per replica: the one planned on
    add(2, 1, 11.0, 300.0)
    add(1, 2, 30.0, 100.0)
    rows = topology_plans(study, (), 20, 200, 0.2, parse_slos("ttft:500"))
    assert [(label, p.measurement.trial, p.replicas, p.gpus, room) for label, p, room in rows] == [
        ("DP 2", 3, 1, 2, "TTFT p95 80% under its limit"),  # 30 x 0.8 = 24 a replica: one carries 20 req/s
        ("1 engine", 1, 3, 3, "TTFT p95 20% under its limit"),  # 12 x 0.8 = 9.6: 3 replicas (trial 0 needs 3 too)
        ("TP 2", 2, 3, 6, "TTFT p95 40% under its limit")]
    lines = describe_topologies(rows)
    assert lines[0].startswith("Measured topologies (fewest devices first; replicas scale 1.0 unless measured")
    assert lines[1] == ("  DP 2: trial 3, 30 req/s a replica on 2 device(s); 1 replica(s), 2 device(s); "
                        "TTFT p95 80% under its limit")


def test_a_measured_scaling_below_one_asks_for_more_replicas_and_says_where_it_came_from():
    from optimizer.fleet.scaling import scaling_of

    m = Measurement(5, "goodput_rate", 6.0, "req/s", 2000.0, slo_bounded=True)
    assumed = plan(m, 30, 2000, 0.3)  # 30 / (6 x 0.7) = 7.1 -> 8
    measured = plan(m, 30, 2000, 0.3, scaling_of([6.0, 6.2], [9.0, 9.4], 2, trial=5))  # 0.75x: 30 / 3.15 -> 10
    assert (assumed.replicas, measured.replicas) == (8, 10)
    assert describe(assumed)[-1].startswith("Scaling: assumed 1.0 (replicas never measured together")
    assert describe(measured)[-1].startswith("Scaling: 2 replicas of trial 5 behind nginx carried 0.75x (95% CI")
    assert describe(measured)[2].endswith("; in a fleet x 0.75 (the scaling measured): 3.17 req/s, 6,334 tokens/s")
    above = plan(m, 30, 2000, 0.3, scaling_of([6.0, 6.2], [14.0, 14.4], 2, trial=5))  # 1.16x: never above 1.0
    assert above.replicas == assumed.replicas
    one = plan(m, 3, 2000, 0.3, scaling_of([6.0, 6.2], [9.0, 9.4], 2, trial=5))  # one replica: no fleet to scale
    assert one.replicas == 1
