"""daemon/forecast.py: on new traffic, the twin calibrated on the last generation's runs forecasts
whether production's configuration holds the SLOs, orders the warm starts, and is checked against
the trial that booted that configuration.

Generation 1's runs are written the way the driver writes them, from runs of the twin itself with
known step costs (a stand-in for real runs, as in tests/unit/twin/test_simulate_command.py); the
"truth" of generation 2 is the same stand-in on generation 2's traffic. The real daemon forecasts in
tests/integration/test_daemon_live_traffic.py."""

import io
import json
from dataclasses import asdict

import optuna
import pytest
from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.daemon import forecast as fc
from optimizer.daemon.status_api import StatusState
from optimizer.driver.plan import prepare
from optimizer.driver.store.database import open_storage
from optimizer.record import of_generation
from optimizer.twin.prediction import predict
from optimizer.twin.server import TwinServer
from optimizer.twin.step_cost import LinearStepCost

TRUTH = LinearStepCost((0.006, 0.00003, 0.00002, 0.0011, 0.0002, 0.0001, 0.00003, 0.00002, 0.0002, 0.00005), 0.004)
LOG = "INFO [kv_cache_utils.py:1] CPU KV cache size: 261,888 tokens\n"
BASELINE = {"max-num-seqs": 8, "gpu-memory-utilization": 0.3, "max-model-len": 2048, "kv-cache-dtype": "auto"}
QUIET = {"requests": 32, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 256], "output": [16, 64],
         "arrival": {"process": "poisson", "rate": 8}}
BUSY = {**QUIET, "requests": 48, "short_input": [512, 1024], "arrival": {"process": "poisson", "rate": 30}}
# busier, inside the calibration's envelope (at most 2x its rate, a median prompt at most 8x longer)
BUSIER = {**QUIET, "requests": 48, "short_input": [256, 512], "arrival": {"process": "poisson", "rate": 15}}


def _plan(tmp_path, tiny_model, name: str, workload: dict, slos: str | None = None):
    return prepare(build_config({
        "study_name": name, "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": str(tmp_path / "artifacts"),
        "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"}, "baseline": BASELINE,
        "space": {"max-num-seqs": {"low": 2, "high": 32}}, "workload": workload,
        "objective": {"name": "latency", "metric": "ttft_p95", **({"slos": slos} if slos else {})}}))


def _truth(plan, params: dict):
    server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, LOG)
    return server.run(plan.workload.requests, plan.workload.concurrency, TRUTH)


@pytest.fixture
def generation_1(tmp_path, tiny_model):
    """Generation 1's plan with two stored runs (the baseline at 8 sequences and one at 4) on the quiet traffic."""
    plan = _plan(tmp_path, tiny_model, "live", QUIET)
    for n, seqs in ((0, 8), (1, 4)):
        params = {**BASELINE, "max-num-seqs": seqs}
        sim = _truth(plan, params)
        d = plan.artifacts / f"trial-{n}"
        d.mkdir(parents=True)
        (d / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in sim.result.records))
        (d / "server.log").write_text(LOG)
        (d / "result.json").write_text(json.dumps({"trial": n, "params": params, "failure": None, "early_stop": {},
                                                   "rate_search": []}))
    return plan


def test_the_forecast_on_busier_traffic_is_the_truths_and_judges_each_slo(generation_1, tmp_path, tiny_model):
    probe = _plan(tmp_path, tiny_model, "live-g2", BUSIER)
    true_p95 = predict(_truth(probe, BASELINE)).metrics["ttft_ms_p95"]
    # one SLO the truth meets by 2x, one it misses by 2x: a forecast that only echoed the quiet
    # traffic's latencies (a naive one) would call both held
    plan = _plan(tmp_path, tiny_model, "live-g2", BUSIER, f"ttft:{2 * true_p95:.0f} e2el_p50:1")
    f = fc.forecast(generation_1, plan, "the baseline", BASELINE)
    # within 15% (calibrated on one quiet run, prompts twice as long; the one-run band is 36%): the
    # quiet traffic's own p95, what a naive forecast would echo, is several times lower
    assert f.metrics["ttft_ms_p95"][0] == pytest.approx(true_p95, rel=0.15)
    assert predict(_truth(_plan(tmp_path, tiny_model, "live-q", QUIET), BASELINE)).metrics["ttft_ms_p95"] < true_p95 / 2
    low, high = f.metrics["ttft_ms_p95"][1:]
    assert 0 < low < f.metrics["ttft_ms_p95"][0] < high
    assert f.calibrated_on == "study 'live', trial(s) 0"
    ttft, e2el = f.slos
    assert ttft["holds"] and ttft["sure"] and not e2el["holds"] and e2el["sure"]
    assert f.verdict == "breaks" and f.sure
    assert f.describe().startswith("breaks: p50 E2EL <= 1 ms, predicted ")
    quiet = fc.forecast(generation_1, _plan(tmp_path, tiny_model, "live-g2", QUIET, "ttft:60000"), "the baseline",
                        BASELINE)
    assert quiet.verdict == "holds" and quiet.sure
    assert quiet.metrics["ttft_ms_p95"][0] < f.metrics["ttft_ms_p95"][0] / 2  # the busy traffic queues


