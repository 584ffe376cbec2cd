"""whatif/roofline.py and whatif/devices.py: the roofline's arithmetic on a hand-checked model
(Llama-3.1-8B's shape), and the device table's refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optimizer.errors import ConfigError
from optimizer.whatif import devices
from optimizer.whatif import roofline as r
from optimizer.whatif.architecture import Architecture

# Llama-3.1-8B: 32 layers, 32 heads and 8 KV heads of 128, hidden 4096, MLP 14336, vocabulary 128256.
LLAMA8B = Architecture("llama-8b", 32, 32, 8, 128, 4096, 14336, 128256)
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # q, o; k, v; gate, up, down
READ = (32 * LAYER + 128256 * 4096) * 2  # the layers and the LM head, bf16 (the embedding is a lookup)
LLAMA70B = Architecture("llama-70b", 80, 64, 8, 128, 8192, 28672, 128256)
H100 = devices.known("h100")
EFF = r.Efficiency(bandwidth=0.8, compute=0.5, layer_s=20e-6, allreduce_s=10e-6, queued=0.5, request_s=0.01)


def test_kv_bytes_per_token_split_over_ranks_and_replicated_past_the_kv_heads():
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving()) == 2 * 32 * 8 * 128 * 2 == 131072  # 128 KiB
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(kv_dtype="fp8")) == 65536
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(tp=2)) == 65536
    assert r.kv_bytes_per_token(LLAMA8B, r.Serving(tp=16)) == 131072 / 8  # one head a rank: replicated
    assert r.kv_bytes_per_token(replace(LLAMA8B, quantization="fp8"), r.Serving()) == 131072  # fp8 weights, bf16 cache


def test_a_decode_step_at_batch_one_is_the_weights_read_at_the_derated_bandwidth():
    context_bytes = 1 * 1000 * 131072
    expected = (READ + context_bytes) / (3350e9 * 0.8) + 32 * 20e-6
    assert r.decode_step_s(LLAMA8B, H100, r.Serving(), 1, 1000, EFF) == pytest.approx(expected)
    assert expected == pytest.approx(0.00629, rel=0.01)  # 15.0 GB of weights at 2.68 TB/s, + 0.64 ms of layers


def test_a_large_batch_becomes_compute_bound_and_tp_adds_its_all_reduces():
    batch, context = 4096, 100
    flops = batch * (2 * (32 * LAYER + 128256 * 4096) + 4 * 32 * 32 * 128 * context)
    compute = flops / (989e12 * 0.5)
    step = r.decode_step_s(LLAMA8B, H100, r.Serving(), batch, context, EFF)
    assert step == pytest.approx(compute + 32 * 20e-6)
    tp2 = r.decode_step_s(LLAMA8B, H100, r.Serving(tp=2), batch, context, EFF)
    ring = 2 * (2 - 1) / 2 * batch * 4096 * 2 / (900e9 / 2)
    assert tp2 == pytest.approx(compute / 2 + 32 * 20e-6 + 2 * 32 * (ring + 10e-6))


def test_fp8_weights_use_the_fp8_peak_where_the_device_has_one():
    fp8 = replace(LLAMA8B, quantization="fp8")
    bf16_s = r.prefill_s(LLAMA8B, H100, r.Serving(), 8192, EFF)
    fp8_s = r.prefill_s(fp8, H100, r.Serving(), 8192, EFF)
    assert fp8_s == pytest.approx((bf16_s - 32 * 20e-6) * 989 / 1979 + 32 * 20e-6)
    a100 = devices.known("a100")  # no fp8 tensor cores: the bf16 peak
    assert r.prefill_s(fp8, a100, r.Serving(), 8192, EFF) == pytest.approx(r.prefill_s(LLAMA8B, a100, r.Serving(), 8192, EFF))


def test_a_closed_load_runs_in_waves_and_queues_a_share_of_the_prefills():
    load = r.Load(isl=1024, osl=128, concurrency=8)
    e = r.estimate(LLAMA8B, H100, r.Serving(), load, EFF)
    assert e.fits and e.batch == 8 and e.kv_requests == e.kv_tokens // 1152
    memory = 80 * 2**30  # an H100's "80GB" is GiB: 81,559 MiB to nvidia-smi
    runtime = max(1 * 1024**3, 0.02 * memory)
    weights = 32 * LAYER * 2 + 2 * 128256 * 4096 * 2
    assert e.kv_tokens == int((memory * 0.9 - weights - runtime) // 131072)
    step = r.decode_step_s(LLAMA8B, H100, r.Serving(), 8, 1024 + 64, EFF)
    prefill = r.prefill_s(LLAMA8B, H100, r.Serving(), 1024, EFF)
    assert e.ttft_s == pytest.approx(0.01 + (1 + 0.5 * 7 / 2) * prefill + step)
    assert e.tpot_s == pytest.approx(step + 7 / 2 * prefill / 128)
    assert e.throughput == pytest.approx(8 * 128 / (8 * prefill + 128 * step))
    capped = r.estimate(LLAMA8B, H100, r.Serving(max_num_seqs=4), load, EFF)  # two waves of four
    assert capped.batch == 4
    wave = 4 * prefill + 128 * r.decode_step_s(LLAMA8B, H100, r.Serving(), 4, 1024 + 64, EFF)
    assert capped.throughput == pytest.approx(8 * 128 / (2 * wave))
    assert capped.ttft_s > wave / 2  # half of them wait for a wave


def test_a_burst_waits_behind_every_prompt_sent_with_it():
    prefill = r.prefill_s(LLAMA8B, H100, r.Serving(), 1024, EFF)
    closed = r.estimate(LLAMA8B, H100, r.Serving(), r.Load(1024, 128, 8), EFF)
    burst = r.estimate(LLAMA8B, H100, r.Serving(), r.Load(1024, 128, 8, burst=True), EFF)
    assert burst.ttft_s - closed.ttft_s == pytest.approx((1 - 0.5) * 7 / 2 * prefill)


def test_a_model_that_does_not_fit_says_why_in_one_line():
    e = r.estimate(LLAMA70B, devices.known("l4"), r.Serving(), r.Load(1024, 128, 8))
    assert not e.fits and e.throughput == 0 and e.kv_requests == 0
    assert "of weights a rank leave room for 0 KV tokens on l4" in e.why and "\n" not in e.why
    assert not r.estimate(LLAMA70B, H100, r.Serving(tp=1), r.Load(1024, 128, 8)).fits  # 141 GB of 77 GiB
    two = r.estimate(LLAMA70B, H100, r.Serving(tp=2), r.Load(1024, 128, 8))  # 70.6 GB a rank of 77.3 GB usable
    assert two.fits and 25_000 < two.kv_tokens < 35_000  # vLLM serves it on two H100s


def test_the_plain_roofline_is_faster_than_the_fitted_one():
    load = r.Load(1024, 128, 8)
    plain = r.estimate(LLAMA8B, H100, r.Serving(), load, r.PLAIN)
    fitted = r.estimate(LLAMA8B, H100, r.Serving(), load, r.FITTED)
    assert plain.tpot_s < fitted.tpot_s and plain.throughput > fitted.throughput


def test_unknown_devices_and_bad_custom_ones_are_one_line():
    assert devices.known(" H200 ").bandwidth_gbs == 4800
    with pytest.raises(ConfigError, match=r"unknown device 'h300'; known: a100, h100, h100-nvl, h200, b200, l40s, "
                                          r"l40, l4, a10, mi300x"):
        devices.known("h300")
    with pytest.raises(ConfigError, match="whatif.devices.x: give bandwidth_gbs, bf16_tflops"):
        devices.custom("x", {"memory_gb": 24})
    with pytest.raises(ConfigError, match="whatif.devices.x: bandwidth_gbs is -1; give a number above 0"):
        devices.custom("x", {"memory_gb": 24, "bandwidth_gbs": -1, "bf16_tflops": 100})
    mine = devices.custom("My-Card", {"memory_gb": 32, "bandwidth_gbs": 1000, "bf16_tflops": 200})
    assert (mine.name, mine.link_gbs, mine.fp8_tflops) == ("my-card", 64.0, None)


@pytest.mark.parametrize("reported, name", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 NVL", "h100-nvl"),
                                            ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s"),
                                            ("NVIDIA L40", "l40"), ("NVIDIA L4", "l4"), ("AMD Instinct MI300X", "mi300x")])
def test_nvidia_smi_names_match_the_table(reported, name):
    assert devices.match(reported).name == name


def test_a_gpu_the_table_lacks_matches_nothing():
    assert devices.match("NVIDIA A10G") is None and devices.match("Tesla T4") is None
