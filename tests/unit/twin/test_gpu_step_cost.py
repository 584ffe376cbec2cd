"""The step cost of a GPU: aiconfigurator-core's per-operation vLLM timings where the library has the
device, the roofline where it has not, the twin saying which; and its correction by a study's own
runs on that GPU."""

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from optimizer.cli import main
from optimizer.config.schema import load_config
from optimizer.driver.plan import prepare
from optimizer.twin.from_study import correct_gpu, stored_runs
from optimizer.twin.gpu.server import gpu_twin
from optimizer.twin.gpu.correction import CorrectedStepCost, Correction
from optimizer.twin.gpu.library_cost import LibraryStepCost, library_step_cost
from optimizer.twin.gpu.roofline_cost import RooflineStepCost
from optimizer.twin.step_cost import StepShape
from optimizer.whatif import architecture
from optimizer.whatif.devices import known
from optimizer.whatif.roofline import Serving


LLAMA_8B = "meta-llama/Meta-Llama-3.1-8B"  # a config aiconfigurator-core ships: nothing fetched


@pytest.fixture(scope="module")
def h100_cost():
    cost = library_step_cost(LLAMA_8B, architecture.load(LLAMA_8B), known("h100"), Serving(1, 256, 0.9, "auto"))
    assert isinstance(cost, LibraryStepCost), cost
    return cost


def test_a_decode_only_step_is_the_librarys_decode_step_at_the_mean_context(h100_cost):
    shape = StepShape(decode_seqs=8, decode_context=8 * 500 / 1000)
    assert h100_cost.seconds(shape) == pytest.approx(h100_cost.handle.decode_step_latency(8, 500, 2) / 1000)
    longer = StepShape(decode_seqs=8, decode_context=8 * 4000 / 1000)
    more = StepShape(decode_seqs=64, decode_context=64 * 500 / 1000)
    assert h100_cost.seconds(longer) > h100_cost.seconds(shape) and h100_cost.seconds(more) > h100_cost.seconds(shape)


def test_a_prefill_costs_more_with_more_tokens_and_a_longer_context_and_decodes_beside_it_add(h100_cost):
    def prefill(tokens, context_before, decodes=0):
        return h100_cost.seconds(StepShape(tokens, tokens * (context_before + tokens / 2) / 1000, 1, decodes,
                                           decodes * 2.0))

    assert prefill(2048, 0) > prefill(256, 0) > 0
    assert prefill(512, 6000) > prefill(512, 0)  # a late chunk attends to what came before it
    assert prefill(512, 0, decodes=32) > prefill(512, 0)


def test_the_intake_is_the_librarys_own_per_request_dispatch_overhead(h100_cost):
    assert h100_cost.intake_s == pytest.approx(0.8e-3 * architecture.load(LLAMA_8B).layers)


def test_the_twin_on_a_covered_gpu_uses_the_library_and_elsewhere_the_roofline_says_why(model, tiny_model):
    arch = architecture.load(str(tiny_model))
    params = {"max-num-seqs": 16}
    _, cost, why_not = gpu_twin(model, arch, known("h100"), params, 2048)
    assert isinstance(cost, LibraryStepCost) and why_not == "" and "aiconfigurator-core" in cost.name
    _, cost, why_not = gpu_twin(model, arch, known("mi300x"), params, 2048)
    assert isinstance(cost, RooflineStepCost) and why_not == "aiconfigurator-core has no vLLM timings for mi300x"


TRUTH = Correction(1.6, 0.002, 0.02)  # the "real" H100 here: 1.6x the library's steps, 2 ms a step, 20 ms intake


