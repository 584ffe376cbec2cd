"""The chat mix: mostly short questions, some long documents, fixed output lengths.

Seeded: the same spec and vocabulary give the same requests, token for token. No two
prompts share a prefix by accident (a shared prefix would let the prefix cache flatter a trial).
"""

from __future__ import annotations

import random

from optimizer.config.workload_spec import ChatSpec
from optimizer.workload.arrivals import closed_concurrency, describe_arrival, offsets
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def _request(rid: str, rng: random.Random, spec: ChatSpec, vocab: Vocabulary, offset: float) -> Request:
    span = spec.long_input if rng.random() < spec.long_share else spec.short_input
    ids = vocab.random_ids(rng, rng.randint(*span))
    return Request(rid, ids, rng.randint(*spec.output), offset)


def chat_workload(spec: ChatSpec, vocab: Vocabulary) -> Workload:
    rng = random.Random(spec.seed)
    warm = tuple(_request(f"warmup-{i}", rng, spec, vocab, 0.0) for i in range(spec.warmup_requests))
    offs = offsets(spec.arrival, spec.requests, rng)
    reqs = tuple(_request(f"req-{i}", rng, spec, vocab, offs[i]) for i in range(spec.requests))
    return Workload(
        name="chat", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival),
        description=f"chat mix: {spec.requests} requests ({spec.long_share:.0%} long documents), "
                    f"{describe_arrival(spec.arrival)}",
    )