def test_a_limit_inside_the_band_is_a_verdict_that_is_not_sure(generation_1, tmp_path, tiny_model):
    probe = _plan(tmp_path, tiny_model, "live-g2", BUSIER)
    predicted = fc.forecast(generation_1, probe, "the baseline", BASELINE).metrics["ttft_ms_p95"][0]
    f = fc.forecast(generation_1, _plan(tmp_path, tiny_model, "live-g2", BUSIER, f"ttft:{1.05 * predicted:.0f}"),
                    "the baseline", BASELINE)
    assert f.verdict == "holds" and not f.sure and "the band reaches past the limit" in f.describe()


def test_without_slos_the_forecast_holds_the_latencies_alone(generation_1, tmp_path, tiny_model):
    f = fc.forecast(generation_1, _plan(tmp_path, tiny_model, "live-g2", BUSY), "the baseline", BASELINE)
    assert f.verdict == "no SLOs" and not f.sure and f.slos == []
    assert "(no SLOs to judge)" in f.describe()
    json.dumps(f.as_dict(), allow_nan=False)  # /status and the study's record are plain JSON


def test_production_runs_what_was_published_else_the_baseline():
    published = {"flags": ["--max-num-seqs", "16", "--kv-cache-dtype", "fp8"]}
    assert fc.current_params(published, BASELINE) == ("the published recommendation",
                                                      {"max-num-seqs": 16, "kv-cache-dtype": "fp8"})
    assert fc.current_params(None, BASELINE) == ("the baseline", BASELINE)


def test_warm_starts_boot_in_the_order_the_twin_predicts_on_the_new_traffic(generation_1, tmp_path, tiny_model):
    plan = _plan(tmp_path, tiny_model, "live-g2", BUSY)
    warm = [{"max-num-seqs": 2}, {"max-num-seqs": 32}, {"max-num-seqs": 8}]
    true_p95 = {p["max-num-seqs"]: predict(_truth(plan, {**BASELINE, **p})).metrics["ttft_ms_p95"] for p in warm}
    got = fc.ordered(generation_1, plan, warm)
    assert [p["max-num-seqs"] for p in got] == sorted(true_p95, key=true_p95.get)  # lowest p95 TTFT first
    assert got[-1] == {"max-num-seqs": 2}


def test_with_nothing_to_calibrate_on_the_order_is_kept_and_no_forecast_is_said(tmp_path, tiny_model):
    empty = _plan(tmp_path, tiny_model, "empty", QUIET)
    plan = _plan(tmp_path, tiny_model, "empty-g2", BUSY)
    warm = [{"max-num-seqs": 2}, {"max-num-seqs": 32}]
    assert fc.ordered(empty, plan, warm) == warm
    state, out = StatusState(), io.StringIO()
    assert fc.Forecaster(state, Console(file=out, width=300)).before(empty, plan, 2) is None
    assert "generation 2: no forecast (simulate: no complete trial with request records" in out.getvalue()
    assert state.snapshot()["forecast"]["generation"] == 2


def _trial(study, seqs: int, metrics: dict, baseline: bool = False, partial: bool = False) -> None:
    attrs = {"vllm_args": ["--max-num-seqs", str(seqs), "--max-model-len", "2048"], "metrics": metrics}
    if baseline:
        attrs["baseline"] = True
    if partial:
        attrs["value_from_partial_run"] = True
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=metrics["ttft_ms_p95"], params={"max-num-seqs": seqs},
        distributions={"max-num-seqs": optuna.distributions.IntDistribution(2, 32)}, user_attrs=attrs))


def test_the_forecast_is_checked_against_the_trial_that_booted_its_configuration(generation_1, tmp_path, tiny_model):
    """Generation 2 ran the published configuration (16 sequences) after others; the forecast is
    compared with that trial, not the first, and not a run stopped early; stored and said."""
    plan = _plan(tmp_path, tiny_model, "live-g2", BUSY, "ttft:100000")
    state, out = StatusState(), io.StringIO()
    state.set(recommendation={"flags": ["--max-num-seqs", "16"]})
    forecaster = fc.Forecaster(state, Console(file=out, width=300))
    record = forecaster.before(generation_1, plan, 2)
    assert record["of"] == "the published recommendation" and record["generation"] == 2
    assert "generation 2: forecast for the published recommendation (--max-num-seqs 16) on the new traffic" in out.getvalue()
    study = optuna.create_study(storage=open_storage(plan.storage_url), study_name="live-g2")
    of_generation.write_forecast(study, record)
    predicted = record["metrics"]["ttft_ms_p95"][0]
    _trial(study, 8, {"ttft_ms_p95": 3 * predicted}, baseline=True)
    _trial(study, 16, {"ttft_ms_p95": 200 * predicted}, partial=True)  # stopped early: not a measurement
    forecaster.after(study, 2)
    assert of_generation.forecast(study)["measured"] is None
    _trial(study, 16, {"ttft_ms_p95": 1.2 * predicted, "ttft_ms_p50": None})
    forecaster.after(study, 2)
    done = of_generation.forecast(study)
    m = done["measured"]
    assert m["trial"] == 2 and m["verdict"] == "holds" and m["right"]
    assert m["error_pct"]["ttft_ms_p95"] == pytest.approx(18.2, abs=0.1)  # |log 1.2|, in %
    assert "ttft_ms_p50" not in m["error_pct"]
    assert state.snapshot()["forecast"]["measured"]["trial"] == 2
    assert "generation 2: forecast against trial 2: p95 TTFT predicted" in out.getvalue()
    assert "verdict holds predicted, holds measured (right)" in out.getvalue()


