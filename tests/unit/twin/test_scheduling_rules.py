"""The twin schedules as vLLM 0.32 does, because it is vLLM's own scheduler: small hand-made cases,
each checked against what vLLM's rules give (budget and chunked prefill, max-num-seqs, KV blocks
and preemption, prefix-cache hits, a closed loop's concurrency), and a run is deterministic."""

import pytest

from optimizer.errors import ConfigError
from optimizer.twin.step_cost import LinearStepCost
from optimizer.workload.base import Request

# 10 ms a step, 1 ms a decoding sequence, 0.1 ms a prompt token: round numbers to reason with.
COST = LinearStepCost((0.010, 0.0001, 0.0, 0.001, 0.0, 0.0, 0.0001, 0.0, 0.0, 0.0), 0.0)


def req(i: int, prompt: int, out: int, at: float = 0.0, prefix: tuple = ()) -> Request:
    body = tuple(1000 + (i * 7919 + k) % 2000 for k in range(prompt - len(prefix)))
    return Request(f"req-{i}", prefix + body, out, at)


def run(twin, requests, concurrency=None, **kw):
    server = twin(*kw.pop("flags", ()), **kw)
    return server, server.run(requests, concurrency, COST, keep_steps=True)


def test_a_prompt_longer_than_the_budget_is_chunked(twin):
    _, sim = run(twin, [req(0, 1000, 3)], flags=("--max-num-batched-tokens", "256", "--max-num-seqs", "4"))
    shapes = sim.log.shapes
    # ceil(1000 / 256) = 4 prefill steps of 256, 256, 256, 232 tokens, the last one samples token 1
    assert [s.prefill_tokens for s in shapes[:4]] == [256, 256, 256, 232]
    assert sim.log.token_steps[0] == [3, 4, 5]
    rec = sim.result.records[0]
    assert rec.first_chunk_s == pytest.approx(4 * 0.010 + 1000 * 0.0001)


def test_max_num_seqs_caps_the_running_set(twin):
    _, sim = run(twin, [req(i, 64, 20) for i in range(10)], flags=("--max-num-seqs", "4"))
    assert sim.server["running_peak"] == 4 and sim.server["waiting_peak"] == 6
    assert max(s.decode_seqs + s.prefill_seqs for s in sim.log.shapes) == 4
    assert all(r.ok and r.output_tokens == 20 for r in sim.result.records)


def test_a_kv_pool_too_small_preempts(twin):
    # 5 blocks of 128 tokens (one is vLLM's null block): 512 usable tokens. Four requests of 100 + 200
    # tokens need 3 blocks each by their end, 12 in all: vLLM must preempt (recompute) some.
    tight, sim = run(twin, [req(i, 100, 200) for i in range(4)], flags=("--max-num-seqs", "4"),
                     kv_bytes=5 * 128 * 16384)
    assert tight.pool.blocks == 5
    assert sim.server["preemptions"] >= 1 and sim.server["kv_cache_usage_peak"] == 1.0
    assert all(r.ok and r.output_tokens == 200 for r in sim.result.records)
    _, roomy = run(twin, [req(i, 100, 200) for i in range(4)], flags=("--max-num-seqs", "4"))
    assert roomy.server["preemptions"] == 0


def test_shared_prefixes_hit_the_prefix_cache(twin):
    shared = tuple(range(2000, 2512))  # 4 full blocks of 128
    reqs = [req(0, 600, 4, 0.0, shared), req(1, 600, 4, 5.0, shared)]  # the second arrives long after
    _, sim = run(twin, reqs, flags=("--enable-prefix-caching",))
    assert sim.server["prefix_cache_hits"] == 512 and sim.server["prefix_cache_queries"] == 1200
    _, off = run(twin, reqs, flags=("--no-enable-prefix-caching",))
    assert off.server["prefix_cache_hits"] == 0


def test_a_closed_loop_keeps_its_concurrency(twin):
    _, sim = run(twin, [req(i, 64, 10 + i) for i in range(20)], concurrency=3, flags=("--max-num-seqs", "16"))
    recs = sim.result.records
    for r in recs:  # at every send, at most 3 requests are in flight (including the one sent)
        in_flight = sum(1 for o in recs if o.sent_s <= r.sent_s < o.end_s)
        assert in_flight <= 3
    assert sim.server["running_peak"] == 3
    # every send after the first three is the moment another request ended
    ends = {o.end_s for o in recs}
    assert all(r.sent_s in ends for r in recs[3:])


def test_an_open_loop_sends_on_its_offsets_and_agent_turns_follow_their_reply(twin):
    first = req(0, 64, 5, 0.0)
    follow = Request("req-1", first.prompt_token_ids + (5,) * 10, 5, 0.5, after="req-0")
    _, sim = run(twin, [first, follow, req(2, 64, 5, 2.0)])
    a, b, c = sim.result.records
    assert b.sent_s == pytest.approx(a.end_s + 0.5) and c.sent_s == 2.0


def test_a_run_is_deterministic(twin):
    reqs = [req(i, 100 + 37 * i, 5 + i, 0.05 * i) for i in range(30)]
    _, one = run(twin, reqs, flags=("--max-num-seqs", "8"))
    _, two = run(twin, reqs, flags=("--max-num-seqs", "8"))
    assert one.result == two.result and one.server == two.server


def test_flags_vllm_refuses_are_refused_with_vllms_message(twin):
    with pytest.raises(ConfigError, match="vLLM refuses the flags: .*max_num_seqs"):
        twin("--max-num-seqs", "0")
    with pytest.raises(ConfigError, match="vLLM refuses the flags: .*invalid choice: 'fp9'"):
        twin("--kv-cache-dtype", "fp9")
    with pytest.raises(ConfigError, match="unrecognized arguments: --max-num-sequences"):
        twin("--max-num-sequences", "4")


def test_the_pool_is_sized_as_the_server_sizes_it(twin, model):
    server = twin("--kv-cache-dtype", "fp8", kv_bytes=128 << 20)
    # 8 layers x 8 KV heads x 64 x 2 (K and V) x 1 byte = 8 KiB a token; 128 tokens a block
    assert server.pool.blocks == (128 << 20) // (128 * 8192) == 128
    assert server.shape.block_size == 128 and server.shape.max_num_batched_tokens == 2048  # vLLM's CPU defaults
    from optimizer.twin.server import TwinServer
    logged = TwinServer.from_flags(model, ["--max-model-len", "4096"], log_text="CPU KV cache size: 8,064 tokens")
    assert logged.pool.blocks == 63  # "KV cache size" counts whole requests' blocks: 63 of 128 at 4096
