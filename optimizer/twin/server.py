"""A twin of one vLLM server: its flags read by vLLM, its KV pool sized as the server sizes it,
and a fresh copy of vLLM's scheduler for every replay.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from optimizer.config.model_info import ModelInfo
from optimizer.engine.device import Device
from optimizer.twin import vllm_scheduler
from optimizer.twin.kv_pool import Pool, size_pool
from optimizer.twin.simulation import Simulated, simulate
from optimizer.twin.step_cost import StepCost


@dataclass
class TwinServer:
    model: ModelInfo
    config: object  # vLLM's VllmConfig, the flags as `vllm serve` resolves them: read once, every replay's
    pool: Pool

    @classmethod
    def from_flags(cls, model: ModelInfo, args, device: Device | None = None, log_text: str = "",
                   calibration=None) -> "TwinServer":
        """`args` as `vllm serve` takes them (after the model); ConfigError where vLLM refuses them."""
        config = vllm_scheduler.engine_config(model.source, list(args))
        return cls(model, config, size_pool(model, vllm_scheduler.shape_of(config), device, log_text, calibration))

    @functools.cached_property
    def shape(self) -> vllm_scheduler.SchedulerShape:
        return vllm_scheduler.shape_of(self.config)

    def scheduler(self):
        heads = max(1, self.model.kv_heads // max(1, self.shape.tensor_parallel_size))
        return vllm_scheduler.build_scheduler(self.config, self.pool.blocks, heads, self.model.head_dim,
                                              self.model.layers)

    def run(self, requests, concurrency: int | None, cost: StepCost, *, send_times=None,
            keep_steps: bool = False, stretches: bool = True) -> Simulated:
        return simulate(requests, concurrency, self.scheduler(), cost, send_times=send_times, keep_steps=keep_steps,
                        stretches=stretches)

    def describe(self) -> str:
        s = self.shape
        return (f"max-num-seqs {s.max_num_seqs}, token budget {s.max_num_batched_tokens}"
                f"{' (chunked prefill)' if s.chunked_prefill else ''}, max-model-len {s.max_model_len}, "
                f"KV {s.kv_cache_dtype} in {self.pool.blocks} blocks of {s.block_size} ({self.pool.basis}), "
                f"prefix caching {'on' if s.prefix_caching else 'off'}")
