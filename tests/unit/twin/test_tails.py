"""Tails at peak and the knee in `plan`: the twin calibrated on a stored study's runs (written here the
way the driver writes them, from runs of the twin itself with known step costs: a stand-in for real
runs; bench/knee.py holds the prediction against a real rate sweep)."""

import io
import json
from dataclasses import asdict

import optuna
import pytest
import yaml
from rich.console import Console

from optimizer.cli import plan as plan_command
from optimizer.cli.entry import parser
from optimizer.config.schema import load_config
from optimizer.driver.plan import prepare
from optimizer.measure.metrics import summarize
from optimizer.measure.slo import holds, parse_slos
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.trial.rate_search import at_rate
from optimizer.twin.server import TwinServer
from optimizer.twin.step_cost import LinearStepCost
from optimizer.twin.peak.tails import open_loop, tails

TRUTH = LinearStepCost((0.006, 0.00003, 0.00002, 0.0011, 0.0002, 0.0001, 0.00003, 0.00002, 0.0002, 0.00005), 0.004)
LOG = "INFO [kv_cache_utils.py:1] CPU KV cache size: 261,888 tokens\n"
BASE = {"max-num-seqs": 8, "gpu-memory-utilization": 0.3, "max-model-len": 2048, "kv-cache-dtype": "auto"}


@pytest.fixture
def study(tmp_path, tiny_model, monkeypatch):
    """A closed-loop study (16 in flight) of two trials, max-num-seqs 8 and 16, stored in the database
    and in its artifacts as the driver stores them."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    cfg = {"study_name": "tails", "storage": url, "artifacts_dir": "artifacts",
           "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": BASE, "space": {"max-num-seqs": {"low": 2, "high": 32}},
           "workload": {"requests": 48, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 256],
                        "output": [16, 64], "arrival": {"process": "closed", "concurrency": 16}},
           "objective": {"name": "throughput", "slos": "ttft:400"}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    plan = prepare(load_config("study.yaml"))
    study = optuna.create_study(study_name="tails", storage=url, direction="maximize")
    study.set_user_attr(RECORD_KEY, RECORD_VERSION)
    study.set_user_attr("objective", "throughput:output_throughput slos p95 TTFT <= 400 ms")
    for n, seqs in ((0, 8), (1, 16)):
        params = {**BASE, "max-num-seqs": seqs}
        server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, LOG)
        sim = server.run(plan.workload.requests, 16, TRUTH)
        d = tmp_path / "artifacts" / "tails" / f"trial-{n}"
        d.mkdir(parents=True)
        (d / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in sim.result.records))
        (d / "server.log").write_text(LOG)
        (d / "result.json").write_text(json.dumps({"trial": n, "params": params, "failure": None, "early_stop": {},
                                                   "rate_search": []}))
        metrics = summarize(sim.result)
        attrs = {"metrics": metrics, "vllm_args": plan.server_args(params)} | ({"baseline": True} if n == 0 else {})
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, params={},
                                                  distributions={}, value=metrics["output_throughput"],
                                                  user_attrs=attrs))
    return tmp_path, plan


def _plan(*argv, config: str = "study.yaml", dp: str | None = "none") -> list[str]:
    """`plan`'s lines; the data-parallel sizes it predicts (test_data_parallel.py) only when `dp` asks
    (None: no --dp, as a user types it)."""
    out = io.StringIO()
    dp_flag = [] if dp is None else ["--dp", dp]
    assert plan_command.main(parser().parse_args(["plan", "--config", config, *dp_flag, *argv]),
                             Console(file=out, width=400)) == 0
    return out.getvalue().splitlines()


def test_plan_states_the_tails_at_the_planned_rate_and_how_far_below_the_knee_it_sits(study):
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150")
    replicas = int(next(x for x in lines if x.startswith("Replicas: ")).split()[1])
    tail = next(x for x in lines if x.startswith("Tails at peak"))
    assert "the twin of trial 1, calibrated on trial(s) 0" in tail and "nothing booted; 48 requests a run" in tail
    assert f"each replica at {20 / replicas:.3g} req/s" in tail or f"each replica at {20 / replicas:g} req/s" in tail
    for part in ("TTFT p95 ", "p99 ", "TPOT p95 "):
        assert part in tail
    knee = next(x for x in lines if x.startswith("Knee: "))
    assert knee.startswith("Knee: saturation at ") and "(p95 TTFT stays under 400 ms until the queue grows" in knee
    assert "below it" in knee
    cfg = yaml.safe_load(open("study.yaml"))
    cfg["objective"]["slos"] = "ttft:30"  # the study's own SLOs: the knee's (a --slo must hold on the measured run)
    with open("tight.yaml", "w") as f:
        yaml.safe_dump(cfg, f)
    tight = next(x for x in _plan("--peak-qps", "20", "--tokens-per-request", "150", config="tight.yaml")
                 if x.startswith("Knee: "))
    assert tight.startswith("Knee: p95 TTFT reaches 30 ms at ") and "(saturation " in tight


def test_the_knee_is_where_p95_ttft_crosses_the_slo_on_the_twin(study):
    _, plan = study
    server = TwinServer.from_flags(plan.model, plan.server_args({**BASE, "max-num-seqs": 16}), plan.device, LOG)
    slos = parse_slos("ttft:30")  # crossed below saturation (a looser SLO's knee is the saturation itself)
    got = tails(server, TRUTH, plan.workload.requests, 5.0, slos)
    stream = open_loop(plan.workload.requests)
    assert 0 < got.knee < 0.97 * got.ceiling
    at = summarize(server.run(at_rate(stream, got.knee), None, TRUTH).result)
    past = summarize(server.run(at_rate(stream, got.knee + got.ceiling / 64), None, TRUTH).result)
    assert holds(slos, at) and not holds(slos, past)
    assert got.below_knee == pytest.approx((got.knee - 5.0) / got.knee)
    assert got.metrics["ttft_ms_p99"] >= got.metrics["ttft_ms_p95"] > 0


def test_a_closed_loop_workload_gets_seeded_poisson_arrivals_and_an_open_one_keeps_its_schedule(study):
    _, plan = study
    stream = open_loop(plan.workload.requests)
    assert stream == open_loop(plan.workload.requests)  # seeded
    gaps = [b.offset_s - a.offset_s for a, b in zip(stream, stream[1:])]
    assert all(g >= 0 for g in gaps) and len(set(round(g, 6) for g in gaps)) > 40  # not a constant rate
    assert open_loop(stream) == stream  # a schedule is kept as it is


def test_without_a_ttft_slo_the_knee_asks_for_one_and_without_runs_the_plan_says_why(study):
    tmp_path, _ = study
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150", "--slo", "tpot:500")
    assert any(x.startswith("Knee: needs a TTFT SLO (--slo ttft:MS); saturation at ") for x in lines)
    for d in (tmp_path / "artifacts" / "tails").glob("trial-*"):
        (d / "requests.jsonl").unlink()
    lines = _plan("--peak-qps", "20", "--tokens-per-request", "150")
    assert any(x.startswith("Tails at peak: not predicted (no complete trial with request records under ")
               for x in lines)
    assert any(x.startswith("Replicas: ") for x in lines)  # the measured plan stands


def _band_ratio(line: str, metric: str) -> float:
    """high / low of `metric`'s band in a tails line ('TTFT p95 47 ms [32-69]')."""
    part = line.split(f"{metric} ", 1)[1].split("]", 1)[0]
    low, high = part.split("[", 1)[1].replace(",", "").split("-")
    return float(high) / float(low)


