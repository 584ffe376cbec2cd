"""`plan --what-if` (cli/plan.py, cli/whatif_args.py, whatif/fleet_rows.py, whatif/study_calibration.py):
predicted rows beside the measured plan, calibrated on a GPU study's own trials, sorted by cost;
without a study, predicted rows alone; a CPU study calibrates nothing and says so."""

from __future__ import annotations

import io
import json
import math

import optuna
import pytest
from rich.console import Console

from optimizer.cli import plan as plan_command
from optimizer.cli.entry import parser
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.errors import ConfigError
from optimizer.measure.slo import parse_slos
from optimizer.whatif import architecture, calibration, devices, fleet_rows, roofline
from optimizer.whatif.study_calibration import from_study

# A 7B-class dense model (Qwen2.5-7B's shape), bf16.
QWEN7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
          "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
          "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
L4 = devices.known("l4")


@pytest.fixture
def model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN7B))
    return str(tmp_path / "m")


def _gpu_study(url: str, model: str, bias: float, device_name: str = "NVIDIA L4", loads=(1, 4, 16)):
    """A GPU study whose trials measured `bias` x the roofline's TPOT (and its TTFT and throughput as
    predicted) at closed loads of `loads` requests in flight, 900 prompt + 100 output tokens."""
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.set_user_attr(RECORD_KEY, RECORD_VERSION)  # as the tool stamps its studies
    study.set_user_attr("objective", "throughput:output_throughput")
    study.set_user_attr("device", "gpu")
    study.set_user_attr("device_name", device_name)
    arch = architecture.load(model)
    for c in loads:
        e = roofline.estimate(arch, L4, roofline.Serving(), roofline.Load(900, 100, c))
        rps = e.throughput / 100  # what the predicted throughput carries, so that only TPOT is off
        m = {"request_throughput": rps, "output_throughput": 100 * rps, "total_token_throughput": 1000 * rps,
             "e2el_ms_mean": c / rps * 1e3, "ttft_ms_mean": e.ttft_s * 1e3, "tpot_ms_mean": e.tpot_s * 1e3 * bias,
             "ttft_ms_p95": 1.0, "tpot_ms_p95": 1.0, "error_rate": 0.0}
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=100.0 * c,
                                                  user_attrs={"metrics": m, "vllm_args": ["--max-num-seqs", "256"]}))
    return study


def run_plan(argv):
    out = io.StringIO()
    code = plan_command.main(parser().parse_args(["plan", *argv]), Console(file=out, width=300))
    return code, out.getvalue().splitlines()


def test_a_gpu_studys_trials_calibrate_the_prediction_for_its_device(tmp_path, model):
    study = _gpu_study(f"sqlite:///{tmp_path / 't.db'}", model, bias=1.5)
    c = from_study(study, model, architecture.load(model))
    assert c.points == {"ttft_s": 3, "tpot_s": 3, "throughput": 3}
    assert c.factors["tpot_s"] == pytest.approx(1.5, rel=0.02) and c.factors["ttft_s"] == pytest.approx(1.0, rel=0.02)
    assert c.basis == "3 trial(s) of study 's' on l4"


def test_a_cpu_study_or_an_unnamed_gpu_calibrates_nothing_and_says_why(tmp_path, model):
    study = _gpu_study(f"sqlite:///{tmp_path / 't.db'}", model, bias=1.5)
    study.set_user_attr("device", "cpu")
    assert from_study(study, model, architecture.load(model)).basis == \
        "the study ran on CPU: no GPU measurement to calibrate on"
    study.set_user_attr("device", "gpu")
    study.set_user_attr("device_name", "NVIDIA A10G")
    assert "NVIDIA A10G, which the device table lacks: name the nearest with --measured-on" in \
        from_study(study, model, architecture.load(model)).basis
    assert from_study(study, model, architecture.load(model), named="l4").points["tpot_s"] == 3


def test_the_rows_keep_the_slos_count_replicas_and_sort_by_cost(model):
    arch = architecture.load(model)
    none = calibration.none("x")
    slos = parse_slos("ttft:2000 tpot:60")
    rows = fleet_rows.rows(model, arch, [L4, devices.known("h100")], [1, 2], roofline.Serving(), 900, 100, none,
                           slos, 20.0, 0.3, {"l4": 0.8, "h100": 4.0})
    assert [r.usable for r in rows] == [True] * 4
    costs = [r.cost_per_h for r in rows]
    assert costs == sorted(costs)
    for r in rows:
        assert r.ttft_s * 1e3 <= 2000 and r.tpot_s * 1e3 <= 60
        assert r.requests_per_s == pytest.approx(r.throughput / 100)
        assert r.replicas == math.ceil(20.0 / (r.requests_per_s * 0.7)) and r.devices == r.replicas * r.tp
    strict = fleet_rows.row(model, arch, L4, 1, roofline.Serving(), 900, 100, none, parse_slos("tpot:1"), 20.0, 0.3, None)
    assert not strict.usable and strict.why == "keeps the SLOs at no load, not even one request alone"


