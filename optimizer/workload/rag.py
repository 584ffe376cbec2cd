"""RAG / few-shot: questions over a handful of long shared documents.

`prefix_share` of the requests start with one of `documents` shared prefixes (picked
uniformly); the rest carry a unique prefix of the same length, so the prefix cache's
benefit is set by the spec, not by chance. Warm-up requests use their own documents: a
measured request never hits a block the warm-up cached.
"""

from __future__ import annotations

import random

from optimizer.config.workload_spec import RagSpec
from optimizer.workload.arrivals import closed_concurrency, describe_arrival, offsets
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def _documents(spec: RagSpec, vocab: Vocabulary, rng: random.Random, tag: str) -> list[tuple[int, ...]]:
    return [vocab.block(f"rag-{spec.seed}-{tag}-{d}", rng.randint(*spec.prefix_tokens)) for d in range(spec.documents)]


def rag_workload(spec: RagSpec, vocab: Vocabulary) -> Workload:
    rng = random.Random(spec.seed)
    docs, warm_docs = _documents(spec, vocab, rng, "measured"), _documents(spec, vocab, rng, "warmup")

    def one(rid: str, pool: list, offset: float) -> Request:
        if rng.random() < spec.prefix_share:
            prefix = rng.choice(pool)
        else:
            prefix = vocab.random_ids(rng, rng.randint(*spec.prefix_tokens))
        question = vocab.random_ids(rng, rng.randint(*spec.question))
        return Request(rid, prefix + question, rng.randint(*spec.output), offset)

    warm = tuple(one(f"warmup-{i}", warm_docs, 0.0) for i in range(spec.warmup_requests))
    offs = offsets(spec.arrival, spec.requests, rng)
    reqs = tuple(one(f"req-{i}", docs, offs[i]) for i in range(spec.requests))
    return Workload(name="rag", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival),
                    description=f"rag: {spec.requests} questions, {spec.prefix_share:.0%} over {spec.documents} "
                                f"shared documents of {spec.prefix_tokens[0]}-{spec.prefix_tokens[1]} tokens, "
                                f"{describe_arrival(spec.arrival)}")
