"""`simulate` on a stored study, nothing booted: the study's trial files are written here the way the
driver writes them, from runs of the twin itself with known step costs (a stand-in for real runs; the
real ones are in tests/integration/test_parallel_cpu_trials.py and bench/twin_validation.py)."""

import json
from dataclasses import asdict

import pytest
import yaml

from optimizer.cli import main
from optimizer.config.schema import load_config
from optimizer.driver.plan import prepare
from optimizer.twin.server import TwinServer
from optimizer.twin.step_cost import LinearStepCost

TRUTH = LinearStepCost((0.006, 0.00003, 0.00002, 0.0011, 0.0002, 0.0001, 0.00003, 0.00002, 0.0002, 0.00005), 0.004)
LOG = "INFO [kv_cache_utils.py:1] CPU KV cache size: 261,888 tokens\n"


@pytest.fixture
def study(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {"study_name": "twin", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": "artifacts",
           "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "gpu-memory-utilization": 0.3, "max-model-len": 2048,
                        "kv-cache-dtype": "auto"},
           "space": {"max-num-seqs": {"low": 2, "high": 32}},
           "workload": {"requests": 32, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 256],
                        "output": [16, 64], "arrival": {"process": "poisson", "rate": 8}},
           "objective": {"name": "latency", "metric": "ttft_p95", "slos": "tpot:50"}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    plan = prepare(load_config("study.yaml"))
    for n, seqs in ((0, 8), (1, 4), (2, 6)):
        params = {**cfg["baseline"], "max-num-seqs": seqs}
        server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, LOG)
        sim = server.run(plan.workload.requests, None, TRUTH)
        d = tmp_path / "artifacts" / "twin" / f"trial-{n}"
        d.mkdir(parents=True)
        (d / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in sim.result.records))
        (d / "server.log").write_text(LOG)
        (d / "result.json").write_text(json.dumps({"trial": n, "params": params, "failure": None, "early_stop": {},
                                                   "rate_search": [], "server": {"running_peak": sim.server["running_peak"]}}))
    return tmp_path


def test_simulate_predicts_a_trial_it_was_not_calibrated_on_beside_its_measured_run(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--trial", "2"]) == 0
    out = capsys.readouterr().out
    assert "nothing booted" in out and "fitted on trial(s) 0 of this study (median" in out  # no step probe stored
    assert "vLLM's own (max-num-seqs 6, token budget 2048" in out and "Not modelled:" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("TPOT p50"))
    predicted, measured = float(row.split()[3]), float(row.split()[-1])
    assert predicted == pytest.approx(measured, rel=0.05)
    assert (study / "artifacts" / "twin" / "twin.json").exists()  # the fit is kept for the next question


