"""Values an operator writes: a sampled memory fraction to two decimals, a sampled max-model-len up
to a multiple of the KV block size, and the smallest round max-model-len that fits a workload.

A trial runs with the rounded value (its flags say so); Optuna keeps the value it drew, so the
sampler's model is untouched. Rounding never leaves the dimension's range: a fraction rounded
below the range's low end (which leaves room for one longest request) goes up instead.
"""

from __future__ import annotations

import math

# vLLM's default KV block size when the study does not tune `block-size` (vllm/platforms/cpu.py
# sets 128 on CPU; CUDA's default is 16).
DEFAULT_BLOCK = {"cpu": 128, "gpu": 16}


def round_fraction(value: float, low: float, high: float) -> float:
    """`value` to two decimals, kept within [low, high] (left as drawn when no two-decimal value fits)."""
    rounded = round(value, 2)
    if rounded < low:
        rounded = math.ceil(low * 100 - 1e-9) / 100
    elif rounded > high:
        rounded = math.floor(high * 100 + 1e-9) / 100
    return rounded if low <= rounded <= high else value


def round_model_len(value: int, block: int, high: float) -> int:
    """`value` up to a multiple of `block`; `value` itself when that would pass `high` (the model's limit)."""
    rounded = -(-int(value) // block) * block
    return rounded if rounded <= high else int(value)


def fitting_model_len(longest: int, block: int, max_positions: int) -> int:
    """The smallest round max-model-len that holds `longest` tokens: a power of two when the model
    allows it, else a multiple of the block size (never above the model's limit)."""
    power = 1 << max(0, math.ceil(math.log2(max(1, longest))))
    if power <= max_positions:
        return max(power, block) if block <= max_positions else power
    return round_model_len(longest, block, max_positions)


def round_draw(name: str, value, low: float | None, high: float | None, block: int):
    """A sampled value as the trial runs it (see the module docstring); other knobs are unchanged."""
    if name == "gpu-memory-utilization" and low is not None and high is not None:
        return round_fraction(float(value), low, high)
    if name == "max-model-len" and high is not None:
        return round_model_len(int(value), block, high)
    return value
