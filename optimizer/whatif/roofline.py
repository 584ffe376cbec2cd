"""A first-principles estimate of one vLLM replica on a device it never ran on: whether the model
fits, its KV capacity, TTFT, TPOT and output throughput at a given load.

Per rank of `tp` (tensor parallel splits weights and KV heads; vLLM replicates KV heads when
there are fewer than ranks):

- weights: `ModelInfo.weight_bytes()` at the serving dtype (fp8: 1 byte a weight), / tp;
- KV per token: `ModelInfo.kv_bytes_per_token(kv dtype)` x max(1, kv_heads // tp) / kv_heads;
- KV capacity: memory x utilization - weights - the runtime's own (the GPU prior of
  config/kv_fit.py: max(1 GiB, 2% of the device)), over the KV per token;
- forward FLOPs per token at context c: 2 x the weights' parameters (the embedding table is a
  lookup, the LM head a matmul: counted once) + 4 x layers x hidden x c (attention scores and
  values), / tp;
- prefill of n tokens: n tokens' FLOPs at mean context n / 2 over the dense peak (bf16, or fp8
  with fp8 weights) x COMPUTE_EFFICIENCY, the weights read once, plus its all-reduces;
- a decode step of b sequences at context c: the larger of the bytes read (weights + b x c x KV
  per token) over bandwidth x BANDWIDTH_EFFICIENCY and the FLOPs over the peak x
  COMPUTE_EFFICIENCY, plus LAYER_OVERHEAD_S a layer (kernel launches and the scheduler);
- all-reduce (tp > 1): two a layer, ring: 2 (tp - 1) / tp x tokens x hidden x 2 bytes over one
  direction of the link (half the datasheet's figure), plus ALLREDUCE_LATENCY_S each.

Serving `concurrency` requests of `isl` prompt and `osl` output tokens in a closed loop with
continuous batching: the batch b is the concurrency, capped by max-num-seqs and by how many
whole requests the KV cache holds; TTFT = prefill(isl) + one decode step (a prompt waits for
the step in flight); TPOT = step(b at context isl + osl / 2) + b x prefill compute(isl) / osl
(each step also carries a share of the prompts that join the batch); throughput = b / TPOT.

The efficiency constants are provisional round numbers, not yet fitted on published
measurements, and nothing here is calibrated on a study's runs: the estimate's error is unknown
until it is (so no band is printed from this module alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.config.kv_fit import GPU_NON_KV_MIN, GPU_NON_KV_SHARE
from optimizer.config.model_info import ModelInfo
from optimizer.errors import ConfigError
from optimizer.whatif.devices import DeviceSpec

BANDWIDTH_EFFICIENCY = 0.8  # provisional: share of the datasheet's memory bandwidth a decode step gets
COMPUTE_EFFICIENCY = 0.6  # provisional: share of the dense peak a large matmul gets
LAYER_OVERHEAD_S = 15e-6  # provisional: per layer and step, launches and scheduling
ALLREDUCE_LATENCY_S = 8e-6  # provisional: per all-reduce, beyond its bytes
ACTIVATION_BYTES = 2  # all-reduced activations are bf16


@dataclass(frozen=True)
class Serving:
    """How the replica is run."""

    tp: int = 1
    max_num_seqs: int = 256  # vLLM's default on GPU
    utilization: float = 0.9
    weight_dtype: str = "bfloat16"  # "fp8" for fp8 weights
    kv_dtype: str = "auto"  # "auto" follows the weights; "fp8" halves a bf16 cache


@dataclass(frozen=True)
class Load:
    isl: int  # prompt tokens a request
    osl: int  # output tokens a request
    concurrency: int  # requests in flight


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


def _params(model: ModelInfo) -> float:
    """Parameters the forward pass multiplies with (ModelInfo's weight count, dtype aside)."""
    return model.weight_bytes() / _width(model.dtype)


def _width(dtype: str) -> int:
    return 4 if dtype == "float32" else 1 if dtype.startswith("fp8") else 2


def _weights_per_rank(model: ModelInfo, s: Serving) -> float:
    return _params(model) * _width(s.weight_dtype) / s.tp


def kv_bytes_per_token(model: ModelInfo, s: Serving) -> float:
    """KV bytes one token takes on one rank."""
    kv = "fp8" if s.kv_dtype.startswith("fp8") else s.weight_dtype if s.weight_dtype != "fp8" else "bfloat16"
    full = 2 * model.layers * model.kv_heads * model.head_dim * _width(kv)
    return full * max(1, model.kv_heads // s.tp) / model.kv_heads


def _peak(device: DeviceSpec, s: Serving) -> float:
    fp8 = s.weight_dtype.startswith("fp8") and device.fp8_tflops
    return (device.fp8_tflops if fp8 else device.bf16_tflops) * 1e12 * COMPUTE_EFFICIENCY


def _flops(model: ModelInfo, tokens: float, context: float, tp: int) -> float:
    return tokens * (2 * _params(model) + 4 * model.layers * model.hidden * context) / tp


def _allreduce(model: ModelInfo, device: DeviceSpec, tokens: float, tp: int) -> float:
    if tp <= 1:
        return 0.0
    per = 2 * (tp - 1) / tp * tokens * model.hidden * ACTIVATION_BYTES / (device.link_gbs * 1e9 / 2)
    return 2 * model.layers * (per + ALLREDUCE_LATENCY_S)


def prefill_s(model: ModelInfo, device: DeviceSpec, s: Serving, tokens: int) -> float:
    """One prompt of `tokens` alone: its FLOPs at mean context tokens / 2, the weights read once."""
    compute = _flops(model, tokens, tokens / 2, s.tp) / _peak(device, s)
    read = _weights_per_rank(model, s) / (device.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    return max(compute, read) + _allreduce(model, device, tokens, s.tp) + model.layers * LAYER_OVERHEAD_S


def decode_step_s(model: ModelInfo, device: DeviceSpec, s: Serving, batch: int, context: float) -> float:
    """One decode step of `batch` sequences at `context` tokens each."""
    read = _weights_per_rank(model, s) + batch * context * kv_bytes_per_token(model, s)
    memory = read / (device.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    compute = _flops(model, batch, context, s.tp) / _peak(device, s)
    return max(memory, compute) + model.layers * LAYER_OVERHEAD_S + _allreduce(model, device, batch, s.tp)


def kv_capacity_tokens(model: ModelInfo, device: DeviceSpec, s: Serving) -> int:
    runtime = max(GPU_NON_KV_MIN, GPU_NON_KV_SHARE * device.memory_bytes)
    budget = device.memory_bytes * s.utilization - _weights_per_rank(model, s) - runtime
    return max(0, int(budget // kv_bytes_per_token(model, s)))


def estimate(model: ModelInfo, device: DeviceSpec, s: Serving, load: Load) -> Estimate:
    """The replica at this load (see the module docstring for every term)."""
    if s.tp < 1 or load.isl < 1 or load.osl < 1 or load.concurrency < 1:
        raise ConfigError("what-if: tp, prompt and output tokens and concurrency must be at least 1")
    per_request = load.isl + load.osl
    tokens = kv_capacity_tokens(model, device, s)
    held = tokens // per_request
    if held < 1:
        weights = _weights_per_rank(model, s) / 1e9
        why = (f"{weights:.1f} GB of weights a rank leave room for {tokens:,} KV tokens on {device.name} "
               f"({device.memory_gb:g} GB x {s.utilization:g}); one request needs {per_request:,}")
        return Estimate(False, tokens, 0, 0, float("inf"), float("inf"), 0.0, why)
    batch = min(load.concurrency, s.max_num_seqs, held)
    step = decode_step_s(model, device, s, batch, load.isl + load.osl / 2)
    prefill = prefill_s(model, device, s, load.isl)
    ttft = prefill + step
    tpot = step + batch * prefill / load.osl
    return Estimate(True, tokens, held, batch, ttft, tpot, batch / tpot)