def test_simulate_answers_in_json_with_bands_inside_the_metrics_range(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--set", "max-num-seqs=16", "--rate", "12", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["params"]["max-num-seqs"] == 16 and body["measured"] is None
    for metric, (lo, hi) in body["bands"].items():
        value = body["goodput"] if metric == "goodput" else body["metrics"][metric]
        assert 0 < lo < value < hi, metric
    # 16 is within 8x of the calibrated 8 and 12 req/s within 2x of 8, but the batch grows past what the
    # baseline's run held: said, with both figures
    held = json.loads((study / "artifacts" / "twin" / "trial-0" / "result.json").read_text())["server"]["running_peak"]
    batch = body["server"]["running_peak"]
    assert batch > 1.25 * held
    assert body["outside_envelope"] == [f"a running batch of {batch:g} is more than 1.25x the largest a calibration "
                                        f"run held ({held:g}): what more sequences in a step cost is extrapolated"]


def test_a_configuration_far_from_the_calibration_is_marked_outside(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--set", "max-num-seqs=256", "--set", "kv-cache-dtype=fp8"]) == 0
    out = capsys.readouterr().out
    assert "OUTSIDE the validated envelope" in out
    assert "KV dtype fp8 never calibrated" in out and "max-num-seqs 256 is more than 8x" in out


def test_bad_input_is_one_line_and_writes_nothing(study, capsys):
    before = sorted(p.name for p in (study / "artifacts" / "twin").iterdir())
    for argv, words in ((["--set", "max-num-seqs=0"], "max_num_seqs: Input should be greater than or equal to 1"),
                        (["--set", "max-num-seq=8"], "--set: unknown parameter 'max-num-seq'"),
                        (["--set", "max-num-seqs=many"], "--set max-num-seqs=many: max-num-seqs takes a int"),
                        (["--trial", "7"], "--trial 7: no complete, fully replayed trial 7"),
                        (["--rate", "-1"], "--rate -1: give a positive number")):
        assert main(["simulate", "--config", "study.yaml", *argv]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and words in err[0], err
    assert sorted(p.name for p in (study / "artifacts" / "twin").iterdir()) == before


def test_what_if_a_gpu_runs_vllms_scheduler_with_that_gpus_defaults_and_the_librarys_timings(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--what-if", "h100", "--rate", "40", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["what_if"] == "h100" and body["calibrated_on"] == []
    # vLLM's OpenAI-server defaults on an 80 GB H100, blocks of 16; the baseline's own max-num-seqs kept
    assert "max-num-seqs 8, token budget 8192" in body["scheduler"] and "blocks of 16" in body["scheduler"]
    assert "step costs from aiconfigurator-core's per-operation vLLM timings on h100" in body["note"]
    assert "not corrected (no stored study to correct it with)" in body["note"]
    lo, hi = body["bands"]["tpot_ms_p50"]  # the library's band on published rows: a factor of 2.08 either way
    assert lo < body["metrics"]["tpot_ms_p50"] < hi and hi / lo == pytest.approx(2.075 ** 2)
    assert body["metrics"]["request_throughput"] > 0


def test_what_if_an_unknown_gpu_is_refused_before_anything(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--what-if", "h900"]) == 2
    assert "what-if: unknown device 'h900'" in capsys.readouterr().err


def test_the_search_prior_predicts_a_proposed_configuration_from_the_studys_runs(study):
    """search/prior.py on the stored study: the objective's value (p95 TTFT) of a configuration the twin
    was not calibrated on, near what the stand-in server gives it; an uncalibrated KV dtype is outside
    the envelope (never told without a boot)."""
    from optimizer.search import prior
    from optimizer.twin.prediction import predict

    plan = prepare(load_config("study.yaml"))
    params = {**plan.cfg.baseline, "max-num-seqs": 4}
    got = prior.predict(plan, params)
    truth = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, LOG).run(
        plan.workload.requests, None, TRUTH)
    assert got.value == pytest.approx(plan.objective.score(predict(truth).metrics), rel=0.1)
    assert got.calibrated_on == (0,) and got.outside == ()
    fp8 = prior.predict(plan, {**params, "kv-cache-dtype": "fp8"})
    assert fp8 is not None and any("never calibrated" in why for why in fp8.outside)


def test_a_memory_fraction_among_the_fixed_flags_sizes_the_calibrated_pool(tmp_path, tiny_model):
    """A study that fixes --gpu-memory-utilization in engine.extra_args (not a trial parameter): the
    KV calibration reads it from the flags the server started with, not vLLM's default 0.92, so
    a configuration predicted later gets the pool its run had, not none."""
    from optimizer.config.schema import build_config
    from optimizer.twin.from_study import calibrate

    plan = prepare(build_config({
        "study_name": "fixed", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": str(tmp_path / "a"),
        "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 4}, "space": {"max-num-seqs": {"low": 1, "high": 16}},
        "engine": {"extra_args": ["--gpu-memory-utilization", "0.05", "--max-model-len", "2048"]},
        "workload": {"requests": 8, "warmup_requests": 0, "long_share": 0.0, "short_input": [16, 64],
                     "output": [8, 16]}}))
    log = "INFO [kv_cache_utils.py:1] CPU KV cache size: 20,480 tokens\n"
    server = TwinServer.from_flags(plan.model, plan.server_args({"max-num-seqs": 4}), plan.device, log)
    sim = server.run(plan.workload.requests, plan.workload.concurrency, TRUTH)
    d = plan.artifacts / "trial-0"
    d.mkdir(parents=True)
    (d / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in sim.result.records))
    (d / "server.log").write_text(log)
    (d / "result.json").write_text(json.dumps({"trial": 0, "params": {"max-num-seqs": 4}, "failure": None}))
    cal = calibrate(plan)
    assert "at util 0.05 of" in cal.kv_calibration.evidence
    other = TwinServer.from_flags(plan.model, plan.server_args({"max-num-seqs": 8}), plan.device, "", cal.kv_calibration)
    assert other.pool.blocks == server.pool.blocks  # the same memory fraction: the same pool


def test_a_block_size_or_attention_backend_never_calibrated_is_outside_the_envelope(model):
    """The step cost does not see them (the kernels do): never 'the same' as a calibrated run."""
    from optimizer.twin import envelope

    calibrated = TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30)])
    other = TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
                                          "--block-size", "64"])
    assert envelope.outside(calibrated.shape, [calibrated.shape], {}) == []
    assert any("block size 64 never calibrated" in why for why in envelope.outside(other.shape, [calibrated.shape], {}))
    assert any("attention-backend" in why for why in envelope.outside(
        calibrated.shape, [calibrated.shape], {"attention-backend": "TORCH_SDPA"}))


