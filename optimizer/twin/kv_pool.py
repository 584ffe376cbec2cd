"""How many KV blocks the twin's scheduler gets: the pool the real server would allocate.

In order of trust:
1. the server's own log line ("CPU KV cache size: N tokens", one per start-up), inverted to
   blocks as config/kv_fit.py does (exact to a block);
2. `--kv-cache-memory-bytes`: vLLM gives the cache exactly that many bytes per rank, so
   blocks = bytes // (block size x KV bytes per token of the rank's layers and heads);
3. the memory fraction: config/kv_fit.py's estimate of the KV budget (node or GPU memory x
   `--gpu-memory-utilization` - the non-KV memory, calibrated from a start-up when the study
   has one).

The count includes vLLM's null block, as the server's own `num_blocks` does. `shared_tokens` reads
how much of a step's context its requests share in the pool, for the step cost (twin/step_cost.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.config import kv_fit
from optimizer.config.model_info import ModelInfo
from optimizer.engine.device import Device
from optimizer.twin.vllm_scheduler import SchedulerShape


@dataclass(frozen=True)
class Pool:
    blocks: int  # null block included
    block_size: int
    basis: str  # where the number came from, one line

    @property
    def usable_tokens(self) -> int:
        return max(0, self.blocks - 1) * self.block_size


def bytes_per_token(model: ModelInfo, shape: SchedulerShape) -> int:
    """KV bytes one token takes on one rank (K and V, every layer, the rank's share of the KV heads)."""
    heads = max(1, model.kv_heads // max(1, shape.tensor_parallel_size))
    return model.kv_bytes_per_token(shape.kv_cache_dtype) * heads // model.kv_heads


def size_pool(model: ModelInfo, shape: SchedulerShape, device: Device | None = None, log_text: str = "",
              calibration: kv_fit.Calibration | None = None) -> Pool:
    block_bytes = shape.block_size * bytes_per_token(model, shape)
    found = kv_fit.parse_kv_cache_tokens(log_text) if log_text else None
    if found:
        per_request = math.ceil(shape.max_model_len / shape.block_size)
        blocks = math.ceil(found * per_request / shape.max_model_len - 1e-9)
        return Pool(blocks, shape.block_size, f"the server's log: KV cache size {found:,} tokens")
    if shape.kv_cache_memory_bytes:
        return Pool(shape.kv_cache_memory_bytes // block_bytes, shape.block_size,
                    f"--kv-cache-memory-bytes {shape.kv_cache_memory_bytes:,} / {block_bytes:,} bytes a block")
    if device is None:
        raise ValueError("sizing the KV pool from the memory fraction needs the device")
    params = {"gpu-memory-utilization": shape.gpu_memory_utilization, "max-model-len": shape.max_model_len,
              "kv-cache-dtype": shape.kv_cache_dtype, "block-size": shape.block_size,
              "tensor-parallel-size": shape.tensor_parallel_size}
    est = kv_fit.estimate(model, device, params, calibration)
    return Pool(max(0, est.budget_bytes) // block_bytes, shape.block_size,
                f"estimated: {est.budget_bytes / 2**30:.2f} GiB of KV ({'calibrated' if est.calibrated else 'prior'})")


def shared_tokens(scheduler, request_ids) -> int:
    """Tokens of these requests' contexts held in blocks another of them holds too (prefix-cache
    sharing: only full blocks are shared), each extra holder's copy counted once. A decode step's
    context minus this is the KV it streams from memory: each shared block once. Without prefix
    caching no block is shared: 0, without reading a block table (this runs once a simulated step)."""
    if not scheduler.cache_config.enable_prefix_caching:
        return 0
    blocks_of = scheduler.kv_cache_manager.coordinator.get_blocks
    seen: set = set()
    repeats = 0
    for rid in request_ids:
        for group in blocks_of(rid):
            for block in group:
                if block.block_id in seen:
                    repeats += 1
                else:
                    seen.add(block.block_id)
    return repeats * scheduler.cache_config.block_size