def test_plan_prints_the_measured_plan_then_calibrated_predicted_rows(tmp_path, model):
    url = f"sqlite:///{tmp_path / 't.db'}"
    _gpu_study(url, model, bias=1.5)
    code, lines = run_plan(["--storage", url, "--study-name", "s", "--model", model, "--peak-qps", "20",
                            "--tokens-per-request", "1000", "--what-if", "l4,h100", "--tp", "1,2",
                            "--price", "l4=0.8,h100=4", "--slo", "tpot:150"])
    assert code == 0
    assert lines[0].startswith("Demand at peak: 20 req/s") and any(x.startswith("Replicas: ") for x in lines)
    start = next(i for i, x in enumerate(lines) if x.startswith("What-if: "))
    assert "900 prompt + 100 output tokens a request, max-num-seqs 256" in lines[start]
    assert lines[start + 1] == "  calibration: 3 trial(s) of study 's' on l4"
    # the study's trials were the roofline's figures x 1.5 on TPOT exactly: no residual left
    assert lines[start + 2].startswith("  bands on l4 by the roofline: TTFT +-0%, TPOT +-0%")
    rows = [x for x in lines[start + 5:] if x.split()[0] in ("l4", "h100")]
    assert len(rows) == 4
    costs = [float(r.split()[4]) for r in rows]
    assert costs == sorted(costs)
    assert all(r.endswith("roofline, predicted (+-0%)") for r in rows if r.split()[0] == "l4")
    # the library answers for h100: a correction fitted on the roofline's figures is not applied to it
    assert all("aiconfigurator-core" in r and r.endswith("predicted (+-369%)") for r in rows if r.split()[0] == "h100")
    assert "  roofline, because aiconfigurator-core has no vLLM timings for l4" in lines
    assert lines[-1] == "  every row above is predicted, not measured"


def test_without_a_study_the_rows_are_predicted_alone_and_need_the_output_length(tmp_path, model):
    url = f"sqlite:///{tmp_path / 'none.db'}"
    argv = ["--storage", url, "--study-name", "s", "--model", model, "--peak-qps", "20", "--tokens-per-request",
            "1000", "--what-if", "l4"]
    with pytest.raises(ConfigError, match="no measured run says how --tokens-per-request splits into prompt and "
                                          "output; give --output-tokens"):
        run_plan(argv)
    code, lines = run_plan(argv + ["--output-tokens", "200"])
    assert code == 0 and lines[0].startswith("Measured: none (no study database at ")
    assert lines[2] == "  calibration: no study to calibrate on (uncorrected: the bands are the estimate's own " \
                       "error on published measurements)"
    assert not (tmp_path / "none.db").exists()


def test_a_device_described_in_the_config_is_predicted_with_the_roofline(tmp_path, model):
    config = tmp_path / "study.yaml"
    config.write_text(f"study_name: s\nstorage: sqlite:///{tmp_path / 'none.db'}\nmodel: {{path: {model}}}\n"
                      "whatif:\n  devices:\n    a10g: {memory_gb: 24, bandwidth_gbs: 600, bf16_tflops: 70, "
                      "source: AWS G5 page}\n")
    code, lines = run_plan(["--config", str(config), "--peak-qps", "5", "--tokens-per-request", "1000",
                            "--output-tokens", "100", "--what-if", "a10g,l4", "--tp", "1"])
    assert code == 0
    rows = {x.split()[0]: x for x in lines if x.startswith("  a10g ") or x.startswith("  l4 ")}
    assert set(rows) == {"a10g", "l4"} and "  roofline, predicted (+-" in rows["a10g"]
    assert rows["a10g"].split()[-2] == rows["l4"].split()[-2]  # 24 GB each: the same KV cache
    assert rows["a10g"].split()[4] != rows["l4"].split()[4]  # other bandwidth and FLOPs: another capacity
    with pytest.raises(ConfigError, match="whatif.devices.bad: give bandwidth_gbs, bf16_tflops"):
        config.write_text(config.read_text() + "    bad: {memory_gb: 24}\n")
        run_plan(["--config", str(config), "--peak-qps", "5", "--tokens-per-request", "1000",
                  "--output-tokens", "100", "--what-if", "bad"])


