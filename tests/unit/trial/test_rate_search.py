"""trial/rate_search.py: the goodput rate search against known latency curves (no server), the
schedule rescaling, and once through the real HTTP replay path against a fake server whose
capacity is known (one request at a time, a fixed service time)."""

import asyncio
import math
import random
import threading

import pytest
from aiohttp import web

from optimizer.measure import slo
from optimizer.measure.metrics import summarize
from optimizer.measure.replay import run_replay
from optimizer.trial import rate_search as ratesearch
from optimizer.workload import Request
from tests.unit.measure.test_replay import sse

SLOS = slo.parse_slos("ttft:500")
HUGE = 1e9


def curve_probe(base_ms, capacity, slos=SLOS, noise=None, log=None):
    """A probe on an M/M/1-like hockey stick: p95 TTFT = base / (1 - rate / capacity) below the
    capacity, huge at or above it; the saturation probe (inf) measures `capacity` req/s."""
    def probe(rate):
        if log is not None:
            log.append(rate)
        ttft = HUGE if rate >= capacity else base_ms / (1 - rate / capacity)
        if noise is not None:
            ttft *= noise(rate)
        m = {"ttft_ms_p95": ttft, "request_throughput": capacity if math.isinf(rate) else min(rate, capacity)}
        score = slo.worst_log_ratio(slos, m)
        return ratesearch.Probe(rate, score < 0, score, m)
    return probe


def r_star(base_ms, capacity, limit_ms):
    """base / (1 - r/cap) = limit."""
    return capacity * (1 - base_ms / limit_ms)


CURVES = [(base, cap) for base in (50.0, 150.0, 300.0, 400.0, 480.0) for cap in (0.7, 3.0, 12.5, 80.0)]


@pytest.mark.parametrize("max_probes", [3, 4, 6, 10])
@pytest.mark.parametrize("rel_tol", [0.05, 0.1, 0.2])
def test_search_answer_is_safe_close_and_within_budget(max_probes, rel_tol):
    for base, cap in CURVES:
        log = []
        res = ratesearch.search(curve_probe(base, cap, log=log), max_probes=max_probes, rel_tol=rel_tol)
        target = r_star(base, cap, 500.0)
        assert len(res.probes) == len(log) <= max_probes
        assert math.isinf(log[0]) and math.isinf(res.probes[0].rate)
        assert [p.rate for p in res.probes] == log
        assert res.capacity == cap
        answer = res.goodput_rate
        assert answer <= target, (base, cap, answer, target)  # never a rate that fails
        assert answer <= res.capacity
        if res.best is not None:
            assert res.best.passed and res.best in res.probes and answer == res.best.rate
            assert answer == max(p.rate for p in res.probes if p.passed)
        if res.best is not None and len(res.probes) < max_probes:  # stopped on its own: the bracket is tight
            assert answer >= (1 - rel_tol) * target, (base, cap, answer, target, [p.rate for p in res.probes])
        # every probe above r* failed, every probe below passed (the curve is monotone)
        for p in res.probes:
            if abs(p.rate - target) > 1e-9 * target:  # exactly at r* the float rounding decides
                assert p.passed == (p.rate < target)


def test_search_converges_with_a_generous_budget():
    for base, cap in CURVES:
        for rel_tol in (0.02, 0.1):
            res = ratesearch.search(curve_probe(base, cap), max_probes=20, rel_tol=rel_tol)
            target = r_star(base, cap, 500.0)
            if target >= 0.25 * cap / 4:  # reachable by the bracketing probes
                assert len(res.probes) < 20
                assert (1 - rel_tol) * target <= res.goodput_rate <= target


def test_slo_holding_at_saturation_answers_the_capacity_after_one_probe():
    res = ratesearch.search(curve_probe(50.0, 7.0, slos=slo.parse_slos("ttft:2000000000")))
    assert len(res.probes) == 1 and math.isinf(res.probes[0].rate)
    assert res.goodput_rate == 7.0 and res.capacity == 7.0 and res.best is res.probes[0]


def test_nothing_passes_answers_zero():
    log = []
    res = ratesearch.search(curve_probe(600.0, 10.0, log=log), max_probes=6)  # base already over 500
    assert res.best is None and res.goodput_rate == 0.0
    # inf, then the low share, then a quarter of it
    assert log[0] == math.inf and log[1:] == pytest.approx([2.5, 0.625])