def test_a_measured_slo_miss_makes_the_verdict_wrong(generation_1, tmp_path, tiny_model):
    plan = _plan(tmp_path, tiny_model, "live-g2", BUSY, "ttft:100000")
    record = {**fc.forecast(generation_1, plan, "the baseline", BASELINE).as_dict(), "generation": 2}
    study = optuna.create_study(storage=open_storage(plan.storage_url), study_name="live-g2b")
    _trial(study, 8, {"ttft_ms_p95": 150000.0}, baseline=True)
    m = fc.against_measured(record, study)["measured"]
    assert m["trial"] == 0 and m["verdict"] == "breaks" and not m["right"]


def test_a_generation_that_finished_no_run_forecasts_from_the_last_one_that_did(generation_1, tmp_path, tiny_model):
    """Generation 2 ended early for newer traffic with nothing finished: generation 3's forecast is
    calibrated on generation 1's runs, and says so."""
    state, out = StatusState(), io.StringIO()
    forecaster = fc.Forecaster(state, Console(file=out, width=300))
    g2 = _plan(tmp_path, tiny_model, "live-g2", BUSY)
    assert forecaster.before(generation_1, g2, 2)["calibrated_on"] == "study 'live', trial(s) 0"
    g3 = _plan(tmp_path, tiny_model, "live-g3", QUIET)
    assert forecaster.before(g2, g3, 3)["calibrated_on"] == "study 'live', trial(s) 0"
    assert forecaster.before(g3, _plan(tmp_path, tiny_model, "live-g4", BUSY), 4)["calibrated_on"] == \
        "study 'live', trial(s) 0"  # two generations back
    assert "no forecast" not in out.getvalue()


def test_a_forecast_that_failed_still_leaves_its_generation_to_look_back_on(generation_1, tmp_path, tiny_model,
                                                                            monkeypatch):
    """Generation 2's forecast failed (here: the twin refused once); generation 3's, from generation 2
    which finished no run, is calibrated on generation 1's."""
    real, calls = fc.forecast, []

    def once_refused(*args):
        calls.append(args)
        if len(calls) == 1:
            raise TypeError("refused once")  # not a ConfigError: the daemon goes on all the same
        return real(*args)

    monkeypatch.setattr(fc, "forecast", once_refused)
    out = io.StringIO()
    forecaster = fc.Forecaster(StatusState(), Console(file=out, width=300))
    g2, g3 = _plan(tmp_path, tiny_model, "live-g2", BUSY), _plan(tmp_path, tiny_model, "live-g3", QUIET)
    assert forecaster.before(generation_1, g2, 2) is None and "generation 2: no forecast (refused once)" in out.getvalue()
    assert forecaster.before(g2, g3, 3)["calibrated_on"] == "study 'live', trial(s) 0"


def test_a_forecast_outside_the_calibration_says_why_and_that_its_band_doubled():
    f = fc.Forecast("the baseline", {}, "study 'g1', trial(s) 0", {"ttft_ms_p95": [120.0, 60.0, 240.0]}, [],
                    "no SLOs", False, ["median prompt 3500 tokens is more than 8x the calibrated 350 (the prefill "
                                       "cost is extrapolated)"])
    assert f.describe() == ("p95 TTFT 120 ms [60, 240] (no SLOs to judge); outside the calibration (median prompt "
                            "3500 tokens is more than 8x the calibrated 350 (the prefill cost is extrapolated)): "
                            "band doubled")
    assert "outside" not in fc.Forecast("the baseline", {}, "", {"ttft_ms_p95": [1.0, 0.5, 2.0]}, [], "no SLOs",
                                        False).describe()


def test_a_verdict_outside_the_calibration_is_never_sure(generation_1, tmp_path, tiny_model):
    """BUSY: far past the calibration's rate (30 against 8 req/s), its SLO far past the band: still not sure."""
    busy = _plan(tmp_path, tiny_model, "live-g2", BUSY)
    predicted = fc.forecast(generation_1, busy, "the baseline", BASELINE).metrics["ttft_ms_p95"][0]
    f = fc.forecast(generation_1, _plan(tmp_path, tiny_model, "live-g2", BUSY, f"ttft:{100 * predicted:.0f}"),
                    "the baseline", BASELINE)
    assert f.verdict == "holds" and f.slos[0]["sure"]  # the band alone would say sure
    assert any(why.startswith("rate ") for why in f.outside) and not f.sure
    assert f.describe().startswith("holds (unsure: outside the calibration): ")
