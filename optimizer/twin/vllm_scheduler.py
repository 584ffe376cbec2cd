"""vLLM's own v1 scheduler, built from a server's flags with vLLM's own parser and config classes,
and no model, weights or engine process.

The flags go through `AsyncEngineArgs`'s argument parser and `create_engine_config`, exactly as
`vllm serve` reads them: the same defaults (per platform: on CPU a block size of 128 and a token
budget of 2,048), the same validation, and the same message when vLLM refuses a combination. The
KV pool is handed in as a block count (twin/kv_pool.py sizes it as the server would); one of its
blocks is vLLM's null block, as on the server.

With prefix caching on, every request needs vLLM's block hasher (`requests_for`): without it the
cache cannot hash full blocks.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from dataclasses import dataclass

from optimizer.errors import ConfigError, first_line

# Flags the scheduler never reads, which the twin drops before vLLM parses the rest: the server's
# address, its API key, the load format (no weights are loaded) and the tokenizer.
_DROPPED = {"--host": 1, "--port": 1, "--api-key": 1, "--load-format": 1, "--served-model-name": 1,
            "--uvicorn-log-level": 1, "--disable-log-requests": 0, "--disable-uvicorn-access-log": 0}


@dataclass(frozen=True)
class SchedulerShape:
    """What the twin reads back from vLLM's resolved config (for its report and its KV sizing)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    kv_cache_dtype: str
    prefix_caching: bool
    chunked_prefill: bool
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float
    tensor_parallel_size: int


def _quiet():
    """vLLM logs its resolved config on every build (the twin builds one per simulation), and warns of
    choices that only matter to a real server here (a GPU's block size on this CPU platform)."""
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return contextlib.redirect_stdout(io.StringIO())


def _kept(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        key = args[i].split("=", 1)[0]
        if key in _DROPPED:
            i += 1 + (_DROPPED[key] if "=" not in args[i] else 0)
            continue
        out.append(args[i])
        i += 1
    return out


@functools.lru_cache(maxsize=1)
def _parser():
    """vLLM's own `vllm serve` engine flags, with a refusal raised as ConfigError instead of usage and exit 2."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class TwinParser(FlexibleArgumentParser):
        def error(self, message: str):
            raise ConfigError(f"vLLM refuses the flags: {message}")

    return AsyncEngineArgs.add_cli_args(TwinParser(prog="vllm serve"))


def engine_config(model_dir: str, args: list[str]):
    """vLLM's VllmConfig for `vllm serve model_dir *args`; ConfigError with vLLM's own message if it refuses."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    with _quiet():
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        ns = _parser().parse_args(["--model", model_dir, "--skip-tokenizer-init", *_kept(args)])
        try:
            return AsyncEngineArgs.from_cli_args(ns).create_engine_config(UsageContext.OPENAI_API_SERVER)
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise ConfigError(f"vLLM refuses the flags: {_validation_text(exc)}") from exc


def _validation_text(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}".lstrip(": ")
                             for e in errors()) or first_line(exc)
        except Exception:  # noqa: BLE001 - any shape: fall back to the message
            pass
    return first_line(exc, 400)


def shape_of(config) -> SchedulerShape:
    s, c = config.scheduler_config, config.cache_config
    return SchedulerShape(
        max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=config.model_config.max_model_len, block_size=c.block_size,
        kv_cache_dtype=str(c.cache_dtype), prefix_caching=bool(c.enable_prefix_caching),
        chunked_prefill=bool(s.enable_chunked_prefill), kv_cache_memory_bytes=c.kv_cache_memory_bytes,
        gpu_memory_utilization=float(c.gpu_memory_utilization),
        tensor_parallel_size=config.parallel_config.tensor_parallel_size)


def build_scheduler(config, num_blocks: int, num_kv_heads: int, head_size: int, layers: int):
    """A vLLM Scheduler over a KV pool of `num_blocks` blocks (the null block included)."""
    import torch
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.utils.hashing import sha256

    if num_blocks < 2:
        raise ConfigError(f"the KV pool holds {num_blocks} block(s) of {config.cache_config.block_size} tokens: "
                          "vLLM would not start; give the server more KV memory")
    block = config.cache_config.block_size
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block, num_kv_heads=num_kv_heads, head_size=head_size, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.self_attn" for i in range(layers)], spec)])
    init_none_hash(sha256)
    with _quiet():
        return Scheduler(config, kv, StructuredOutputManager(config), block_size=block, log_stats=True)


def block_hasher(block_size: int):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    return get_request_block_hasher(block_size, sha256)


def new_request(request_id: str, prompt: list[int], max_tokens: int, arrival_s: float, hasher):
    """A vLLM Request that generates exactly `max_tokens` tokens (ignore_eos, as the replayer sends it)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return Request(request_id, prompt, params, None, arrival_time=arrival_s, block_hasher=hasher)
