"""The tiny model's memory for tests and benches: the memory fraction that gives it a KV cache of a chosen size.
"""

from __future__ import annotations

from optimizer.engine.tiny_model import NON_KV_GIB


def memory_fraction(kv_gib: float, total_bytes: int | None = None) -> float:
    """The gpu-memory-utilization that leaves this model `kv_gib` of KV cache on this CPU, from NUMA
    node 0's size now (it changes over time on some machines: never hard-code a fraction)."""
    from optimizer.engine.device import GIB, read_node_memory  # noqa: PLC0415

    total = total_bytes if total_bytes is not None else read_node_memory().total
    return round((NON_KV_GIB + kv_gib) * GIB / total, 3)
