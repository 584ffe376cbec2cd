"""Arrival processes: intended send offsets (seconds from the phase start), precomputed.

Open-loop processes give an absolute schedule, drawn once, the way vLLM's benchmark
(`get_request`) draws it:

    constant   gaps 1/rate
    poisson    gaps ~ Exp(rate)                          (gamma with burstiness 1)
    gamma      gaps ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)):
               burstiness < 1 burstier than Poisson, > 1 more regular
    ramp       the rate moves linearly from `start_rate` to `rate` over the requests,
               gaps gamma at the current rate (vLLM's `--ramp-up-strategy linear`)
    trace      the trace's own timestamps, gaps multiplied by `time_scale`
    spikes     a base rate with periodic spikes (the `burst` scenario), Poisson within each

As vLLM does, constant-rate schedules are rescaled so n requests span exactly n/rate
seconds (a raw sum of random gaps misses it by a few percent and makes trials at the
same rate incomparable). `closed` sends everything at offset 0; a semaphore in the
replayer keeps `concurrency` requests in flight.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def _gamma_gaps(n: int, rates: list[float], burstiness: float, rng: random.Random) -> list[float]:
    if math.isinf(burstiness):
        return [1.0 / r for r in rates]
    return [rng.gammavariate(burstiness, 1.0 / (r * burstiness)) for r in rates]


def _cumulate(gaps: list[float]) -> list[float]:
    out, t = [], 0.0
    for g in gaps:
        t += g
        out.append(t)
    return out


def rate_schedule(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Offsets of `n` requests at a mean `rate` (req/s) with vLLM's gamma gaps, rescaled to n/rate s."""
    offs = _cumulate(_gamma_gaps(n, [rate] * n, burstiness, rng))
    if offs and offs[-1] > 0:
        scale = (n / rate) / offs[-1]
        offs = [o * scale for o in offs]
    return offs


def ramp_schedule(n: int, start_rate: float, end_rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """The rate climbs linearly from `start_rate` to `end_rate` across the n requests (no rescaling)."""
    rates = [start_rate + (end_rate - start_rate) * i / max(n - 1, 1) for i in range(n)]
    return _cumulate(_gamma_gaps(n, rates, burstiness, rng))


def trace_schedule(timestamps: list[float], time_scale: float) -> list[float]:
    """The trace's timestamps, from its first, with every gap multiplied by `time_scale`."""
    if not timestamps:
        return []
    first = min(timestamps)
    return [(t - first) * time_scale for t in timestamps]


@dataclass(frozen=True)
class Spikes:
    """A steady `base_rate` with a spike to `spike_rate` for `duration_s` every `every_s` seconds
    (the first spike starts at `first_s`)."""

    base_rate: float
    spike_rate: float
    every_s: float
    duration_s: float
    first_s: float

    def window(self, t: float) -> tuple[float, float]:
        """The rate at time t and when it next changes (always later than t)."""
        if t < self.first_s:
            return self.base_rate, self.first_s
        start = self.first_s + math.floor((t - self.first_s) / self.every_s) * self.every_s
        if t < start + self.duration_s:
            rate, end = self.spike_rate, start + self.duration_s
        else:
            rate, end = self.base_rate, start + self.every_s
        # Float rounding can put a boundary at t itself (e.g. 5.0 + 2.1): step past it.
        return rate, end if end > t else math.nextafter(t, math.inf)


def spike_schedule(n: int, spikes: Spikes, rng: random.Random) -> list[float]:
    """A Poisson process whose rate follows `spikes`: unit-rate exponential gaps spent against
    the piecewise-constant intensity (exact, no thinning)."""
    out, t = [], 0.0
    for _ in range(n):
        need = rng.expovariate(1.0)
        while True:
            rate, change = spikes.window(t)
            if need <= rate * (change - t):
                t += need / rate
                break
            need -= rate * (change - t)
            t = change
        out.append(t)
    return out


def offsets(arrival, n: int, rng: random.Random, timestamps: list[float] | None = None) -> list[float]:
    """Offsets for `n` requests under an `ArrivalSpec` (timestamps only for process 'trace')."""
    p = arrival.process
    if p == "closed":
        return [0.0] * n
    if p == "constant":
        return [i / arrival.rate for i in range(n)]
    if p == "poisson":
        return rate_schedule(n, arrival.rate, 1.0, rng)
    if p == "gamma":
        return rate_schedule(n, arrival.rate, arrival.burstiness, rng)
    if p == "ramp":
        return ramp_schedule(n, arrival.start_rate, arrival.rate, arrival.burstiness, rng)
    if p == "trace":
        if timestamps is None:
            raise ValueError("arrival process 'trace' needs a trace with timestamps")
        return trace_schedule(timestamps, arrival.time_scale)
    raise ValueError(f"unknown arrival process {p!r}")


def closed_concurrency(arrival) -> int | None:
    """Requests in flight for a closed loop; None for an open-loop schedule."""
    return arrival.concurrency if arrival.process == "closed" else None


def describe_arrival(a) -> str:
    """One phrase for the study's workload description."""
    if a.process == "closed":
        return f"closed loop, {a.concurrency} in flight"
    if a.process == "gamma":
        return f"gamma arrivals at {a.rate} req/s (burstiness {a.burstiness})"
    if a.process == "ramp":
        return f"rate ramping {a.start_rate} -> {a.rate} req/s"
    if a.process == "trace":
        return f"trace timestamps x{a.time_scale}"
    return f"{a.process} arrivals at {a.rate} req/s"