def test_prompts_far_longer_than_the_calibrations_are_outside_the_envelope(model):
    """A prefill token's cost fitted on 40-token prompts, priced on 3,500-token ones, is an extrapolation."""
    from optimizer.twin import envelope
    from optimizer.workload.base import Request

    calibrated = TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30)])
    short = [Request(f"s{i}", tuple(range(n)), 8, 0.0) for i, n in enumerate((30, 40, 45))]
    long = [Request(f"l{i}", tuple(range(n)), 8, 0.0) for i, n in enumerate((3200, 3500, 3800))]
    assert envelope.median_prompt(short) == 40 and envelope.median_prompt([]) is None
    why = envelope.outside(calibrated.shape, [calibrated.shape], {}, prompt=envelope.median_prompt(long),
                           calibrated_prompt=envelope.median_prompt(short))
    assert why == ["median prompt 3500 tokens is more than 8x the calibrated 40 (the prefill cost is extrapolated)"]
    assert envelope.outside(calibrated.shape, [calibrated.shape], {}, prompt=300.0, calibrated_prompt=40.0) == []
    assert envelope.outside(calibrated.shape, [calibrated.shape], {}, prompt=40.0, calibrated_prompt=3500.0) == []


def test_a_batch_is_outside_the_envelope_of_runs_that_served_one_sequence_at_a_time(model):
    """Fitted where every step held one sequence, the cost of a batch was never seen: 2 sequences are
    outside (8x would otherwise allow them); a batch past a quarter more than any run held is outside."""
    from optimizer.twin import envelope

    def shape(n: int):
        return TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
                                             "--max-num-seqs", str(n)]).shape

    assert envelope.outside(shape(1), [shape(1)], {}) == []
    assert envelope.outside(shape(2), [shape(1)], {}) == [
        "a running batch of 2: no calibration run held two sequences in a step, so what a batch costs was never seen"]
    assert envelope.outside(shape(16), [shape(2)], {}) == []  # no batch told: only a batch never seen is said
    assert envelope.outside(shape(16), [shape(1), shape(4)], {}) == []
    # The batch a prediction runs against the largest a calibration run held (its running peak): a
    # server at max-num-seqs 16 whose traffic only ever filled 3 never showed what 16 cost.
    assert envelope.outside(shape(16), [shape(16)], {}, batch=12, calibrated_batch=10) == []
    assert envelope.outside(shape(16), [shape(16)], {}, batch=13, calibrated_batch=10) == [
        "a running batch of 13 is more than 1.25x the largest a calibration run held (10): what more sequences "
        "in a step cost is extrapolated"]
    assert envelope.outside(shape(16), [shape(16)], {}, batch=16, calibrated_batch=1) == [
        "a running batch of 16: no calibration run held two sequences in a step, so what a batch costs was never seen"]
    assert envelope.outside(shape(16), [shape(16)], {}, batch=16) == []  # bounded by the runs' max-num-seqs


