"""Arrival processes: intended send offsets (seconds from the phase start), precomputed.

Poisson gaps are exponential (vLLM's benchmark with burstiness 1); constant gaps are
1/rate; a closed loop sends everything at offset 0 and a semaphore keeps `concurrency`
requests in flight.
"""

from __future__ import annotations

import random


def offsets(process: str, n: int, rate: float | None, rng: random.Random) -> list[float]:
    if process == "closed":
        return [0.0] * n
    if process == "constant":
        return [i / rate for i in range(n)]
    if process == "poisson":
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    raise ValueError(f"unknown arrival process {process!r}")
