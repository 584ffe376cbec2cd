"""measure/replay.py + measure/metrics.py against an in-process fake server streaming like vLLM's /v1/completions.

The server sleeps known delays between SSE chunks, so the timing math can be pinned.
Tolerances are generous (the machine is noisy) but exclude the plausible wrong formulas.
"""

import asyncio
import json
import time

import pytest
from aiohttp import web

from optimizer.measure.metrics import summarize
from optimizer.measure.replay import replay
from optimizer.workload import Request


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


class FakeVllm:
    """POST /v1/completions: one chunk after each delay, then a usage chunk and [DONE]."""

    def __init__(self, delays=(0.0,), tokens_per_chunk=1, status=200, drop_after=None):
        self.delays, self.tpc, self.status, self.drop_after = delays, tokens_per_chunk, status, drop_after
        self.in_flight = self.max_in_flight = 0
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.perf_counter())
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.Response(status=self.status, text="engine exploded")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, delay in enumerate(self.delays):
            await asyncio.sleep(delay)
            if i == self.drop_after:
                request.transport.close()  # the server dies mid-stream
                self.in_flight -= 1
                return resp
            await resp.write(sse({"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                                  "choices": [{"index": 0, "text": " x" * self.tpc, "finish_reason": None}]}))
        out = len(self.delays) * self.tpc
        await resp.write(sse({"id": "cmpl-1", "choices": [], "usage": {
            "prompt_tokens": len(body["prompt"]), "completion_tokens": out,
            "total_tokens": len(body["prompt"]) + out}}))
        self.in_flight -= 1  # before [DONE]: the client cannot start the next request earlier
        await resp.write(b"data: [DONE]\n\n")
        return resp


def requests(n: int, offsets=None, prompt_len: int = 7) -> tuple[Request, ...]:
    offsets = offsets or [0.0] * n
    return tuple(Request(f"r{i}", tuple(range(3, 3 + prompt_len)), 5, offsets[i]) for i in range(n))


def run(server: FakeVllm, reqs, concurrency):
    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await replay(f"http://127.0.0.1:{port}", "tiny", reqs, concurrency, request_timeout=30)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_request_body_streams_with_usage_and_fixed_output_length():
    server = FakeVllm()
    run(server, requests(1), 1)
    body = server.bodies[0]
    assert body["prompt"] == list(range(3, 10)) and body["max_tokens"] == 5 and body["model"] == "tiny"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True


def test_ttft_tpot_e2el_follow_the_chunk_times():
    # first token after 300 ms, then four more 50 ms apart: TTFT 300, E2E 500, TPOT (500-300)/4 = 50.
    result = run(FakeVllm(delays=(0.3, 0.05, 0.05, 0.05, 0.05)), requests(1), 1)
    rec = result.records[0]
    assert rec.ok and rec.status == 200 and rec.output_tokens == 5 and len(rec.chunk_s) == 5
    m = summarize(result)
    assert 295 <= m["ttft_ms_p50"] <= 420
    assert 495 <= m["e2el_ms_p50"] <= 650
    assert 45 <= m["tpot_ms_p50"] <= 75  # /out would give 40, E2E/out 100
    assert 45 <= m["itl_ms_p50"] <= 75


def test_output_tokens_come_from_usage_not_from_counting_chunks():
    result = run(FakeVllm(delays=(0.01, 0.01, 0.01), tokens_per_chunk=2), requests(1), 1)
    assert result.records[0].output_tokens == 6 and len(result.records[0].chunk_s) == 3


def test_http_500_is_an_error_record_not_an_exception():
    result = run(FakeVllm(status=500), requests(3), 2)
    assert [(r.ok, r.status, r.output_tokens) for r in result.records] == [(False, 500, 0)] * 3
    assert "engine exploded" in result.records[0].error
    m = summarize(result)
    assert m["error_rate"] == 1.0 and m["completed"] == 0


def test_stream_cut_mid_way_and_refused_connection_are_error_records():
    cut = run(FakeVllm(delays=(0.01, 0.01, 0.01), drop_after=2), requests(2), 2)
    assert [r.ok for r in cut.records] == [False, False]
    assert all(len(r.chunk_s) == 2 and r.error for r in cut.records)
    refused = asyncio.run(replay("http://127.0.0.1:9", "tiny", requests(2), 2, request_timeout=5))
    assert [(r.ok, r.status) for r in refused.records] == [(False, 0), (False, 0)]


def test_closed_loop_keeps_exactly_the_concurrency_in_flight():
    server = FakeVllm(delays=(0.1,))
    run(server, requests(12), 3)
    assert server.max_in_flight == 3 and len(server.arrivals) == 12


def test_closed_loop_above_aiohttps_default_connection_limit():
    server = FakeVllm(delays=(0.5,))
    result = run(server, requests(120), 120)  # aiohttp's default connector would stop at 100
    assert server.max_in_flight == 120 and all(r.ok for r in result.records)


def test_open_loop_sends_on_schedule_without_waiting_for_answers():
    offsets = [0.0, 0.15, 0.3, 0.45, 0.6]
    server = FakeVllm(delays=(0.5,))  # each answer takes longer than the gap between sends
    result = run(server, requests(5, offsets), None)
    assert [r.intended_s for r in result.records] == offsets
    assert all(0 <= r.sent_s - r.intended_s < 0.05 for r in result.records)
    assert summarize(result)["schedule_lag_p50_ms"] < 10
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:])]
    assert all(0.12 <= g <= 0.2 for g in gaps)
    assert server.max_in_flight >= 3