def test_tails_past_the_batch_the_calibration_held_are_marked_outside_with_doubled_bands(study):
    """Calibrated on trial 0 alone (8 sequences at most): trial 1's 16, one replica near saturation,
    run a larger batch, so its tails are said to lie outside the validated envelope, their bands
    doubled; trial 0's own tails at its planned rate stay inside, with the one-run band."""
    from optimizer.twin.prediction import BAND_ONE_RUN

    # one replica near its saturation (17 req/s): a batch of up to 16
    lines = _plan("--peak-qps", "16", "--tokens-per-request", "150", "--headroom", "0")
    tail = next(x for x in lines if x.startswith("Tails at peak"))
    outside = next((x for x in lines if x.startswith("  OUTSIDE the twin's validated envelope (")), "")
    assert "is more than 1.25x the largest a calibration run held (8)" in outside and outside.endswith("its bands doubled"), "\n".join(lines)
    assert _band_ratio(tail, "TTFT p95") == pytest.approx((1 + 2 * BAND_ONE_RUN["ttft_ms_p95"]) ** 2, rel=0.05)
    own = _plan("--peak-qps", "16", "--tokens-per-request", "150", "--headroom", "0", "--trial", "0")
    assert not any("OUTSIDE" in x for x in own), own
    inside = next(x for x in own if x.startswith("Tails at peak"))
    assert "the twin of trial 0" in inside
    assert _band_ratio(inside, "TTFT p95") == pytest.approx((1 + BAND_ONE_RUN["ttft_ms_p95"]) ** 2, rel=0.05)