def test_the_calibration_takes_the_baseline_each_kv_dtype_and_a_batch_where_none_was_seen():
    """The baseline, the first run of a KV dtype it lacked, then, where none of them held two
    sequences at once, the run that held the most; where the batch moved, no run is added."""
    from optimizer.twin.from_study import StoredRun, choose

    def run(n: int, peak: float | None, dtype: str = "auto") -> StoredRun:
        return StoredRun(n, {"kv-cache-dtype": dtype}, [], "", peak)

    assert [r.number for r in choose([run(0, 1), run(1, 16), run(2, 1, "fp8"), run(3, 64)])] == [0, 2, 3]
    assert [r.number for r in choose([run(0, 1), run(1, 16), run(2, 4, "fp8"), run(3, 64)])] == [0, 2]
    assert [r.number for r in choose([run(0, 8), run(1, 32)])] == [0]
    assert [r.number for r in choose([run(0, 1), run(1, None), run(2, 1)])] == [0]  # no batch anywhere
    assert [r.number for r in choose([run(0, None), run(1, 32)])] == [0]  # the baseline's batch never read
    # a fleet study: the first fp8 run has two data-parallel engines, the next one engine
    dp = StoredRun(1, {"kv-cache-dtype": "fp8", "data-parallel-size": 2}, [], "", 8)
    tp = StoredRun(2, {"kv-cache-dtype": "fp8", "tensor-parallel-size": "2"}, [], "", 8)
    assert [r.number for r in choose([run(0, 8), dp, tp, run(3, 8, "fp8")])] == [0, 3]
    assert [r.number for r in choose([dp, tp])] == [1]  # only parallel runs: the first, as before


def test_the_largest_batch_held_is_the_larger_of_the_sampled_and_the_twins_peak_else_max_num_seqs(model):
    """/metrics samples the running gauge and may miss the top; the twin's run of the calibration run
    counts every step, as a prediction's does: the larger counts. With neither, max-num-seqs bounds it."""
    from optimizer.twin import envelope
    from optimizer.twin.from_study import Calibrated, StoredRun

    server = TwinServer.from_flags(model, ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
                                           "--max-num-seqs", "16"])

    def cal(peaks: list, simulated: tuple = ()) -> Calibrated:
        runs = [StoredRun(n, {}, [], "", p) for n, p in enumerate(peaks)]
        return Calibrated(None, runs, [server] * len(runs), 0.0, 0.0, None, simulated)

    assert cal([6.0, 9.0]).largest_batch == 9.0
    assert cal([6.0, 9.0], (7, 12)).largest_batch == 12
    assert cal([None], ()).largest_batch == 16
    assert cal([None], (5,)).largest_batch == 5
    batch = envelope.outside(server.shape, [server.shape], {}, batch=20, calibrated_batch=12)
    fp8 = ["KV dtype fp8 never calibrated"]
    assert envelope.beyond_price(batch) == [] and envelope.beyond_price(batch + fp8) == fp8


def test_data_parallel_engines_are_simulated_behind_vllms_balancer_and_marked_outside(study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--set", "max-num-seqs=4", "--rate", "14", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--config", "study.yaml", "--set", "max-num-seqs=4", "--set", "data-parallel-size=2",
                 "--rate", "14", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["scheduler"].startswith("2 data-parallel engines, each ")
    assert ("data-parallel-size 2: engines behind vLLM's balancer, checked against a real DP server on a 2-core CPU "
            "only, where they were optimistic") in two["outside_envelope"]
    # the same requests on two engines of 4 sequences: each runs at most 4, and no request waits longer than on one
    assert two["server"]["running_peak"] <= 4 and two["metrics"]["ttft_ms_p95"] < one["metrics"]["ttft_ms_p95"]