def test_throughput_is_tokens_over_the_measured_window():
    # 4 requests, 2 at a time, each 200 ms for 2 tokens: two waves, ~0.4 s, 8 tokens.
    result = run(FakeVllm(delays=(0.1, 0.1)), requests(4, prompt_len=7), 2)
    m = summarize(result)
    assert 0.39 <= m["duration_s"] <= 0.6
    assert 8 / 0.6 <= m["output_throughput"] <= 8 / 0.39
    assert 4 / 0.6 <= m["request_throughput"] <= 4 / 0.39
    assert m["total_token_throughput"] == pytest.approx((8 + 4 * 7) / m["duration_s"])


def run_with(server: FakeVllm, reqs, concurrency, during=None):
    """`run` with a `during` coroutine and a guard against a replay that never ends."""
    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            return await asyncio.wait_for(
                replay(f"http://127.0.0.1:{port}", "tiny", reqs, concurrency, request_timeout=30, during=during), 20)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def agent_chain():
    """r0 -> r1 (0.1 s after r0's reply) -> r2 (0.05 s after r1's), and r3 on its own at 0.05 s.
    Prompt lengths 1..4 tell the requests apart on the server."""
    return (Request("r0", (3,), 2, 0.0), Request("r1", (3,) * 2, 2, 0.1, after="r0"),
            Request("r2", (3,) * 3, 2, 0.05, after="r1"), Request("r3", (3,) * 4, 2, 0.05))


def test_a_turn_is_sent_its_offset_after_the_previous_reply_ends():
    server = FakeVllm(delays=(0.1, 0.1))  # each reply takes 0.2 s
    result = run_with(server, agent_chain(), None)
    arrived = {len(b["prompt"]): t for b, t in zip(server.bodies, server.arrivals)}
    rec = {r.id: r for r in result.records}
    assert all(r.ok for r in result.records)
    # on the server: r1 0.2 s (reply) + 0.1 s after r0, r2 0.2 + 0.05 s after r1; r3 on its own schedule
    assert 0.29 <= arrived[2] - arrived[1] <= 0.36
    assert 0.24 <= arrived[3] - arrived[2] <= 0.31
    assert arrived[4] - arrived[1] < 0.1  # not held back by the chain
    # on the client: sent the offset after the predecessor's last chunk, never before
    for prev, nxt, offset in (("r0", "r1", 0.1), ("r1", "r2", 0.05)):
        assert rec[nxt].sent_s >= rec[prev].end_s + offset - 0.002
        assert rec[nxt].intended_s == pytest.approx(rec[prev].end_s + offset, abs=0.01)
        assert rec[nxt].sent_s - rec[nxt].intended_s < 0.01
    assert rec["r3"].intended_s == 0.05
    assert summarize(result)["schedule_lag_p50_ms"] < 10


def test_a_turn_after_a_failed_reply_is_still_sent():
    server = FakeVllm(status=500)
    result = run_with(server, agent_chain(), None)
    assert len(server.arrivals) == 4 and [r.status for r in result.records] == [500] * 4
    rec = {r.id: r for r in result.records}
    assert rec["r1"].sent_s >= rec["r0"].sent_s + 0.1 - 0.002


def test_during_runs_alongside_the_replay_and_is_cancelled_after_it():
    seen = {}

    async def during(t0):
        seen["t0"], seen["start"] = t0, time.perf_counter()
        try:
            while True:
                seen["ticks"] = seen.get("ticks", 0) + 1
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            seen["stop"] = time.perf_counter()
            raise

    server = FakeVllm(delays=(0.1, 0.1))
    result = run_with(server, requests(3, [0.0, 0.1, 0.2]), None, during=during)
    assert "stop" in seen  # cancelled, and awaited before replay() returned
    assert seen["t0"] <= seen["start"] <= min(server.arrivals)
    last_end = seen["t0"] + max(r.end_s for r in result.records)
    assert last_end <= seen["stop"] < last_end + 0.1
    assert seen["ticks"] >= 20  # it ran during the ~0.4 s window, not only at the end


def test_closed_loop_holds_a_slot_per_session_until_its_last_turn():
    """Two two-turn sessions, one slot: session 0's second turn goes before session 1 starts
    (it does not queue behind a session that has not begun), and the slot frees after it."""
    reqs = (Request("s0-t0", (3,), 2, 0.0), Request("s0-t1", (3,) * 2, 2, 0.0, after="s0-t0"),
            Request("s1-t0", (3,) * 3, 2, 0.0), Request("s1-t1", (3,) * 4, 2, 0.0, after="s1-t0"))
    server = FakeVllm(delays=(0.05,))
    result = run_with(server, reqs, 1)
    assert all(r.ok for r in result.records)
    assert [len(b["prompt"]) for b in server.bodies] == [1, 2, 3, 4]
    assert server.max_in_flight == 1
