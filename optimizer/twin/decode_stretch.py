"""Steps the twin may take without calling vLLM's scheduler: a stretch of pure decode steps that
vLLM would schedule identically, taken in one go.

Between events nothing in a decode-only engine changes but the clock and each sequence's length:
every running request is decoding one token a step, nothing waits, no request can stop, no send
or arrival falls due, and no sequence reaches the edge of a KV block (where vLLM would allocate a
block, hash it or cache it, and where a full pool preempts). Over such a stretch `schedule()`
gives every running request one token and `update_from_output()` appends it, step after step, so
the twin prices the steps itself and then applies their effect with vLLM's own token-append (its
block hasher and stop check) and the counters a step advances. The step before and the step after
a stretch are vLLM's own: every decision (admission, chunking, allocation, preemption, stopping)
stays vLLM's.

The equivalence is checked in tests/unit/twin/test_decode_stretch.py: a replay with stretches
gives the same token times, server view and step log as one that calls vLLM every step.
"""

from __future__ import annotations

import math

from optimizer.twin.kv_pool import shared_tokens
from optimizer.twin.step_cost import StepShape

SAMPLED_TOKEN = 7  # the token id the twin "samples" (any id: requests are sent with ignore_eos)


def length(scheduler) -> int:
    """How many steps from now vLLM would schedule as pure decode of every running request, with
    nothing stopping, allocating or hashing (the step after them is left to vLLM); 0 if none."""
    s = scheduler
    if getattr(s, "defer_block_free", False) or s.connector is not None:
        return 0
    running, waiting = s.get_request_counts()
    if waiting or not running or getattr(s, "deferred_waiting", ()) or running > s.max_num_running_reqs:
        return 0
    if running > s.max_num_scheduled_tokens:
        return 0
    block = s.cache_config.block_size
    horizon = math.inf
    for r in s.running:
        c = r.num_computed_tokens
        if (r.num_tokens != c + 1 or r.spec_token_ids or r.num_output_placeholders or r.is_prefill_chunk
                or c % block == 0):
            return 0
        # a block is filled (cached, hashed) or a new one needed before c + k + 1 reaches the next edge
        room = (c // block + 1) * block - c - 2
        stop = min(r.max_tokens - r.num_output_tokens, s.max_model_len - r.num_tokens) - 1
        horizon = min(horizon, room, stop)
    return max(0, int(horizon))


def shapes(scheduler, steps: int, fp8: bool):
    """The shape of each of the next `steps` decode steps (as twin/simulation.py's `_shape` counts them)."""
    n = len(scheduler.running)
    context = sum(r.num_computed_tokens for r in scheduler.running)
    shared = shared_tokens(scheduler, [r.request_id for r in scheduler.running])  # no block changes in a stretch
    for k in range(steps):
        yield StepShape(0, 0.0, 0, n, (context + k * n) / 1000, fp8, (), (context + k * n - shared) / 1000)


def apply(scheduler, steps: int) -> None:
    """Advance vLLM's state by `steps` decode steps of every running request, as schedule() and
    update_from_output() would have (no block allocated, no request stopped: `length` saw to it)."""
    s = scheduler
    s.current_step += steps
    tokens = [SAMPLED_TOKEN] * steps
    for r in s.running:
        r.num_computed_tokens += steps
        _, stopped = s._update_request_with_output(r, list(tokens))
        if stopped:  # length() rules this out; if vLLM disagrees, the twin must not go on silently
            raise AssertionError(f"request {r.request_id} stopped inside a decode stretch")
