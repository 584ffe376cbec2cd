"""replay(stop_when=...): the early stop inside one replay, against an in-process fake server
streaming like vLLM (the FakeVllm pattern of test_replay.py, with a per-request delay so the
completion order is known)."""

import asyncio
import time

from aiohttp import web

from optimizer.measure.replay import replay
from optimizer.workload import Request
from tests.unit.measure.test_replay import FakeVllm, requests, sse


class KeyedFake:
    """POST /v1/completions: request i (its prompt is (3, i)) streams its first chunk after
    delays[i] seconds, one more chunk, usage and [DONE]. Records arrivals, completions and the
    requests whose client went away before the end."""

    def __init__(self, delays):
        self.delays = delays
        self.arrived: list[int] = []
        self.done: list[int] = []
        self.gone: list[int] = []

    async def handle(self, request):
        body = await request.json()
        i = body["prompt"][1]
        self.arrived.append(i)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await asyncio.sleep(self.delays[i])
            for _ in range(2):
                await resp.write(sse({"id": "c", "choices": [{"index": 0, "text": " x", "finish_reason": None}]}))
            await resp.write(sse({"id": "c", "choices": [], "usage": {
                "prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):
            self.gone.append(i)
            raise
        self.done.append(i)
        return resp


def keyed(n, offsets=None):
    offsets = offsets or [0.0] * n
    return tuple(Request(f"r{i}", (3, i), 2, offsets[i]) for i in range(n))


def run(server, reqs, concurrency=None, stop_when=None, linger=0.0):
    """Replay against `server`; `linger` keeps the server up that long after the replay returns
    (so the handlers of cancelled requests wake up and find their client gone). Returns the
    result and the replay's wall time."""
    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
        port = runner.addresses[0][1]
        try:
            t = time.perf_counter()
            result = await asyncio.wait_for(replay(f"http://127.0.0.1:{port}", "tiny", reqs, concurrency,
                                                   request_timeout=30, stop_when=stop_when), 20)
            wall = time.perf_counter() - t
            await asyncio.sleep(linger)
            return result, wall
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def after(k, reason="enough", seen=None):
    """stop_when: stop once k requests have finished; logs the ids it was shown."""
    def stop_when(finished):
        if seen is not None:
            seen.append([r.id for r in finished])
        return reason if len(finished) >= k else ""
    return stop_when


def test_open_loop_stops_after_the_kth_finished_and_never_sends_the_rest():
    offsets = [0.25 * i for i in range(10)]  # the schedule runs 2.25 s
    server = KeyedFake([0.02] * 10)
    seen = []
    result, wall = run(server, keyed(10, offsets), stop_when=after(3, "slo: 3 of 10 missed", seen))
    assert result.stopped == "slo: 3 of 10 missed"
    assert [r.id for r in result.records] == ["r0", "r1", "r2"] and all(r.ok for r in result.records)
    assert seen == [["r0"], ["r0", "r1"], ["r0", "r1", "r2"]]  # asked after every finished request
    assert server.arrived == [0, 1, 2]  # r3 (due at 0.75 s) and later were never sent
    assert 0.5 <= result.stopped_at_s < 0.75
    assert wall < 0.75  # it did not wait out the schedule
    # the window covers the finished requests only
    assert result.window_s == max(r.end_s for r in result.records) - min(r.sent_s for r in result.records)


def test_records_are_the_finished_ones_in_workload_order_and_in_flight_ones_are_cut():
    # all sent at once; they finish r2 (0.1 s), r1 (0.3 s), then r3 (0.8 s), r0 (1 s)
    server = KeyedFake([1.0, 0.3, 0.1, 0.8])
    seen = []
    result, wall = run(server, keyed(4), stop_when=after(2, "driver: cannot win", seen), linger=1.0)
    assert seen == [["r2"], ["r2", "r1"]]  # completion order
    assert [r.id for r in result.records] == ["r1", "r2"]  # the workload's order, finished only
    assert result.stopped == "driver: cannot win"
    assert 0.3 <= result.stopped_at_s < 0.7 and wall < 0.75  # r3 and r0 were not waited for
    assert sorted(server.arrived) == [0, 1, 2, 3]
    assert sorted(server.done) == [1, 2]
    assert sorted(server.gone) == [0, 3]  # their connections were closed under them


def test_a_later_agent_turn_is_never_sent_after_a_stop():
    reqs = (Request("r0", (3, 0), 2, 0.0), Request("r1", (3, 1), 2, 0.0),
            Request("a0", (3, 2), 2, 0.05, after="r0"))
    server = KeyedFake([0.01, 0.3, 0.01])
    result, _ = run(server, reqs, stop_when=after(1))
    assert [r.id for r in result.records] == ["r0"] and result.stopped == "enough"
    assert 2 not in server.arrived


def test_closed_loop_stop_leaves_the_queue_unsent():
    server = FakeVllm(delays=(0.05,))
    seen = []
    result, _ = run(server, requests(12), concurrency=2, stop_when=after(4, seen=seen))
    assert len(result.records) == 4 and result.stopped == "enough"
    assert [len(ids) for ids in seen] == [1, 2, 3, 4]
    assert len(server.arrivals) <= 6  # the 4 finished and at most the 2 slots' next requests
    assert server.max_in_flight == 2


def test_without_a_stop_everything_runs():
    offsets = [0.05 * i for i in range(6)]
    for stop_when in (None, lambda finished: "", lambda finished: None):
        server = KeyedFake([0.02] * 6)
        result, _ = run(server, keyed(6, offsets), stop_when=stop_when)
        assert [r.id for r in result.records] == [f"r{i}" for i in range(6)]
        assert all(r.ok for r in result.records)
        assert result.stopped == "" and result.stopped_at_s == 0.0
        assert sorted(server.done) == list(range(6))


def test_stop_when_is_not_asked_after_the_last_request():
    server = KeyedFake([0.01] * 4)
    seen = []
    result, _ = run(server, keyed(4, [0.0, 0.05, 0.1, 0.15]), stop_when=after(4, seen=seen))
    assert [len(ids) for ids in seen] == [1, 2, 3]  # nothing left to cut after the 4th
    assert result.stopped == "" and len(result.records) == 4
