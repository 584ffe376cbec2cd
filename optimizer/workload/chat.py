"""The synthetic chat mix: mostly short questions, some long documents, fixed output lengths.

Seeded: the same spec and vocabulary give the same requests, token for token. Prompt
tokens are drawn from the model's vocabulary (skipping the first ids, where special
tokens live) and sent as token ids, so prompt lengths are exact and no two prompts share
a prefix by accident (a shared prefix would let the prefix cache flatter a trial).
"""

from __future__ import annotations

import random

from .arrivals import offsets
from .base import Request, Workload

FIRST_ORDINARY_ID = 3


def _request(rid: str, rng: random.Random, spec, vocab_size: int, offset: float) -> Request:
    span = spec.long_input if rng.random() < spec.long_share else spec.short_input
    n_in = rng.randint(*span)
    ids = tuple(rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(n_in))
    return Request(rid, ids, rng.randint(*spec.output), offset)


def chat_workload(spec, vocab_size: int) -> Workload:
    rng = random.Random(spec.seed)
    top = min(vocab_size, 32000)
    warm = tuple(_request(f"warmup-{i}", rng, spec, top, 0.0) for i in range(spec.warmup_requests))
    arrival = spec.arrival
    offs = offsets(arrival.process, spec.requests, arrival.rate, rng)
    reqs = tuple(_request(f"req-{i}", rng, spec, top, offs[i]) for i in range(spec.requests))
    how = (f"closed loop, {arrival.concurrency} in flight" if arrival.process == "closed"
           else f"{arrival.process} arrivals at {arrival.rate} req/s")
    return Workload(
        name="chat", requests=reqs, warmup=warm,
        concurrency=arrival.concurrency if arrival.process == "closed" else None,
        description=f"chat mix: {spec.requests} requests ({spec.long_share:.0%} long documents), {how}",
    )
