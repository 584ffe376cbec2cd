"""The twin of a server on a GPU the operator does not own: vLLM's scheduler with that GPU's
defaults, a KV pool sized from the device's memory, and the roofline's step cost.

vLLM picks its scheduler defaults by device (`EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`,
for the OpenAI server): 1,024 sequences and a 16,384-token budget on a device of 160 GB or more;
1,024 and 8,192 on one of 70 GB or more that is not an A100; 256 and 2,048 elsewhere; blocks of 16
tokens. The twin runs on this machine, whose platform would pick its own, so these are given as
flags; a configuration's own max-num-seqs, budget and KV dtype replace them.

The pool is the roofline's KV capacity at the memory fraction (whatif/roofline.py), in 16-token
blocks. The step cost is aiconfigurator-core's per-operation timings where the library has the
device and can build the model (twin/gpu/library_cost.py), else the roofline's (twin/gpu/roofline_cost.py);
`gpu_twin` says which, and why the library did not answer.
"""

from __future__ import annotations

import math

from optimizer.config import kv_fit
from optimizer.config.model_info import ModelInfo
from optimizer.twin import vllm_scheduler
from optimizer.twin.kv_pool import Pool
from optimizer.twin.gpu.library_cost import library_step_cost
from optimizer.twin.gpu.roofline_cost import RooflineStepCost
from optimizer.twin.server import TwinServer
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.roofline import Serving, kv_capacity_tokens

GPU_BLOCK = 16
GIB = 1 << 30


def vllm_gpu_defaults(device: DeviceSpec) -> tuple[int, int]:
    """(max-num-seqs, max-num-batched-tokens) vLLM's OpenAI server picks on `device`."""
    memory = device.memory_bytes
    if memory >= 160 * GIB:
        return 1024, 16384
    if memory >= 70 * GIB and "a100" not in device.name.lower():
        return 1024, 8192
    return 256, 2048


def gpu_twin(model: ModelInfo, arch: Architecture, device: DeviceSpec, params: dict,
             max_model_len: int, use_library: bool = True, log_text: str = "") -> tuple[TwinServer, object, str]:
    """A twin of `params` (knob -> value) on `device`, its step cost, and why the library's per-operation
    timings do not answer ("" when they do). `log_text`, a real server's log on that device, sizes the
    pool from its KV line instead of the roofline."""
    seqs, budget = vllm_gpu_defaults(device)
    seqs = int(params.get("max-num-seqs") or seqs)
    budget = int(params.get("max-num-batched-tokens") or budget)
    kv_dtype = str(params.get("kv-cache-dtype") or "auto")
    tp = int(params.get("tensor-parallel-size") or 1)
    util = float(params.get("gpu-memory-utilization") or 0.9)
    args = ["--block-size", str(GPU_BLOCK), "--max-num-seqs", str(seqs), "--max-num-batched-tokens",
            str(max(budget, 1)), "--max-model-len", str(max_model_len), "--kv-cache-dtype", kv_dtype,
            "--enable-chunked-prefill",
            "--enable-prefix-caching" if params.get("enable-prefix-caching", True) else "--no-enable-prefix-caching"]
    config = vllm_scheduler.engine_config(model.source, args)
    serving = Serving(tp, seqs, util, kv_dtype)
    pool = _pool(arch, device, serving, log_text)
    cost = library_step_cost(model.source, arch, device, serving) if use_library else "the roofline was asked for"
    if isinstance(cost, str):
        return TwinServer(model, config, pool), RooflineStepCost(arch, device, serving), cost
    return TwinServer(model, config, pool), cost, ""


def _pool(arch: Architecture, device: DeviceSpec, serving: Serving, log_text: str) -> Pool:
    """The server's own KV line when a log is given, else the roofline's capacity at the memory fraction."""
    found = kv_fit.parse_kv_cache_tokens(log_text) if log_text else None
    if found:
        return Pool(math.ceil(found / GPU_BLOCK), GPU_BLOCK, f"the server's log: KV cache size {found:,} tokens")
    tokens = kv_capacity_tokens(arch, device, serving)
    return Pool(tokens // GPU_BLOCK, GPU_BLOCK, f"{device.name} {device.memory_gb:g} GB x {serving.utilization:g} "
                                                f"- weights - runtime: {tokens:,} tokens (roofline)")