def test_nothing_completes_at_saturation_answers_zero_after_one_probe():
    def probe(rate):
        return ratesearch.Probe(rate, False, math.inf, {"request_throughput": 0.0})
    res = ratesearch.search(probe)
    assert res.best is None and res.goodput_rate == 0.0 and len(res.probes) == 1


def test_low_share_and_the_quarter_retry():
    log = []
    # r* = 10 * (1 - 400/500) = 2: fails at 0.25 * 10 = 2.5, passes at 0.625
    res = ratesearch.search(curve_probe(400.0, 10.0, log=log), max_probes=8, rel_tol=0.1)
    assert log[:3] == pytest.approx([math.inf, 2.5, 0.625])
    assert 1.8 <= res.goodput_rate < 2.0
    log.clear()
    ratesearch.search(curve_probe(50.0, 10.0, log=log), low_share=0.4)
    assert log[1] == pytest.approx(4.0)


@pytest.mark.parametrize("max_probes", [2, 3, 4, 6])
def test_probe_budget_is_never_exceeded(max_probes):
    """config/schema.py allows max_probes >= 2 ("replays per trial, the saturation probe included")."""
    for base, cap in CURVES + [(600.0, 10.0)]:
        log = []
        ratesearch.search(curve_probe(base, cap, log=log), max_probes=max_probes)
        assert len(log) <= max_probes, (base, cap, max_probes, log)


def test_noisy_monotone_curve_never_returns_a_failing_rate():
    rng = random.Random(2)
    for _ in range(400):
        base, cap = rng.choice(CURVES)

        def noise(rate):  # each probe measures the monotone curve +-40 %, independently
            return rng.uniform(0.6, 1.4)

        res = ratesearch.search(curve_probe(base, cap, noise=noise), max_probes=rng.randint(3, 8),
                                rel_tol=rng.choice((0.05, 0.1, 0.2)))
        if res.best is None:
            assert res.goodput_rate == 0.0
            continue
        assert res.best.passed and res.best.score < 0
        assert res.best.metrics["ttft_ms_p95"] <= 500.0  # the answer's own measurement held
        assert res.goodput_rate <= res.capacity
        # every failure seen lies above the answer: the bracket never inverts under noise
        failed_rates = [p.rate for p in res.probes if not p.passed]
        assert all(r > res.goodput_rate for r in failed_rates), (res.goodput_rate, failed_rates)


def test_between_stays_inside_the_bracket():
    rng = random.Random(9)
    for _ in range(2000):
        lo = rng.uniform(0, 10)
        hi = lo + rng.uniform(1e-6, 10)
        lo_s = rng.choice([-math.inf, rng.uniform(-5, 0), math.nan])
        hi_s = rng.choice([math.inf, rng.uniform(0, 5), math.nan, rng.uniform(-5, 0)])
        x = ratesearch._between(lo, lo_s, hi, hi_s)
        assert lo + 0.2 * (hi - lo) - 1e-9 <= x <= lo + 0.8 * (hi - lo) + 1e-9
    # linear interpolation where the score crosses 0: -1 at 2, +1 at 6 -> 4
    assert ratesearch._between(2.0, -1.0, 6.0, 1.0) == 4.0
    assert ratesearch._between(2.0, -0.01, 6.0, 100.0) == pytest.approx(2.8)  # clamped to 20 %


# --- at_rate / nominal_rate ---------------------------------------------------------------------------------

def schedule(offsets, agent=()):
    reqs = [Request(f"r{i}", (3, 4), 5, o) for i, o in enumerate(offsets)]
    reqs += [Request(f"a{i}", (3,), 2, delay, after=after) for i, (after, delay) in enumerate(agent)]
    return tuple(reqs)