def test_measured_on_cannot_make_a_cpu_study_calibrate_a_gpu(tmp_path, model):
    study = _gpu_study(f"sqlite:///{tmp_path / 't.db'}", model, bias=1.5)
    study.set_user_attr("device", "cpu")
    with pytest.raises(ConfigError, match="--measured-on h100: study 's' ran on CPU, and a CPU's timings cannot "
                                          "calibrate a GPU's; drop --measured-on"):
        from_study(study, model, architecture.load(model), named="h100")


def test_a_short_tp_flag_is_read_and_pipeline_parallel_trials_are_left_out(tmp_path, model):
    study = _gpu_study(f"sqlite:///{tmp_path / 't.db'}", model, bias=1.5)
    from optimizer.whatif.study_calibration import knobs_of, serving_of
    trials = study.get_trials()
    t = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0,
                                  user_attrs={"metrics": trials[0].user_attrs["metrics"],
                                              "vllm_args": ["-tp", "2", "--pipeline-parallel-size", "2"]})
    assert knobs_of(t)["tensor-parallel-size"] == "2" and serving_of(t, roofline.Serving()).tp == 2
    study.add_trial(t)
    assert from_study(study, model, architecture.load(model)).points["tpot_s"] == 3  # the pp 2 trial is not a point


def test_on_an_open_loop_workload_the_twin_answers_each_row_and_says_so(tmp_path, tiny_model):
    """The study's own workload (Poisson arrivals, its length spread) through vLLM's scheduler with the
    device's defaults and the library's or the roofline's step cost, at rising rates: the twin's rows say so; a closed
    loop leaves every row to the mean estimate, and says why."""
    config = tmp_path / "study.yaml"
    body = (f"study_name: s\nstorage: sqlite:///{tmp_path / 'none.db'}\nmodel: {{path: {tiny_model}}}\n"
            "workload: {requests: 48, long_share: 0.1, arrival: {process: poisson, rate: 20}}\n")
    config.write_text(body)
    argv = ["--config", str(config), "--peak-qps", "50", "--tokens-per-request", "300", "--output-tokens", "100",
            "--what-if", "l4,h100", "--tp", "1", "--slo", "ttft:200 tpot:20"]
    code, lines = run_plan(argv)
    assert code == 0
    rows = [x for x in lines if x.startswith("  l4 ") or x.startswith("  h100 ")]
    assert len(rows) == 2
    # aiconfigurator-core has vLLM timings for the H100, none for the L4: the roofline prices its steps
    assert "twin (vLLM's scheduler, aiconfigurator-core step cost), predicted" in next(r for r in rows if "h100" in r)
    assert "twin (vLLM's scheduler, roofline step cost), predicted" in next(r for r in rows if "l4 " in r)
    assert "  rows by the twin: the study's chat workload (48 requests) through vLLM's scheduler at rising rates, " \
           "its TTFT and TPOT p95s; other rows: the mean estimate" in lines
    assert lines[-1] == "  every row above is predicted, not measured"
    h100, l4 = (next(r for r in rows if r.split()[0] == d) for d in ("h100", "l4"))
    assert float(h100.split()[4]) > float(l4.split()[4])  # more bandwidth and FLOPs: more req/s a replica
    # each twin row's tails at its share of the peak, and its knee: predicted for a device never measured
    for row in (h100, l4):
        device, replicas, capacity = row.split()[0], int(row.split()[2]), float(row.split()[4])
        line = next(x for x in lines if x.startswith(f"  tails at peak, {device} TP1: "))
        share = 50 / replicas
        assert f"each of {replicas} replica(s) at {share:.3g} req/s: TTFT p95 " in line and line.endswith("(predicted)")
        ttft = line.split("TTFT ")[1].split(";")[0]  # "p95 7.2 ms [3.17-16.4], p99 7.28 ms [3.2-16.6]"
        p95, p99 = (float(ttft.split(f"{q} ")[1].split(" ms")[0]) for q in ("p95", "p99"))
        assert 0 < p95 <= p99
        knee = float(line.split("knee ")[1].split(" req/s")[0])
        assert knee >= capacity * 0.99  # the TTFT SLO alone holds wherever both SLOs hold
        assert f"{(knee - share) / knee:.0%} below it" in line
    config.write_text(body.replace("process: poisson, rate: 20", "process: closed, concurrency: 8"))
    code, lines = run_plan(argv)
    assert code == 0 and not any("twin (vLLM" in x for x in lines)
    assert any("the twin did not answer: the study's workload is a closed loop" in x for x in lines)
