"""report/diagnosis.py: recorded evidence -> a cause and a remedy in operator words, one rule per test.

Trials are told through outcome.tell on an in-memory study, so their user attributes are the
ones a real run records: failures come from the real vLLM logs in tests/fixtures/vllm_logs/
through engine/failures.py, server views from the real /metrics scrapes in
tests/fixtures/vllm_metrics/ through engine/server_metrics.py (counters and gauges set per test),
metrics from request records through metrics.summarize.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from objectives import get_objective
from optimizer.config.model_info import load_model_info
from optimizer.driver import kv_precheck as precheck
from optimizer.driver import tell as outcome
from optimizer.engine.device import GIB, read_node_memory
from optimizer.engine.failures import Failure, classify_runtime, classify_startup
from optimizer.engine.server_metrics import COUNTERS, GAUGES, Peaks, deltas, parse
from optimizer.measure import validity
from optimizer.measure.metrics import summarize
from optimizer.measure.replay import ReplayResult, RequestRecord
from optimizer.measure.slo import parse_slos
from optimizer.report.diagnosis import (
    KINDS,
    Context,
    Diagnosis,
    context_of,
    diagnose,
    diagnose_study,
)
from optimizer.trial.spec import TrialResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOGS, PROM = FIXTURES / "vllm_logs", FIXTURES / "vllm_metrics"
THROUGHPUT = get_objective("throughput")
ARGS = ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.3", "--max-model-len", "4096",
        "--load-format", "dummy", "--dtype", "bfloat16"]
UNDER_LOAD = {"startup_s": 40.0, "warmup_s": 2.0, "replay_s": 8.0}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_for(direction="maximize", objective="throughput:output_throughput", **attrs) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    study.set_user_attr("objective", objective)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def run(study, result: TrialResult, args=ARGS, objective=THROUGHPUT, params=None, **attrs) -> optuna.trial.FrozenTrial:
    """Ask (with `params` as the sampled knobs), record the flags like driver/study.py, tell like the
    driver; the frozen trial as stored."""
    trial = study.ask()
    for name, value in (params or {}).items():
        trial.suggest_categorical(name, [value])
    trial.set_user_attr("vllm_args", list(args))
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    outcome.tell(study, trial, result, objective)
    return study.trials[trial.number]


def measured(every_s=0.25, n=16, ttft_ms=100.0, tpot_ms=20.0, tokens=32, failed=0) -> tuple:
    """Request records of a closed replay and their summary metrics."""
    recs = []
    for i in range(n):
        sent = i * every_s
        first = sent + ttft_ms / 1000
        chunks = tuple(first + k * tpot_ms / 1000 for k in range(tokens))
        ok = i >= failed
        recs.append(RequestRecord(str(i), sent, sent, first if ok else None, chunks[-1] if ok else None,
                                  chunks if ok else (), 100, tokens if ok else 0, tokens, ok, 200 if ok else 400,
                                  "" if ok else "prompt longer than max-model-len"))
    done = [r for r in recs if r.ok]
    return tuple(recs), summarize(ReplayResult(tuple(recs), done[-1].end_s - recs[0].sent_s))


def view(peaks=None, **counters) -> dict:
    """The server's view between the real before/after scrapes: `counters` (our names) set in the
    after scrape, `peaks` (gauge values) in one scrape taken during the window."""
    before, after = (PROM / "before.prom").read_text(), (PROM / "after.prom").read_text()
    p = Peaks()
    if peaks:
        p.add(parse(_set(after, {GAUGES[k]: v for k, v in peaks.items()})))
    return deltas(parse(before), parse(_set(after, {COUNTERS[k]: v for k, v in counters.items()})), p)


def _set(text: str, values: dict) -> str:
    for name, value in values.items():
        text, n = re.subn(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
        assert n == 1, name
    return text


def completed(study, every_s=0.25, server=None, args=ARGS, objective=THROUGHPUT, ttft_ms=100.0, params=None,
              **attrs):
    records, metrics = measured(every_s, ttft_ms=ttft_ms)
    result = TrialResult(len(study.trials), None, metrics, dict(UNDER_LOAD), records, server=server or {})
    return run(study, result, args, objective, params, **attrs)


def failed(study, failure: Failure, phases=None, server=None, args=ARGS, **attrs):
    result = TrialResult(len(study.trials), failure, {}, dict(phases or {"startup_s": 30.0}), server=server or {})
    return run(study, result, args, **attrs)


def startup(name: str, returncode=1, timed_out=False) -> Failure:
    return classify_startup((LOGS / name).read_text(), returncode, timed_out)


def diag(study, trial) -> Diagnosis | None:
    return diagnose(trial, context_of(study))


# -- start-up failures from the real logs ---------------------------------------------------


def test_oom_at_start_names_the_free_memory_and_the_fraction_that_fits():
    study = study_for()
    t = failed(study, startup("util_too_high.log"), args=["--gpu-memory-utilization", "0.99"])
    assert t.state == optuna.trial.TrialState.PRUNED and t.user_attrs["failure_kind"] == "oom_startup"
    d = diag(study, t)
    assert d.kind == "oom_at_start" and d.trial == t.number
    assert d.cause == "gpu-memory-utilization 0.99 asks for 10.61 GiB but only 9.37 of 10.71 GiB is free"
    assert d.remedy.startswith("lower gpu-memory-utilization to at most 0.87")  # 9.37 / 10.71 = 0.875
    assert "on startup is less than desired CPU memory utilization (0.99" in d.evidence


def test_too_low_a_fraction_leaves_no_kv_room_and_says_raise_it_above_the_weights_share():
    study = study_for()
    t = failed(study, startup("util_too_low.log"), args=["--gpu-memory-utilization", "0.0467"])
    d = diag(study, t)
    assert d.kind == "no_kv_room"
    # 0.5 GiB reserved, -0.47 GiB left for KV: the weights and runtime take 0.97 of 10.71 GiB (0.0906)
    assert d.cause == ("gpu-memory-utilization 0.0467 reserves 0.50 GiB, the weights and runtime take 0.97 GiB, "
                       "leaving -0.47 GiB for the KV cache")
    assert d.remedy.startswith("raise gpu-memory-utilization above 0.10 ")
    assert "requested memory for kv (-0.47/0.5 GiB)" in d.evidence


def test_a_precheck_prediction_of_no_kv_room_is_diagnosed_from_its_estimate(tiny_model):
    plan = SimpleNamespace(model=load_model_info(str(tiny_model), "bfloat16"),
                           cfg=SimpleNamespace(engine=SimpleNamespace(device="cpu")))
    study = study_for()
    args = ["--gpu-memory-utilization", "0.001", "--max-model-len", "4096"]
    est = precheck.predict(study, plan, args)
    t = failed(study, precheck.predicted_result(0, est).failure, phases={}, args=args, precheck="pruned",
               kv_estimate=est.to_dict())
    d = diag(study, t)
    assert d.kind == "no_kv_room" and d.cause.startswith("predicted before boot: gpu-memory-utilization 0.001 ")
    non_kv_share = est.non_kv_bytes / (read_node_memory().total)
    need = float(re.search(r"above ([\d.]+)", d.remedy).group(1))
    assert need == pytest.approx(non_kv_share, abs=0.011) and need > 0.001


@pytest.mark.parametrize("line, kind, remedy", [
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
     "no_kv_room", "raise gpu-memory-utilization (now 0.3)"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
     "oom_at_start", "lower gpu-memory-utilization (or max-num-seqs): the engine ran out of memory while starting"),
])
def test_quoted_start_up_memory_lines_without_numbers(line, kind, remedy):
    study = study_for()
    d = diag(study, failed(study, classify_startup(f"INFO loading\n{line}\n", 1, False)))
    assert (d.kind, d.remedy, d.evidence) == (kind, remedy, line)
    assert "gpu-memory-utilization 0.3" in d.cause


def test_kv_too_small_offers_vllms_estimate_more_memory_and_fp8():
    study = study_for()
    args = ["--gpu-memory-utilization", "0.1167", "--max-model-len", "65536"]
    d = diag(study, failed(study, startup("kv_too_small.log"), args=args))
    assert d.kind == "kv_too_small"
    assert d.cause == "max-model-len 65536 needs 1.0 GiB of KV cache for one request; only 0.27 GiB is available"
    assert d.remedy == ("lower max-model-len to at most 17920, or raise gpu-memory-utilization (now 0.1167), "
                        "or use kv-cache-dtype fp8 (half the KV bytes per token)")
    # already on fp8: that option is not offered again
    d = diag(study, failed(study, startup("kv_too_small.log"), args=args + ["--kv-cache-dtype", "fp8"]))
    assert d.kind == "kv_too_small" and "fp8" not in d.remedy and "17920" in d.remedy


def test_kv_too_small_on_a_cpu_without_fp8_kv_does_not_offer_fp8():
    study = study_for()
    study.set_user_attr("fp8_kv", False)  # driver/plan.py stamps it from the device
    args = ["--gpu-memory-utilization", "0.1167", "--max-model-len", "65536"]
    d = diag(study, failed(study, startup("kv_too_small.log"), args=args))
    assert d.remedy == "lower max-model-len to at most 17920, or raise gpu-memory-utilization (now 0.1167)"


def test_the_drivers_remedy_for_kv_too_small_leaves_fp8_out_where_it_cannot_start():
    from optimizer.engine.failures import without_fp8_remedy

    failure = startup("kv_too_small.log")
    assert failure.remedy.endswith(", or use kv-cache-dtype fp8")  # the log alone does not say which CPU
    assert without_fp8_remedy(failure, fp8_kv=True) is failure
    rewritten = without_fp8_remedy(failure, fp8_kv=False)
    assert rewritten.remedy == "lower max-model-len to at most 17920, or raise gpu-memory-utilization"
    assert (rewritten.kind, rewritten.evidence) == (failure.kind, failure.evidence)
    other = Failure("crash", "boom", "read the server log")
    assert without_fp8_remedy(other, fp8_kv=False) is other and without_fp8_remedy(None, False) is None


def test_a_predicted_kv_too_small_names_the_tokens(tiny_model):
    plan = SimpleNamespace(model=load_model_info(str(tiny_model), "bfloat16"),
                           cfg=SimpleNamespace(engine=SimpleNamespace(device="cpu")))
    study = study_for()
    args = ["--gpu-memory-utilization", str(round(1.2 * GIB / read_node_memory().total, 4)), "--max-model-len", "65536"]
    est = precheck.predict(study, plan, args)
    t = failed(study, precheck.predicted_result(0, est).failure, phases={}, args=args, precheck="pruned",
               kv_estimate=est.to_dict())
    d = diag(study, t)
    assert d.kind == "kv_too_small"
    assert d.cause == (f"predicted before boot: max-model-len 65536 needs {est.needed_tokens:,} KV tokens, "
                       f"the cache would hold {est.capacity_tokens:,}")
    assert f"lower max-model-len to at most {est.predicted_max_model_len}" in d.remedy
    assert precheck.predicted_result(0, est).failure.remedy.endswith("or use kv-cache-dtype fp8")
    assert "fp8" not in precheck.predicted_result(0, est, fp8_kv=False).failure.remedy


@pytest.mark.parametrize("log, kind, cause", [
    ("invalid_combo.log", "invalid_config",
     "vLLM rejected the flags: max_num_batched_tokens (512) is smaller than max_model_len (4096)."),
    ("invalid_combo_seqs.log", "invalid_config",
     "vLLM rejected the flags: max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (64)."),
    ("missing_model.log", "invalid_config",
     "vLLM rejected the flags: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
     "'/tmp/does-not-exist'."),
])
def test_rejected_flags_give_vllms_message_and_the_recorded_remedy(log, kind, cause):
    study = study_for()
    failure = startup(log)
    d = diag(study, failed(study, failure))
    assert (d.kind, d.cause, d.remedy, d.evidence) == (kind, cause, failure.remedy, failure.evidence)


def test_timeout_and_crash_at_start_read_the_last_line():
    study = study_for()
    timeout = startup("bad_kv_dtype.log", returncode=None, timed_out=True)
    d = diag(study, failed(study, timeout))
    assert d.kind == "timeout" and d.cause.startswith("no /health within the start-up deadline; last line: ")
    assert "startup_timeout_s" in d.remedy
    crash = classify_startup("INFO starting\nRuntimeError: engine loop died\n", 1, False)
    d = diag(study, failed(study, crash))
    assert (d.kind, d.cause) == ("crash", "the server exited at start: engine loop died")


# -- failures under load ---------------------------------------------------------------------


def test_oom_under_load_says_lower_max_num_seqs_or_max_model_len():
    study = study_for()
    log = (LOGS / "bad_kv_dtype.log").read_text() + \
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB\n"
    failure = classify_runtime(log, 1)
    assert failure.kind == "oom_runtime"
    d = diag(study, failed(study, failure, phases=UNDER_LOAD))
    assert d.kind == "oom_under_load"
    assert d.cause == "the server ran out of memory under load (max-num-seqs 16, max-model-len 4096)"
    assert d.remedy == "lower max-num-seqs (now 16) or max-model-len (now 4096)"
    assert "CUDA out of memory" in d.evidence
    killed = classify_runtime((LOGS / "bad_kv_dtype.log").read_text(), -9)  # the OOM killer leaves no line
    assert diag(study, failed(study, killed, phases=UNDER_LOAD)).kind == "oom_under_load"


def test_a_crash_under_load_at_the_cap_or_with_the_kv_cache_full_is_memory_otherwise_a_crash():
    study = study_for()
    crash = classify_runtime((LOGS / "bad_kv_dtype.log").read_text(), 1)
    assert crash.kind == "crash"
    full = view({"running": 16, "kv_cache_usage": 0.97, "waiting": 3})
    d = diag(study, failed(study, crash, phases=UNDER_LOAD, server=full))
    assert d.kind == "oom_under_load"
    assert d.cause == "the server died under load with 16 requests running of max-num-seqs 16 and the KV cache 97% full"
    assert "running_peak=16 kv_cache_usage_peak=0.97" in d.evidence
    calm = view({"running": 2, "kv_cache_usage": 0.1})
    d = diag(study, failed(study, crash, phases=UNDER_LOAD, server=calm))
    assert d.kind == "crash" and d.cause.startswith("the server died under load: ")
    assert d.remedy == crash.remedy


def test_request_errors_infra_and_replay_invalid_keep_their_evidence_and_remedy():
    study = study_for()
    records, metrics = measured(failed=3)
    t = run(study, TrialResult(0, None, metrics, dict(UNDER_LOAD), records))
    d = diag(study, t)
    assert d.kind == "request_errors"
    assert d.cause == "requests failed, so the run was not scored: 3 of 16 requests failed; first: HTTP 400 " \
                      "prompt longer than max-model-len"
    assert d.remedy == t.user_attrs["remedy"]

    busy = classify_startup("OSError: [Errno 98] error while attempting to bind on address "
                            "('127.0.0.1', 8013): Address already in use\n", 1, False)
    t = failed(study, busy)
    assert t.state == optuna.trial.TrialState.FAIL
    d = diag(study, t)
    assert d.kind == "infra" and d.cause.startswith("not the configuration's fault: ")
    assert "Address already in use" in d.cause and d.remedy == busy.remedy

    lag = validity.check(None, (), {"schedule_lag_p50_ms": 240.0}, {}, 50.0, 0.9)
    d = diag(study, failed(study, lag, phases=UNDER_LOAD))
    assert (d.kind, d.cause) == ("replay_invalid", "the measurement cannot be trusted: median schedule lag "
                                                   "240.0 ms > 50 ms")
    assert d.remedy == validity.REMEDY


def test_early_stopped_is_not_a_fault():
    study = study_for()
    early = {"by": "trial", "reason": "even if the rest finished now, output_throughput would be at most 30.1, "
             "below the best so far (80.00 tok/s)", "finished": 12, "planned": 48, "saved_s": 20.0}
    records, metrics = measured()
    t = run(study, TrialResult(0, None, metrics, dict(UNDER_LOAD), records, early_stop=early))
    assert t.user_attrs["failure_kind"] == "early_stopped"
    d = diag(study, t)
    assert d.kind == "early_stopped"
    assert d.cause.startswith("not a fault: cut short after 12 of 48 requests, cannot win: even if the rest")
    assert d.remedy.startswith("nothing to fix")


def test_an_unknown_failure_kind_is_reported_with_what_it_recorded():
    study = study_for()
    d = diag(study, failed(study, Failure("gpu_fell_off_the_bus", "Xid 79", "reseat the card")))
    assert (d.kind, d.cause, d.remedy) == ("other_failure", "gpu_fell_off_the_bus: Xid 79", "reseat the card")


# -- measured trials: the server's view --------------------------------------------------------


def test_preemptions_mean_kv_pressure():
    study = study_for()
    t = completed(study, server=view({"running": 16, "kv_cache_usage": 0.99, "waiting": 0}, preemptions=37))
    assert t.user_attrs["server"]["preemptions"] == 37
    d = diag(study, t)
    assert d.kind == "preemptions"
    assert d.cause == "vLLM preempted 37 requests: the KV cache (peak 99% used) ran out of room for the running batch"
    assert d.remedy == ("raise gpu-memory-utilization (now 0.3) for a larger KV cache, or lower max-num-seqs (now 16)")
    assert d.evidence.startswith("server: preemptions=37 kv_cache_usage_peak=0.99 running_peak=16")


def test_queuing_at_the_cap_while_behind_the_best_says_raise_max_num_seqs():
    study = study_for()
    completed(study, every_s=0.25, args=["--max-num-seqs", "64"])  # the best
    queued = view({"running": 16, "waiting": 14, "kv_cache_usage": 0.41},
                  queue_time_sum_s=9.2, queue_time_count=40)
    t = completed(study, every_s=0.5, server=queued)
    d = diag(study, t)
    assert d.kind == "queuing"
    assert d.cause.startswith("waiting requests peaked at 14 while running stayed at max-num-seqs 16; "
                              "output_throughput 62.3 is 46% below the best 115")
    assert d.remedy.startswith("raise max-num-seqs above 16 (the KV cache peaked at 41%: there is room)")
    assert "queue_time_mean_ms=230" in d.evidence
    # the same queue on the study's best trial is not a weakness
    alone = study_for()
    assert diag(alone, completed(alone, every_s=0.5, server=queued)) is None


def test_queue_time_alone_counts_as_queuing_and_a_full_kv_cache_says_raise_memory_with_it():
    study = study_for()
    completed(study, every_s=0.25)
    waited = view({"running": 15, "waiting": 0, "kv_cache_usage": 0.95}, queue_time_sum_s=4.0, queue_time_count=40)
    d = diag(study, completed(study, every_s=0.5, server=waited))
    assert d.kind == "queuing"
    assert d.cause.startswith("requests waited 100 ms on average while running peaked at 15 of max-num-seqs 16")
    assert "together with gpu-memory-utilization (the KV cache peaked at 95%)" in d.remedy


def test_slo_missed_names_the_slo_the_excess_and_the_knob():
    slos = get_objective("throughput", None, parse_slos("ttft:500 tpot:50"))
    study = study_for(objective="throughput:output_throughput slos p95 TTFT <= 500 ms")
    t = completed(study, objective=slos, ttft_ms=810.0)
    assert t.user_attrs["feasible"] is False
    d = diag(study, t)
    assert d.kind == "slo_missed"
    assert d.cause == "p95 TTFT 810 ms is 62% over its 500 ms limit"
    assert d.remedy == ("raise max-num-batched-tokens so more prompt is prefilled per step, or lower "
                        "max-num-seqs (now 16) so fewer decodes share it")
    assert d.evidence.startswith("slo_excess {'ttft_p95': 0.62")
    # two missed: the worst leads, the other is named
    both = get_objective("throughput", None, parse_slos("ttft:500 tpot:15"))
    d = diag(study, completed(study, objective=both, ttft_ms=810.0))
    assert d.cause == "p95 TTFT 810 ms is 62% over its 500 ms limit (p95 TPOT missed too)"
    # a run cut because its SLO was lost: COMPLETE, infeasible, its value from the partial run
    records, metrics = measured(ttft_ms=810.0)
    early = {"by": "slo", "reason": "p95 TTFT <= 500 ms lost beyond repair", "finished": 12, "planned": 48}
    t = run(study, TrialResult(9, None, metrics, dict(UNDER_LOAD), records, early_stop=early), objective=slos)
    assert t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["value_from_partial_run"]
    d = diag(study, t)
    assert d.kind == "slo_missed" and d.cause.endswith("; the run was cut once it could not recover")
    assert d.evidence.endswith("early stop: p95 TTFT <= 500 ms lost beyond repair")


def test_a_missed_error_slo_counts_the_failed_requests():
    errors = get_objective("throughput", None, parse_slos("error:1"))
    study = study_for()
    records, metrics = measured(failed=3)
    t = run(study, TrialResult(0, None, metrics, dict(UNDER_LOAD), records), objective=errors)
    assert t.state == optuna.trial.TrialState.COMPLETE and "failure_kind" not in t.user_attrs
    d = diag(study, t)
    assert d.kind == "slo_missed"
    assert d.cause == "18.8% of requests failed; the error SLO allows 1%"
    assert d.remedy == "read the request errors: a 400 usually means a prompt longer than max-model-len (now 4096)"


def test_a_missed_tpot_slo_says_lower_max_num_seqs():
    slos = get_objective("throughput", None, parse_slos("tpot_p50:10"))
    study = study_for()
    d = diag(study, completed(study, objective=slos))
    assert d.kind == "slo_missed" and d.cause == "p50 TPOT 20 ms is 100% over its 10 ms limit"
    assert d.remedy.startswith("lower max-num-seqs (now 16): fewer requests share each decode step")


def test_light_load_says_the_test_was_too_light():
    study = study_for()
    light = view({"running": 2, "waiting": 0, "kv_cache_usage": 0.03}, queue_time_sum_s=0.0001, queue_time_count=16)
    d = diag(study, completed(study, server=light, args=["--max-num-seqs", "64"]))
    assert d.kind == "light_load"
    assert d.cause == ("at most 2 of max-num-seqs 64 requests ran at once, the KV cache peaked at 3% and nothing "
                       "queued: the load never pushed the server")
    assert "raise the workload's request rate or concurrency" in d.remedy
    # a goodput search chose its own rate: its light load is what the SLOs allowed
    searched = completed(study, server=light, args=["--max-num-seqs", "64"],
                         rate_search=[{"rate": 2.0, "passed": True}])
    assert diag(study, searched) is None


def test_output_changed_from_a_regression_check_over_the_studys_limit():
    study = study_for(max_flip_rate=0.05)
    fp8 = ARGS + ["--kv-cache-dtype", "fp8"]  # --dtype bfloat16 is a fixed flag: the reference has it too
    t = completed(study, args=fp8, params={"kv-cache-dtype": "fp8", "max-num-seqs": 16},
                  regression={"flip_rate": 0.18, "prompts": 50})
    d = diag(study, t)
    assert d.kind == "output_changed"
    assert d.cause == "18% of answers changed (limit 5.0%): kv-cache-dtype fp8 changed the outputs"
    assert d.remedy == ("go back to the reference kv-cache-dtype or accept the change knowingly; check the answers "
                        "with `python -m optimizer regress`")
    assert "'flip_rate': 0.18" in d.evidence
    # under the study's limit: healthy
    assert diag(study, completed(study, args=fp8, params={"kv-cache-dtype": "fp8"},
                                 regression={"flip_rate": 0.04})) is None
    # no limit recorded: the default (2%) applies; no precision knob sampled: said so
    plain = study_for()
    d = diag(plain, completed(plain, regression={"flip_rate": 0.03}))
    assert d.kind == "output_changed"
    assert d.cause == "3.0% of answers changed (limit 2.0%) with no precision, attention-backend or speculation knob changed"


def test_output_changed_as_a_failure_kind():
    study = study_for()
    failure = Failure("output_changed", "12 of 50 answers differ from the reference", "run regress")
    d = diag(study, failed(study, failure, phases=UNDER_LOAD))
    assert d.kind == "output_changed"
    assert d.cause == ("the answers changed (12 of 50 answers differ from the reference) with no precision, "
                       "attention-backend or speculation knob changed")
    assert "python -m optimizer regress" in d.remedy
    assert d.evidence == "12 of 50 answers differ from the reference"


def test_behind_the_best_without_a_server_side_cause():
    study = study_for()
    completed(study, every_s=0.25)
    d = diag(study, completed(study, every_s=0.5))
    assert d.kind == "behind_best"
    assert d.cause == "output_throughput 62.3 is 46% below the best 115, with no preemption, queue or SLO miss " \
                      "to explain it"
    assert d.remedy == ("nothing failed: these flags (max-num-seqs 16, gpu-memory-utilization 0.3, max-model-len "
                        "4096) are slower on this workload; compare them with the best trial's")


def test_a_latency_study_judges_weakness_the_other_way():
    latency = get_objective("latency", "ttft_p95")
    study = study_for("minimize", "latency:ttft_p95")
    completed(study, objective=latency, ttft_ms=100.0)
    d = diag(study, completed(study, objective=latency, ttft_ms=300.0))
    assert d.kind == "behind_best" and d.cause.startswith("ttft_p95 300 is 200% above the best 100")
    assert diag(study, completed(study, objective=latency, ttft_ms=110.0)) is None


# -- ordering, healthy trials, the whole study ---------------------------------------------


def test_first_matching_rule_wins():
    study = study_for(max_flip_rate=0.05)
    completed(study, every_s=0.25)
    both = view({"running": 16, "waiting": 9, "kv_cache_usage": 0.99}, preemptions=5)
    # preemptions and queuing while behind the best: the KV cache is the cause, not the cap
    assert diag(study, completed(study, every_s=0.5, server=both)).kind == "preemptions"
    # ... and wrong answers outrank both
    t = completed(study, every_s=0.5, server=both, regression={"flip_rate": 0.3})
    assert diag(study, t).kind == "output_changed"
    # queuing and a TTFT miss: the queue is part of TTFT, the cap the knob
    slos = get_objective("throughput", None, parse_slos("ttft:50"))
    queued = view({"running": 16, "waiting": 9, "kv_cache_usage": 0.4})
    t = completed(study, every_s=0.5, server=queued, objective=slos)
    assert t.user_attrs["feasible"] is False and diag(study, t).kind == "queuing"
    # no_kv_room before oom_at_start: same failure kind, opposite remedies
    t = failed(study, startup("util_too_low.log"))
    assert t.user_attrs["failure_kind"] == "oom_startup" and diag(study, t).kind == "no_kv_room"


def test_healthy_trials_get_none():
    study = study_for()
    busy = view({"running": 14, "waiting": 0, "kv_cache_usage": 0.6}, queue_time_sum_s=0.04, queue_time_count=16)
    best = completed(study, every_s=0.25, server=busy)
    close = completed(study, every_s=0.27, server=busy)  # 7% behind: within the noise
    no_view = completed(study, every_s=0.27)
    assert [diag(study, t) for t in (best, close, no_view)] == [None, None, None]
    waiting = study.ask()  # not finished: nothing to say yet
    assert diagnose(study.trials[waiting.number], context_of(study)) is None


def test_context_of_reads_the_best_feasible_value_the_metric_and_the_flip_limit():
    slos = get_objective("throughput", None, parse_slos("ttft:500"))
    study = study_for(objective="throughput:output_throughput slos p95 TTFT <= 500 ms", max_flip_rate=0.05)
    completed(study, every_s=0.2, objective=slos, ttft_ms=900.0)  # fastest, but misses the SLO
    ok = completed(study, every_s=0.25, objective=slos)
    ctx = context_of(study)
    assert ctx == Context(ok.value, "maximize", "output_throughput", 0.05)
    assert ctx.shortfall(ok.value) == 0 and ctx.shortfall(ok.value / 2) == pytest.approx(0.5)
    assert context_of(study_for()).best is None
    pareto = optuna.create_study(directions=["maximize", "minimize"])
    assert context_of(pareto) == Context(None, "maximize", "value", None)


def test_diagnose_study_lists_failed_and_weak_trials_in_order():
    study = study_for()
    completed(study, every_s=0.25)  # 0: the best, healthy
    failed(study, startup("kv_too_small.log"))  # 1
    completed(study, every_s=0.5)  # 2: weak
    completed(study, every_s=0.26)  # 3: healthy
    failed(study, startup("util_too_high.log"))  # 4
    found = diagnose_study(study)
    assert [(d.trial, d.kind) for d in found] == [(1, "kv_too_small"), (2, "behind_best"), (4, "oom_at_start")]
    assert all(d.kind in KINDS and d.cause and d.remedy and d.evidence for d in found)
    assert all("\n" not in d.cause + d.remedy for d in found)


def _speculating_view(running: float) -> dict:
    """The real scrapes of a SmolLM2 server with n-gram speculation (tests/fixtures/vllm_metrics/spec_*.prom)."""
    before, after = (PROM / "spec_before.prom").read_text(), (PROM / "spec_after.prom").read_text()
    p = Peaks()
    p.add(parse(_set(after, {GAUGES["running"]: running})))
    return deltas(parse(before), parse(after), p)


def test_speculation_behind_the_best_names_its_acceptance_and_the_batch():
    study = study_for()
    completed(study, every_s=0.25)
    server = _speculating_view(running=12)
    d = diag(study, completed(study, every_s=0.5, server=server))
    assert d.kind == "speculation"
    assert d.cause == (f"speculative decoding accepted {server['spec_acceptance']:.0%} of its drafted tokens "
                       f"({server['spec_mean_accepted_length']:.2f} tokens per step) at up to 12 running sequences; "
                       "output_throughput 62.3 is 46% below the best 115: verifying the drafts cost more than they saved")
    assert d.remedy.startswith("turn speculation off for this traffic, or draft fewer tokens")
    assert "spec_acceptance=" in d.evidence and "running_peak=12" in d.evidence


def test_speculation_that_lowered_the_prefix_cache_hits_says_from_what_to_what():
    study = study_for()
    off = deltas(parse((PROM / "before.prom").read_text()), parse((PROM / "after.prom").read_text()))
    completed(study, every_s=0.25, server={**off, "prefix_cache_hit_rate": 0.73})  # no speculation
    completed(study, every_s=0.26, server={**off, "prefix_cache_hit_rate": 0.71})
    server = {**_speculating_view(running=12), "prefix_cache_hit_rate": 0.40}
    d = diag(study, completed(study, every_s=0.5, server=server))
    assert d.kind == "speculation"
    # the median of the trials without speculation (0.71 and 0.73: the upper one), then this trial's
    assert d.cause.endswith("verifying the drafts cost more than they saved; the prefix-cache hit rate fell "
                            "from 73% without speculation to 40%")
    assert "prefix_cache_hit_rate=0.4" in d.evidence


def test_a_prefix_cache_hit_rate_within_5_points_of_no_speculation_is_not_called_a_fall():
    study = study_for()
    off = deltas(parse((PROM / "before.prom").read_text()), parse((PROM / "after.prom").read_text()))
    completed(study, every_s=0.25, server={**off, "prefix_cache_hit_rate": 0.44})
    d = diag(study, completed(study, every_s=0.5, server={**_speculating_view(running=12), "prefix_cache_hit_rate": 0.40}))
    assert d.kind == "speculation" and "prefix-cache" not in d.cause


def test_speculation_that_wins_is_not_diagnosed():
    study = study_for()
    completed(study, every_s=0.5)
    assert diag(study, completed(study, every_s=0.25, server=_speculating_view(running=14))) is None
