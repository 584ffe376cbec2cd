"""Burst: a steady base rate with sharp periodic spikes, Poisson within each stretch.

The spike shape is the spec's: `spike_rate` for `spike_duration_s` every `spike_every_s`
seconds, the first at `first_spike_s`; `base_rate` in between.
"""

from __future__ import annotations

import random

from optimizer.config.workload_spec import BurstSpec
from optimizer.workload.arrivals import Spikes, spike_schedule
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def burst_workload(spec: BurstSpec, vocab: Vocabulary) -> Workload:
    rng = random.Random(spec.seed)
    spikes = Spikes(spec.base_rate, spec.spike_rate, spec.spike_every_s, spec.spike_duration_s, spec.first_spike_s)

    def one(rid: str, offset: float) -> Request:
        return Request(rid, vocab.random_ids(rng, rng.randint(*spec.input)), rng.randint(*spec.output), offset)

    warm = tuple(one(f"warmup-{i}", 0.0) for i in range(spec.warmup_requests))
    offs = spike_schedule(spec.requests, spikes, rng)
    reqs = tuple(one(f"req-{i}", offs[i]) for i in range(spec.requests))
    return Workload(name="burst", requests=reqs, warmup=warm, concurrency=None,
                    description=f"burst: {spec.requests} requests at {spec.base_rate} req/s with spikes to "
                                f"{spec.spike_rate} req/s for {spec.spike_duration_s:g} s every {spec.spike_every_s:g} s")