def test_at_rate_spans_the_requests_over_rate():
    # at_rate's docstring: the schedule spans len(requests) / rate seconds (agent turns count
    # toward the rate); only open-loop roots move, by one factor, so the shape is kept.
    rng = random.Random(4)
    offsets = [0.0] + sorted(rng.uniform(0, 30) for _ in range(19))
    for agent in ([], [("r3", 1.5), ("a0", 0.25)]):
        reqs = schedule(offsets, agent=agent)
        n = len(reqs)
        for rate in (0.5, 2.0, 40.0):
            out = ratesearch.at_rate(reqs, rate)
            roots = [r for r in out if r.after is None]
            assert max(r.offset_s for r in roots) == pytest.approx(n / rate)
            assert ratesearch.nominal_rate(out) == pytest.approx(rate)
            factor = (n / rate) / offsets[-1]
            assert [r.offset_s for r in roots] == pytest.approx([o * factor for o in offsets])
            # agent follow-ups keep their think time and their predecessor
            follow = [(r.id, r.after, r.offset_s) for r in out if r.after is not None]
            assert follow == [(f"a{i}", after, delay) for i, (after, delay) in enumerate(agent)]
            assert [(r.id, r.prompt_token_ids, r.max_tokens) for r in out] == \
                   [(r.id, r.prompt_token_ids, r.max_tokens) for r in reqs]


def test_at_rate_inf_sends_every_root_at_zero():
    reqs = schedule([0.0, 1.0, 2.5], agent=[("r1", 0.5)])
    out = ratesearch.at_rate(reqs, math.inf)
    assert [r.offset_s for r in out] == [0.0, 0.0, 0.0, 0.5]
    assert out[3].after == "r1"
    assert ratesearch.nominal_rate(out) is None


def test_nominal_rate():
    assert ratesearch.nominal_rate(schedule([0.0, 1.0, 2.0, 4.0])) == 1.0  # 4 requests over 4 s
    assert ratesearch.nominal_rate(schedule([0.0, 0.0])) is None  # nothing to scale
    # a turn's offset is a think time, not a send time: it does not stretch the span
    assert ratesearch.nominal_rate(schedule([0.0, 2.0], agent=[("r1", 100.0)])) == 1.5


# --- through the real replay path -------------------------------------------------------------------------

class SerialServer:
    """Serves one request at a time (an asyncio.Lock): the first chunk after `service_s`, then a
    few more, so its capacity is ~1/service_s requests/s and TTFT explodes above it. Runs its own
    event loop in a thread (the replay under test runs its own with asyncio.run)."""

    def __init__(self, service_s, chunks=4):
        self.service_s, self.chunks = service_s, chunks
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.served = 0

    async def handle(self, request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async with self.lock:
            await asyncio.sleep(self.service_s)
            for _ in range(self.chunks):
                await resp.write(sse({"id": "c", "choices": [{"index": 0, "text": " x", "finish_reason": None}]}))
            await resp.write(sse({"id": "c", "choices": [], "usage": {
                "prompt_tokens": len(body["prompt"]), "completion_tokens": self.chunks,
                "total_tokens": len(body["prompt"]) + self.chunks}}))
            self.served += 1
            await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _start(self):
        self.lock = asyncio.Lock()
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, backlog=1024).start()
        return self.runner.addresses[0][1]

    def __enter__(self):
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_rate_search_over_http_finds_the_capacity_of_a_serial_server():
    s = 0.02  # service time: capacity ~50 req/s
    slos = slo.parse_slos(f"ttft_p90:{4 * s * 1000:g}")  # p90 TTFT <= 80 ms: a few requests caught in a CPU stall do not decide
    n = 60
    requests = tuple(Request(f"r{i}", (3, 4, 5), 4, 0.1 * i) for i in range(n))
    tried = []

    def probe(rate):
        result = run_replay(server.url, "tiny", ratesearch.at_rate(requests, rate), None, request_timeout=30)
        m = summarize(result)
        assert m["completed"] == n
        score = slo.worst_log_ratio(slos, m)
        p = ratesearch.Probe(rate, score < 0, score, m)
        tried.append(p)
        return p

    with SerialServer(s) as server:
        res = ratesearch.search(probe, max_probes=6, rel_tol=0.1, low_share=0.5)
        assert server.served == n * len(tried)
    summary = [(round(p.rate, 1), p.passed, round(p.metrics["ttft_ms_p90"], 1)) for p in tried]
    assert res.capacity <= 1.02 / s, summary  # the server cannot do better than 1/s
    assert res.capacity >= 0.5 / s, summary
    assert 0.5 / s <= res.goodput_rate <= 1.05 / s, summary
    assert all(not p.passed for p in tried if p.rate > 1.1 / s), summary
    assert res.best is not None and res.best.metrics["ttft_ms_p90"] <= 4 * s * 1000
