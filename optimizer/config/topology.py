"""A trial's topology: the vLLM ranks its parallel sizes start, the devices they take, and how
each rank gets its own cores on a CPU node.

A server with `tensor-parallel-size` T, `pipeline-parallel-size` P and `data-parallel-size` D
runs T x P x D ranks (workers). On GPU each rank holds one GPU; on CPU each rank is bound to
cores of its own (engine/cpu_cores.py). Tensor and pipeline parallelism run their ranks as
processes (`--distributed-executor-backend mp`): vLLM's default Ray backend does not work
inside the trial's own Ray task. vLLM refuses a tensor-parallel size that does not divide the
attention heads, and one that neither divides the KV heads nor is a multiple of them.
"""

from __future__ import annotations

import math
import os

from optimizer.errors import ConfigError

PARALLEL = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")
SHORT = {"tensor-parallel-size": "TP", "pipeline-parallel-size": "PP", "data-parallel-size": "DP"}


def sizes(params: dict) -> dict[str, int]:
    """Each parallel size of `params` (vLLM flag names), 1 where absent."""
    return {name: max(1, int(params.get(name) or 1)) for name in PARALLEL}


def ranks(params: dict) -> int:
    """How many ranks (GPUs on GPU, core groups on CPU) one server with `params` runs."""
    return math.prod(sizes(params).values())


def needs_processes(params: dict) -> bool:
    """Whether the server's workers are split by tensor or pipeline parallelism."""
    s = sizes(params)
    return s["tensor-parallel-size"] * s["pipeline-parallel-size"] > 1


def label(params: dict) -> str:
    """'TP 2 x DP 2', or '1 engine' when every size is 1."""
    parts = [f"{SHORT[name]} {n}" for name, n in sizes(params).items() if n > 1]
    return " x ".join(parts) or "1 engine"


def powers_of_two(up_to: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `up_to` (just 1 when fewer than 2)."""
    out = [1]
    while out[-1] * 2 <= up_to:
        out.append(out[-1] * 2)
    return tuple(out)


def default_sizes(device, model=None) -> tuple[int, ...]:
    """A parallel knob's default choices: powers of two up to the GPUs (`device` a GPU) or the cores
    this process may use (CPU); for tensor parallelism (`model` given), those its heads allow."""
    sizes = powers_of_two(device.count if device.kind == "gpu" else len(os.sched_getaffinity(0)))
    return tuple(n for n in sizes if model is None or tp_fits_heads(n, model.heads, model.kv_heads))


def tp_fits_heads(tp: int, heads: int, kv_heads: int) -> bool:
    """Whether vLLM accepts `tp` for a model with these heads (0: unknown, accepted)."""
    if heads and heads % tp:
        return False
    return not kv_heads or kv_heads % tp == 0 or tp % kv_heads == 0


def check_tp(where: str, tp: int, heads: int, kv_heads: int) -> None:
    """Refuse a tensor-parallel size vLLM would refuse at start, naming the sizes it takes."""
    if tp < 1:
        raise ConfigError(f"{where}: {tp} is not a tensor-parallel size; use 1 or more")
    if not tp_fits_heads(tp, heads, kv_heads):
        good = [n for n in powers_of_two(max(heads, 1)) if tp_fits_heads(n, heads, kv_heads)]
        raise ConfigError(f"{where}: {tp} does not divide the model's {heads} attention heads ({kv_heads} KV "
                          f"heads); vLLM refuses it at start: use one of {', '.join(map(str, good))}")


def check_size(where: str, value, name: str, model) -> int:
    """A parallel size from the config: a whole number >= 1, and for tensor parallelism one the
    model's heads allow; returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {value!r} is not a {name}; give a whole number >= 1 (1: none)")
    if name == "tensor-parallel-size":
        check_tp(where, value, model.heads, model.kv_heads)
    return value
