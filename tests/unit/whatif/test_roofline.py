"""whatif/roofline.py and whatif/devices.py: the roofline's arithmetic on a hand-checked model
(Llama-3.1-8B's shape), and the device table's refusals."""

from __future__ import annotations

import pytest

from optimizer.config.model_info import ModelInfo
from optimizer.errors import ConfigError
from optimizer.whatif import devices
from optimizer.whatif import roofline as r

# Llama-3.1-8B: 32 layers, 8 KV heads of 128, hidden 4096, MLP 14336, vocabulary 128256.
LLAMA8B = ModelInfo("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 128, 4096, 14336, 128256, 131072, "bfloat16")
# ModelInfo's count: 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) + 2 x 128256 x 4096
PARAMS = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 2 * 128256 * 4096
LLAMA70B = ModelInfo("meta-llama/Llama-3.1-70B-Instruct", 80, 8, 128, 8192, 28672, 128256, 131072, "bfloat16")
H100 = devices.known("h100")


def test_kv_bytes_per_token_split_over_ranks_and_replicated_past_the_kv_heads():
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving()) == 2 * 32 * 8 * 128 * 2 == 131072  # 128 KiB
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(kv_dtype="fp8")) == 65536
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(tp=2)) == 65536
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(tp=16)) == 131072 / 8  # one head a rank: replicated
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(weight_dtype="fp8")) == 131072  # fp8 weights, bf16 cache


def test_a_decode_step_at_batch_one_is_the_weights_read_at_the_derated_bandwidth():
    weights = PARAMS * 2
    context_bytes = 1 * 1000 * 131072
    expected = (weights + context_bytes) / (3350e9 * r.BANDWIDTH_EFFICIENCY) + 32 * r.LAYER_OVERHEAD_S
    assert r.decode_step_s(LLAMA8B, H100, r.Serving(), 1, 1000) == pytest.approx(expected)
    assert expected == pytest.approx(0.00651, rel=0.01)  # ~6.5 ms: H100's memory bound for 16 GB of weights


def test_a_large_batch_becomes_compute_bound_and_tp_adds_its_all_reduces():
    batch, context = 4096, 100
    flops = batch * (2 * PARAMS + 4 * 32 * 4096 * context)
    compute = flops / (989e12 * r.COMPUTE_EFFICIENCY)
    step = r.decode_step_s(LLAMA8B, H100, r.Serving(), batch, context)
    assert step == pytest.approx(compute + 32 * r.LAYER_OVERHEAD_S)
    tp2 = r.decode_step_s(LLAMA8B, H100, r.Serving(tp=2), batch, context)
    ring = 2 * (2 - 1) / 2 * batch * 4096 * 2 / (900e9 / 2)
    assert tp2 == pytest.approx(compute / 2 + 32 * r.LAYER_OVERHEAD_S + 2 * 32 * (ring + r.ALLREDUCE_LATENCY_S))


def test_fp8_weights_halve_the_bytes_and_use_the_fp8_peak():
    bf16 = r.prefill_s(LLAMA8B, H100, r.Serving(), 8192)
    fp8 = r.prefill_s(LLAMA8B, H100, r.Serving(weight_dtype="fp8"), 8192)
    assert fp8 == pytest.approx((bf16 - 32 * r.LAYER_OVERHEAD_S) * 989 / 1979 + 32 * r.LAYER_OVERHEAD_S)
    a100 = devices.known("a100")  # no fp8 tensor cores: the bf16 peak
    assert r.prefill_s(LLAMA8B, a100, r.Serving(weight_dtype="fp8"), 8192) == \
        pytest.approx(r.prefill_s(LLAMA8B, a100, r.Serving(), 8192))


def test_the_load_sets_the_batch_and_the_serving_terms():
    load = r.Load(isl=1024, osl=128, concurrency=8)
    e = r.estimate(LLAMA8B, H100, r.Serving(), load)
    assert e.fits and e.batch == 8 and e.kv_requests == e.kv_tokens // 1152
    runtime = max(1 * 1024**3, 0.02 * 80e9)
    assert e.kv_tokens == int((80e9 * 0.9 - PARAMS * 2 - runtime) // 131072)
    step = r.decode_step_s(LLAMA8B, H100, r.Serving(), 8, 1024 + 64)
    prefill = r.prefill_s(LLAMA8B, H100, r.Serving(), 1024)
    assert e.ttft_s == pytest.approx(prefill + step)
    assert e.tpot_s == pytest.approx(step + 8 * prefill / 128)
    assert e.throughput == pytest.approx(8 / e.tpot_s)
    assert r.estimate(LLAMA8B, H100, r.Serving(max_num_seqs=4), load).batch == 4


def test_a_model_that_does_not_fit_says_why_in_one_line():
    e = r.estimate(LLAMA70B, devices.known("l4"), r.Serving(), r.Load(1024, 128, 8))
    assert not e.fits and e.throughput == 0 and e.kv_requests == 0
    assert "of weights a rank leave room for 0 KV tokens on l4" in e.why and "\n" not in e.why
    assert not r.estimate(LLAMA70B, H100, r.Serving(tp=2), r.Load(1024, 128, 8)).fits  # 70.6 GB a rank of 72
    assert r.estimate(LLAMA70B, H100, r.Serving(tp=4), r.Load(1024, 128, 8)).fits


def test_unknown_devices_and_bad_custom_ones_are_one_line():
    assert devices.known(" H200 ").bandwidth_gbs == 4800
    with pytest.raises(ConfigError, match=r"unknown device 'h300'; known: a100, h100, h200, b200, l40s, l4, a10, mi300x"):
        devices.known("h300")
    with pytest.raises(ConfigError, match="whatif.devices.x: give bandwidth_gbs, bf16_tflops"):
        devices.custom("x", {"memory_gb": 24})
    with pytest.raises(ConfigError, match="whatif.devices.x: bandwidth_gbs is -1; give a number above 0"):
        devices.custom("x", {"memory_gb": 24, "bandwidth_gbs": -1, "bf16_tflops": 100})
    mine = devices.custom("My-Card", {"memory_gb": 32, "bandwidth_gbs": 1000, "bf16_tflops": 200})
    assert (mine.name, mine.link_gbs, mine.fp8_tflops) == ("my-card", 64.0, None)
