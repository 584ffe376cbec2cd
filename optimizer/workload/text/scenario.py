"""Real text through the served model's tokenizer and chat template: copy-heavy requests and open
questions, the two kinds of traffic speculative decoding tells apart.

`copy_share` of the requests carry a passage (workload/text/corpus.py) and ask for it back
(a RAG answer quoting its document, a rewrite, a code edit): their output is as long as the
passage, so the answer can copy it whole, and n-gram drafting finds its drafts in the prompt.
The rest ask an open question about a topic: answers reuse little of their prompt. Passages
repeat across requests, as documents do in RAG traffic, so the prefix cache has hits to lose.
Seeded: the same spec and tokenizer give the same requests, token for token.
"""

from __future__ import annotations

import random

from optimizer.config.workload_spec import TextSpec
from optimizer.errors import ConfigError
from optimizer.workload.text import corpus
from optimizer.workload.arrivals import closed_concurrency, describe_arrival, offsets
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def _request(rid: str, rng: random.Random, spec: TextSpec, vocab: Vocabulary, offset: float,
             passages: tuple[str, ...], topics: tuple[str, ...]) -> Request:
    if rng.random() < spec.copy_share:
        passage = rng.choice(passages)
        prompt = rng.choice(corpus.COPY_TASKS).format(passage=passage)
        return Request(rid, vocab.chat(prompt), len(vocab.encode(passage)), offset)
    prompt = rng.choice(corpus.OPEN_TASKS).format(topic=rng.choice(topics))
    return Request(rid, vocab.chat(prompt), rng.randint(*spec.output), offset)


def text_workload(spec: TextSpec, vocab: Vocabulary) -> Workload:
    if not vocab.tokenizer_source:
        raise ConfigError("workload scenario 'text': the model's tokenizer is unknown, and text prompts need it; "
                          "give model.path a directory with tokenizer.json, or use scenario 'chat'")
    keep = corpus.WARMUP_KEPT
    passages, warm_passages = corpus.PASSAGES[:-keep], corpus.PASSAGES[-keep:]
    topics, warm_topics = corpus.TOPICS[:-keep], corpus.TOPICS[-keep:]
    rng = random.Random(spec.seed)
    warm = tuple(_request(f"warmup-{i}", rng, spec, vocab, 0.0, warm_passages, warm_topics)
                 for i in range(spec.warmup_requests))
    offs = offsets(spec.arrival, spec.requests, rng)
    reqs = tuple(_request(f"req-{i}", rng, spec, vocab, offs[i], passages, topics) for i in range(spec.requests))
    notes = () if vocab.has_chat_template else (
        "no chat template read (the model directory has none, or the model is a Hub id): each prompt is the bare "
        "request text",)
    return Workload(
        name="text", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival), notes=notes,
        description=f"text: {spec.requests} requests in real text, {spec.copy_share:.0%} quoting one of "
                    f"{len(passages)} passages back (copy-heavy), the rest open questions; "
                    f"{describe_arrival(spec.arrival)}",
    )
