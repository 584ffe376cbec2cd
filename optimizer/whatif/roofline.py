"""A first-principles estimate of one vLLM replica on a device it never ran on: whether the model
fits, its KV capacity, TTFT, TPOT and output throughput at a given load.

Per rank of `tp` (tensor parallel splits weights and KV heads; vLLM replicates KV heads when
there are fewer than ranks), with the model's shape from whatif/architecture.py:

- KV capacity: memory x utilization - weights / tp - the runtime's own (the GPU prior of
  config/kv_fit.py: max(1 GiB, 2% of the device)), over the KV bytes of a token on a rank;
- prefill of one prompt of n tokens: its FLOPs (at mean context n / 2) over the dense peak
  (bf16, or fp8 with fp8 weights) x `compute`, or the weights read once over the bandwidth x
  `bandwidth`, whichever is longer; plus `layer_s` a layer and the all-reduces;
- a decode step of b sequences at context c: the larger of the bytes read (the weights the
  step touches: a mixture of experts reads the experts its tokens route to; + b x c x KV per
  token) over bandwidth x `bandwidth` and the FLOPs over the peak x `compute`, plus `layer_s` a
  layer (kernel launches, the scheduler) and the all-reduces;
- all-reduce (tp > 1): two a layer, ring: 2 (tp - 1) / tp x tokens x hidden x 2 bytes over one
  direction of the link (half the datasheet's figure), plus `allreduce_s` each.

Two loads, the two ways published benchmarks drive vLLM: closed (`concurrency` requests in
flight, benchmark tools' --max-concurrency) and burst (`concurrency` requests sent at once, their
default without a rate). Both run in waves of b = min(concurrency, max-num-seqs, the whole
requests the KV cache holds): a wave takes b prefills and osl decode steps (at context isl +
osl / 2), and
- TTFT = `request_s` + the mean wait for a wave to start ((waves - 1) / 2 waves) + the request's
  own prefill behind q x (b - 1) / 2 of the others (its mean place among the wave's prefills; q =
  1 in a burst, where all were sent together, the fitted `queued` in a closed loop, where they
  drift apart) + one step;
- TPOT = one step + the prefills still behind the request after its first token, half the
  wave's, spread over its osl tokens: step + (b - 1) / 2 x prefill / osl (a mean request's);
- throughput = requests x osl over the waves' time (the aggregate, which is not b / TPOT: the
  prefills take time no request's TPOT counts).

A prompt's prefill computes logits for its last token only (the LM head's FLOPs once).

`FITTED` holds efficiencies fitted on published measurements (bench/whatif_fit.py prints them
and the rows they rest on; docs/what-if.md); `PLAIN` is the roofline as llm-optimizer computes
it (100% of the datasheet's bandwidth and FLOPs, no overheads), kept for comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.config.kv_fit import GPU_NON_KV_MIN, GPU_NON_KV_SHARE
from optimizer.errors import ConfigError
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec

ACTIVATION_BYTES = 2  # all-reduced activations are bf16


@dataclass(frozen=True)
class Efficiency:
    bandwidth: float  # share of the datasheet's memory bandwidth a step gets
    compute: float  # share of the dense peak a large matmul gets
    layer_s: float  # per layer and forward step: launches, scheduling
    allreduce_s: float  # per all-reduce, beyond its bytes
    queued: float = 1.0  # share of the batch's other prompts a prompt's prefill waits behind (1: all at once)
    request_s: float = 0.0  # per request before its first token: HTTP, tokenizing, scheduling


# bench/whatif_fit.py on the 29 rows of bench/data/published_vllm.csv measured by aiconfigurator's
# authors (H100, H200, B200; Llama-3.1-8B fp8 and 70B, Qwen3-32B, three mixtures of experts), within
# what kernels reach (bandwidth <= 0.9, compute <= 0.8): median |error| 11% on TTFT and TPOT, 2026-12-04.
FITTED = Efficiency(bandwidth=0.9, compute=0.8, layer_s=60e-6, allreduce_s=10e-6, queued=0.2, request_s=0.04)
PLAIN = Efficiency(bandwidth=1.0, compute=1.0, layer_s=0.0, allreduce_s=0.0, queued=1.0, request_s=0.0)


@dataclass(frozen=True)
class Serving:
    """How the replica is run."""

    tp: int = 1
    max_num_seqs: int = 256  # vLLM's default on GPU
    utilization: float = 0.9
    kv_dtype: str = "auto"  # "auto" follows the activations; "fp8" halves a bf16 cache


@dataclass(frozen=True)
class Load:
    isl: int  # prompt tokens a request
    osl: int  # output tokens a request
    concurrency: int  # requests in flight (closed) or sent at once (burst)
    burst: bool = False


@dataclass(frozen=True)
class Estimate:
    fits: bool  # the weights fit and the KV cache holds one whole request
    kv_tokens: int  # KV cache capacity, tokens
    kv_requests: int  # whole requests (isl + osl) it holds at once
    batch: int  # sequences decoded together at this load
    ttft_s: float
    tpot_s: float
    throughput: float  # output tokens/s of the replica
    why: str = ""  # when it does not fit: why, one line


def kv_bytes_per_token(arch: Architecture, s: Serving) -> float:
    """KV bytes one token takes on one rank."""
    return arch.kv_bytes_per_token(s.kv_dtype) * max(1, arch.kv_heads // s.tp) / arch.kv_heads


def peak_flops(device: DeviceSpec, arch: Architecture, eff: Efficiency) -> float:
    fp8 = arch.fp8_weights and device.fp8_tflops
    return (device.fp8_tflops if fp8 else device.bf16_tflops) * 1e12 * eff.compute


def allreduce_time(arch: Architecture, device: DeviceSpec, tokens: float, tp: int, eff: Efficiency) -> float:
    if tp <= 1:
        return 0.0
    per = 2 * (tp - 1) / tp * tokens * arch.hidden * ACTIVATION_BYTES / (device.link_gbs * 1e9 / 2)
    return 2 * arch.layers * (per + eff.allreduce_s)


def prefill_s(arch: Architecture, device: DeviceSpec, s: Serving, tokens: int, eff: Efficiency = FITTED) -> float:
    """One prompt of `tokens` alone."""
    flops = (tokens - 1) * arch.flops_per_token(tokens / 2, logits=False) + arch.flops_per_token(tokens / 2)
    compute = flops / s.tp / peak_flops(device, arch, eff)  # logits for the last token only
    read = arch.bytes_read(tokens) / s.tp / (device.bandwidth_gbs * 1e9 * eff.bandwidth)
    return max(compute, read) + allreduce_time(arch, device, tokens, s.tp, eff) + arch.layers * eff.layer_s


def decode_step_s(arch: Architecture, device: DeviceSpec, s: Serving, batch: int, context: float,
                  eff: Efficiency = FITTED) -> float:
    """One decode step of `batch` sequences at `context` tokens each."""
    read = arch.bytes_read(batch) / s.tp + batch * context * kv_bytes_per_token(arch, s)
    memory = read / (device.bandwidth_gbs * 1e9 * eff.bandwidth)
    compute = batch * arch.flops_per_token(context) / s.tp / peak_flops(device, arch, eff)
    return max(memory, compute) + arch.layers * eff.layer_s + allreduce_time(arch, device, batch, s.tp, eff)


def kv_capacity_tokens(arch: Architecture, device: DeviceSpec, s: Serving) -> int:
    runtime = max(GPU_NON_KV_MIN, GPU_NON_KV_SHARE * device.memory_bytes)
    budget = device.memory_bytes * s.utilization - arch.weight_bytes / s.tp - runtime
    return max(0, int(budget // kv_bytes_per_token(arch, s)))


def estimate(arch: Architecture, device: DeviceSpec, s: Serving, load: Load, eff: Efficiency = FITTED) -> Estimate:
    """The replica at this load (see the module docstring for every term)."""
    if s.tp < 1 or load.isl < 1 or load.osl < 1 or load.concurrency < 1:
        raise ConfigError("what-if: tp, prompt and output tokens and concurrency must be at least 1")
    per_request = load.isl + load.osl
    tokens = kv_capacity_tokens(arch, device, s)
    held = tokens // per_request
    if held < 1:
        weights = arch.weight_bytes / s.tp / 1e9
        why = (f"{weights:.1f} GB of weights a rank leave room for {tokens:,} KV tokens on {device.name} "
               f"({device.memory_gb:g} GB x {s.utilization:g}); one request needs {per_request:,}")
        return Estimate(False, tokens, 0, 0, math.inf, math.inf, 0.0, why)
    batch = min(load.concurrency, s.max_num_seqs, held)
    step = decode_step_s(arch, device, s, batch, load.isl + load.osl / 2, eff)
    prefill = prefill_s(arch, device, s, load.isl, eff)
    waves = math.ceil(load.concurrency / batch)
    wave = batch * prefill + load.osl * step
    # the mean wait for a wave to start, its own prefill behind a share of the others', and one step
    queued = 1.0 if load.burst else eff.queued  # sent at once, every prompt is there to wait behind
    ttft = eff.request_s + (waves - 1) / 2 * wave + (1 + queued * (batch - 1) / 2) * prefill + step
    # after its first token a request still shares the steps with the prefills behind it (half the wave's)
    tpot = step + (batch - 1) / 2 * prefill / load.osl
    return Estimate(True, tokens, held, batch, ttft, tpot, load.concurrency * load.osl / (waves * wave))
