"""Values an operator writes: a sampled memory fraction to two decimals, a sampled max-model-len up
to a multiple of the KV block size, the smallest round max-model-len that fits a workload, and the
knobs that enter vLLM's compile key (max-num-seqs, max-num-batched-tokens) on a ladder of
operator-style values.

Ladders: vLLM's compile cache is keyed by max-num-seqs and max-num-batched-tokens (with the KV
dtype and block size, already few choices), so every distinct value drawn compiles from scratch.
A laddered knob is still drawn on its log scale, so the sampler sees its order and distances,
and the trial runs the rung nearest the draw (in log space) within the range: few distinct
compiles, and values an operator would write. A range holding no rung is left free.

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


LADDERS = {
    "max-num-seqs": (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024),
    "max-num-batched-tokens": (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 65536),
}


def rungs(name: str, low: float, high: float) -> tuple[int, ...]:
    """The ladder's values within [low, high] (none when `name` has no ladder)."""
    return tuple(v for v in LADDERS.get(name, ()) if low <= v <= high)


def snap_to_ladder(name: str, value: float, low: float, high: float) -> int:
    """The rung nearest `value` in log space within [low, high]; `value` itself when none is there."""
    within = rungs(name, low, high)
    if not within or value <= 0:
        return int(value)
    return min(within, key=lambda v: (abs(math.log(v / value)), v))


def round_draw(name: str, value, low: float | None, high: float | None, block: int, ladder: bool = False):
    """A sampled value as the trial runs it (see the module docstring); other knobs are unchanged."""
    if ladder and low is not None and high is not None and name in LADDERS:
        return snap_to_ladder(name, value, low, high)
    if name == "gpu-memory-utilization" and low is not None and high is not None:
        return round_fraction(float(value), low, high)
    if name == "max-model-len" and high is not None:
        return round_model_len(int(value), block, high)
    return value
