"""Agent: multi-turn tool-call loops with a growing shared context and bursty session starts.

A session's first call carries the shared tool definitions (`system_tokens`, the same for
every session) and a user message. Each later call carries the whole previous prompt, the
model's previous reply, and a tool result whose length is drawn log-uniformly (tens to
tens of thousands of tokens), and is sent `think_s` after the previous reply ends (the
tool's run time): the replayer waits for the reply, as an agent does. A session ends
after its turns, or before its prompt would pass `max_context`.

The model's reply inside the next prompt is stood in by random tokens of the same length
(with dummy weights the real reply is random text anyway), so the prefix cache can reuse
the previous prompt, not the reply. Warm-up requests use their own tool definitions.
"""

from __future__ import annotations

import math
import random

from optimizer.config.workload_spec import AgentSpec
from optimizer.workload.arrivals import closed_concurrency, describe_arrival, offsets
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


def _session(s: int, start: float, spec: AgentSpec, vocab: Vocabulary, rng: random.Random) -> list[Request]:
    system = vocab.block(f"agent-tools-{spec.seed}", spec.system_tokens)
    prompt = system + vocab.random_ids(rng, rng.randint(*spec.user_input))
    out = rng.randint(*spec.output)
    reqs = [Request(f"s{s}-t0", prompt, out, start)]
    for turn in range(1, rng.randint(*spec.turns)):
        reply = vocab.random_ids(rng, out)
        tool = vocab.random_ids(rng, _log_uniform(rng, *spec.tool_result))
        next_out = rng.randint(*spec.output)
        if len(prompt) + len(reply) + len(tool) + next_out > spec.max_context:
            break
        prompt, out = prompt + reply + tool, next_out
        think = rng.uniform(*spec.think_s)
        reqs.append(Request(f"s{s}-t{turn}", prompt, out, think, after=reqs[-1].id))
    return reqs


def agent_workload(spec: AgentSpec, vocab: Vocabulary) -> Workload:
    rng = random.Random(spec.seed)
    warm_tools = vocab.block(f"agent-tools-{spec.seed}-warmup", spec.system_tokens)
    warm = tuple(Request(f"warmup-{i}", warm_tools + vocab.random_ids(rng, rng.randint(*spec.user_input)),
                         rng.randint(*spec.output), 0.0) for i in range(spec.warmup_requests))
    starts = offsets(spec.arrival, spec.sessions, rng)
    reqs = tuple(r for s in range(spec.sessions) for r in _session(s, starts[s], spec, vocab, rng))
    spans = [len(r.prompt_token_ids) for r in reqs]
    return Workload(name="agent", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival),
                    description=f"agent: {spec.sessions} sessions, {len(reqs)} calls, prompts {min(spans)}-"
                                f"{max(spans)} tokens, sessions start on {describe_arrival(spec.arrival)}")