@pytest.fixture
def h100_study(tmp_path, tiny_model, monkeypatch):
    """A stored study that ran on an H100: its baseline's request records are a replay of the GPU twin
    with a known correction of the library's step cost (a stand-in for a real GPU run)."""
    import optuna

    monkeypatch.chdir(tmp_path)
    cfg = {"study_name": "gpu", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": "artifacts",
           "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "gpu-memory-utilization": 0.3, "max-model-len": 2048},
           "space": {"max-num-seqs": {"low": 2, "high": 32}},
           "workload": {"requests": 48, "warmup_requests": 0, "long_share": 0.0, "short_input": [16, 1024],
                        "output": [16, 64], "arrival": {"process": "poisson", "rate": 30}},
           "objective": {"name": "latency", "metric": "ttft_p95"}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
    plan = prepare(load_config("study.yaml"))
    study = optuna.create_study(study_name="gpu", storage=cfg["storage"])
    study.set_user_attr("device", "gpu")
    study.set_user_attr("device_name", "NVIDIA H100 80GB HBM3")
    arch = architecture.load(str(tiny_model))
    for n, seqs in ((0, 8), (1, 3)):
        params = {**cfg["baseline"], "max-num-seqs": seqs}
        server, base, _ = gpu_twin(plan.model, arch, known("h100"), params, 2048)
        sim = server.run(plan.workload.requests, None, CorrectedStepCost(base, TRUTH))
        d = tmp_path / "artifacts" / "gpu" / f"trial-{n}"
        d.mkdir(parents=True)
        (d / "requests.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in sim.result.records))
        (d / "result.json").write_text(json.dumps({"trial": n, "params": params, "failure": None}))
    return plan, arch


def test_a_study_run_on_the_gpu_corrects_its_step_cost_and_the_correction_is_recovered(h100_study):
    plan, arch = h100_study
    correction, error = correct_gpu(plan, known("h100"), arch, stored_runs(plan.artifacts))
    assert correction.calibrated_on == ("trial 0",)  # the baseline: one KV dtype, one run
    assert correction.scale == pytest.approx(TRUTH.scale, rel=0.1)
    assert correction.intake_s == pytest.approx(TRUTH.intake_s, rel=0.2)
    assert error < 0.05


def test_simulate_on_the_gpu_the_study_ran_on_says_it_is_corrected_and_on_another_says_why_not(h100_study, capsys):
    assert main(["simulate", "--config", "study.yaml", "--what-if", "h100", "--set", "max-num-seqs=3",
                 "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    scale = re.search(r"corrected by the study's own runs on it \(x ([0-9.]+),", body["note"])
    assert scale and float(scale.group(1)) == pytest.approx(TRUTH.scale, rel=0.1)
    measured = [json.loads(x) for x in (Path("artifacts/gpu/trial-1/requests.jsonl")).read_text().splitlines()]
    ttfts = sorted((r["first_chunk_s"] - r["sent_s"]) * 1000 for r in measured)
    assert body["metrics"]["ttft_ms_p50"] == pytest.approx(ttfts[len(ttfts) // 2], rel=0.1)  # trial 1, not fitted on
    assert main(["simulate", "--config", "study.yaml", "--what-if", "a100", "--json"]) == 0
    assert "not corrected (the study ran on h100)" in json.loads(capsys.readouterr().out)["note"]


def test_a_study_on_that_gpu_without_request_records_answers_uncorrected_and_says_why(h100_study, capsys):
    import shutil

    shutil.rmtree("artifacts/gpu")
    assert main(["simulate", "--config", "study.yaml", "--what-if", "h100", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["note"]
    assert "not corrected (no complete trial with request records under " in note


def test_each_prompt_chunk_of_a_step_is_priced_at_its_own_context(h100_cost):
    """Two fresh prompts of 1,000 and 100 tokens in one step: their attention is each one's own, not
    twice that of a prompt at their mean context (attention grows with the square of a prompt)."""
    chunks = ((1000, 0), (100, 0))
    shape = StepShape(1100, (1000 * 500 + 100 * 50) / 1000, 2, chunks=chunks)
    parts = h100_cost._shared(1100, 0) + h100_cost._context(1000, 1000) + h100_cost._context(100, 100)
    assert h100_cost.seconds(shape) == pytest.approx(parts / 1000)
    assert h100_cost._context(1000, 1000) > h100_cost._context(100, 100) > 0
