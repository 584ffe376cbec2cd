"""A stretch of pure decode steps, priced by the twin and applied to vLLM's state in one go, gives
exactly what calling vLLM's scheduler every step gives: the same token times, server view and step
log, whatever decides the schedule (an open or closed loop, agent turns, chunked prefill, a KV pool
that preempts, shared prefixes in the prefix cache, an fp8 cache, a stored run's send times)."""

import pytest

from optimizer.twin import decode_stretch
from optimizer.twin.step_cost import LinearStepCost
from optimizer.workload.base import Request

COST = LinearStepCost((0.010, 0.0001, 0.00002, 0.001, 0.0003, 0.0001, 0.0001, 0.00002, 0.0002, 0.00005), 0.002)


def req(i, prompt, out, at=0.0, prefix=(), after=None):
    body = tuple(1000 + (i * 7919 + k) % 2000 for k in range(prompt - len(prefix)))
    return Request(f"req-{i}", prefix + body, out, at, after=after)


def both(server, requests, concurrency=None, send_times=None):
    """The replay with stretches and without, and how many steps the stretches took."""
    taken = []
    real = decode_stretch.apply

    def counted(scheduler, steps):
        taken.append(steps)
        real(scheduler, steps)

    decode_stretch.apply = counted
    try:
        fast = server.run(requests, concurrency, COST, send_times=send_times, keep_steps=True)
    finally:
        decode_stretch.apply = real
    slow = server.run(requests, concurrency, COST, send_times=send_times, keep_steps=True, stretches=False)
    return fast, slow, sum(taken)


def same(fast, slow):
    assert fast.result == slow.result
    assert fast.server == slow.server
    assert fast.steps == slow.steps
    for name in ("starts", "shapes", "visible", "first_step", "token_steps"):
        assert getattr(fast.log, name) == getattr(slow.log, name), name


SHARED = tuple(range(2000, 2300))


CASES = {
    "open loop, prefix cache": (("--enable-prefix-caching",), 1 << 30, None, lambda: [
        req(i, 150 + 41 * (i % 7), 20 + 37 * (i % 9), 0.07 * i, SHARED if i % 2 else ()) for i in range(40)]),
    "closed loop, agent turns": (("--max-num-seqs", "8"), 1 << 30, 4, lambda: [
        *[req(i, 200 + 13 * i, 60 + 11 * i) for i in range(10)],
        Request("turn-2", tuple(range(3000, 3400)), 90, 0.2, after="req-3")]),
    "chunked prefill, small budget": (("--max-num-batched-tokens", "256", "--max-num-seqs", "6"), 1 << 30, None,
                                      lambda: [req(i, 300 + 90 * i, 150, 0.05 * i) for i in range(12)]),
    "a pool that preempts": (("--max-num-seqs", "4"), 7 * 128 * 16384, None,
                             lambda: [req(i, 100, 300) for i in range(4)]),
    "fp8 cache": (("--kv-cache-dtype", "fp8",), 1 << 30, None,
                  lambda: [req(i, 120, 200 + 5 * i, 0.03 * i) for i in range(16)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stretch_is_what_vllm_would_have_scheduled_step_by_step(twin, case):
    flags, kv_bytes, concurrency, make = CASES[case]
    server = twin(*flags, kv_bytes=kv_bytes)
    fast, slow, stretched = both(server, make(), concurrency)
    same(fast, slow)
    assert stretched > 0.3 * fast.steps  # the case is not vacuous: most of its steps were stretches
    assert all(r.ok for r in fast.result.records)
    if case == "a pool that preempts":
        assert fast.server["preemptions"] >= 1


def test_a_stored_runs_send_times_replay_the_same(twin):
    requests = [req(i, 180, 90 + 7 * i) for i in range(12)]
    fast, slow, stretched = both(twin("--max-num-seqs", "6"), requests, send_times=[0.11 * i for i in range(12)])
    same(fast, slow)
    assert stretched > 0


def test_nothing_that_stops_allocates_or_waits_is_stretched(twin):
    server = twin("--max-num-seqs", "1")
    sched = server.scheduler()
    from optimizer.twin.vllm_scheduler import new_request

    for i, (prompt, out) in enumerate([(100, 5), (100, 50)]):
        sched.add_request(new_request(f"r{i}", list(range(prompt)), out, 0.0, None))
    assert decode_stretch.length(sched) == 0  # both wait: vLLM must admit them
    out = sched.schedule()  # r0's prefill (max-num-seqs 1: r1 still waits)
    from optimizer.twin.simulation import _runner_output

    sched.update_from_output(out, _runner_output(out, {"r0": True}))
    assert decode_stretch.length(sched) == 0  # r1 waits
    sched.finish_requests("r1", __import__("vllm.v1.request", fromlist=["RequestStatus"]).RequestStatus.FINISHED_ABORTED)
    # r0 has 1 of 5 tokens: 4 more steps, the last of them vLLM's (it stops there)
    assert decode_stretch.length(sched) == 3
    r0 = sched.requests["r0"]
    r0.num_computed_tokens, before = 127, r0.num_computed_tokens  # pretend its next token fills a block
    assert decode_stretch.length(sched) == 0
    r0.num_computed_tokens = before
