"""Offline batch: every request queued at once (or `concurrency` at a time); throughput is all
that matters, so arrival times do not exist here."""

from __future__ import annotations

import random

from optimizer.config.workload_spec import BatchSpec
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def batch_workload(spec: BatchSpec, vocab: Vocabulary) -> Workload:
    rng = random.Random(spec.seed)

    def one(rid: str) -> Request:
        return Request(rid, vocab.random_ids(rng, rng.randint(*spec.input)), rng.randint(*spec.output), 0.0)

    warm = tuple(one(f"warmup-{i}") for i in range(spec.warmup_requests))
    reqs = tuple(one(f"req-{i}") for i in range(spec.requests))
    inflight = spec.concurrency or spec.requests
    return Workload(name="batch", requests=reqs, warmup=warm, concurrency=inflight,
                    description=f"offline batch: {spec.requests} requests, {inflight} in flight")
