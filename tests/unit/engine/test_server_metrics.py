"""engine/server_metrics.py against real vLLM /metrics scrapes (tests/fixtures/vllm_metrics/) and local HTTP servers.

The fixtures were taken before and after 3 requests of 640 prompt tokens and 1 of 3 tokens
(63 generated tokens in all, 1024 prefix-cache hits).
"""

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web

from optimizer.engine.server_metrics import (
    COUNTERS,
    GAUGES,
    SPEC_COUNTERS,
    Peaks,
    deltas,
    parse,
    sampler,
    settled_after,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vllm_metrics"


@pytest.fixture(scope="module")
def before():
    return parse((FIXTURES / "before.prom").read_text())


@pytest.fixture(scope="module")
def after():
    return parse((FIXTURES / "after.prom").read_text())


def test_parse_reads_every_sample_the_optimizer_uses(before, after):
    for snap in (before, after):
        assert all(name in snap for name in list(COUNTERS.values()) + list(GAUGES.values()))
    assert after["process_open_fds"] == 34.0  # a sample without labels
    assert after["vllm:request_success_total"] == 4.0  # summed over finished_reason: the 4 requests
    assert after["vllm:request_prompt_tokens_count"] == 4.0
    assert not any(k.startswith("#") or " " in k or "{" in k for k in after)


def test_parse_sums_label_sets_and_keeps_names_apart():
    text = ('# HELP vllm:prompt_tokens_total x\n'
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0\n'
            'vllm:prompt_tokens_total{engine="1",model_name="a b"} 5.0\n'
            'vllm:num_requests_waiting 2\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 7\n'
            'garbage line without a number x\n')
    snap = parse(text)
    assert snap["vllm:prompt_tokens_total"] == 15.0
    assert snap["vllm:num_requests_waiting"] == 2.0 and snap["vllm:num_requests_waiting_by_reason"] == 7.0


def test_deltas_over_the_fixture_window(before, after):
    d = deltas(before, after)
    assert d["prompt_tokens"] == 3 * 640 + 3 == 1923
    assert d["generation_tokens"] == 63
    assert d["prefix_cache_queries"] == 1923 and d["prefix_cache_hits"] == 1024
    assert d["preemptions"] == 0
    assert d["prefix_cache_hit_rate"] == pytest.approx(1024 / 1923)
    # 4 requests queued for a total of the histogram's sum
    assert d["queue_time_mean_ms"] == pytest.approx(after["vllm:request_queue_time_seconds_sum"] * 1000 / 4)
    assert 0 < d["queue_time_mean_ms"] < 1000


def test_deltas_subtract_the_before_snapshot(after):
    d = deltas(after, after)
    assert d["prompt_tokens"] == 0 and d["prefix_cache_hit_rate"] == 0.0
    assert d["queue_time_mean_ms"] != d["queue_time_mean_ms"]  # no request queued: NaN, not 0
    assert deltas({}, after) == {} and deltas(after, {}) == {}


def test_peaks_keep_the_maximum_of_each_gauge(after):
    peaks = Peaks()
    for kv, waiting in ((0.2, 0), (0.9, 3), (0.4, 1)):
        peaks.add({"vllm:kv_cache_usage_perc": kv, "vllm:num_requests_waiting": waiting})
    peaks.add({})  # a failed scrape still counts as a sample, changes no peak
    assert peaks.values == {"kv_cache_usage": 0.9, "waiting": 3.0} and peaks.samples == 4
    d = deltas(after, after, peaks)
    assert d["kv_cache_usage_peak"] == 0.9 and d["waiting_peak"] == 3.0


def metrics_text(kv: float, waiting: int, generation: float = 0.0) -> str:
    return (f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\nvllm:num_requests_waiting{{engine="0"}} {waiting}\n'
            f'vllm:generation_tokens_total{{engine="0"}} {generation}\n')


def test_sampler_records_the_peak_while_running_and_stops_when_cancelled():
    series = [(0.1, 0), (0.3, 2), (0.85, 6), (0.5, 1), (0.2, 0)]
    scrapes = []

    async def handle(_request):
        kv, waiting = series[min(len(scrapes), len(series) - 1)]
        scrapes.append(time.perf_counter())
        return web.Response(text=metrics_text(kv, waiting))

    async def main():
        app = web.Application()
        app.router.add_get("/metrics", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        peaks = Peaks()
        task = asyncio.ensure_future(sampler(f"http://127.0.0.1:{port}/", 0.01, peaks)(0.0))
        try:
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(scrapes) >= len(series) + 2:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            done_at = len(scrapes)
            await asyncio.sleep(0.05)
            assert len(scrapes) == done_at  # no scrape after the cancel
        finally:
            await runner.cleanup()
        return peaks

    peaks = asyncio.run(main())
    assert peaks.values["kv_cache_usage"] == 0.85 and peaks.values["waiting"] == 6.0
    assert peaks.samples >= len(series)


def test_sampler_survives_a_server_that_does_not_answer():
    async def main():
        peaks = Peaks()
        task = asyncio.ensure_future(sampler("http://127.0.0.1:9", 0.01, peaks)(0.0))
        await asyncio.sleep(0.1)
        assert not task.done()  # refused connections are skipped, sampling goes on
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return peaks

    assert asyncio.run(main()).values == {}


class CountingServer:
    """GET /metrics: the generation counter rises by `step` on every scrape."""

    def __init__(self, step: float):
        self.scrapes = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.scrapes += 1
                body = metrics_text(0.0, 0, outer.scrapes * step).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_settled_after_waits_until_the_counter_catches_up():
    with CountingServer(step=10) as srv:
        before = {COUNTERS["generation_tokens"]: 5.0}
        after = settled_after(srv.url, 25, before, wait_s=5.0)  # 10, 20 are short of 5 + 25; 30 is not
        assert after[COUNTERS["generation_tokens"]] == 30 and srv.scrapes == 3


def test_settled_after_gives_up_after_wait_s():
    with CountingServer(step=1) as srv:
        t = time.monotonic()
        after = settled_after(srv.url, 10**9, {}, wait_s=0.3)
        elapsed = time.monotonic() - t
        assert 0.3 <= elapsed < 1.3
        assert after[COUNTERS["generation_tokens"]] == srv.scrapes >= 2  # the last scrape is returned


def test_settled_after_returns_at_once_when_the_server_is_gone():
    t = time.monotonic()
    assert settled_after("http://127.0.0.1:9", 10, {}, wait_s=5.0) == {}
    assert time.monotonic() - t < 2.0


def test_parse_ignores_a_sample_timestamp():
    snap = parse("vllm:num_requests_waiting 3 1700000000000\n")
    assert snap == {"vllm:num_requests_waiting": 3.0}


# -- speculative decoding: real scrapes of a SmolLM2 server with n-gram speculation ---------------


def test_speculation_counts_acceptance_from_the_real_counters():
    """spec_before/after.prom: SmolLM2-135M-Instruct, n-gram (4 tokens, lookup 2-4), 4 copy-heavy
    prompts answered one at a time (bench/speculation_metrics.py --save-fixtures)."""
    before = parse((FIXTURES / "spec_before.prom").read_text())
    after = parse((FIXTURES / "spec_after.prom").read_text())
    view = deltas(before, after)
    drafts = after[SPEC_COUNTERS["spec_drafts"]] - before.get(SPEC_COUNTERS["spec_drafts"], 0.0)
    drafted = after[SPEC_COUNTERS["spec_draft_tokens"]] - before.get(SPEC_COUNTERS["spec_draft_tokens"], 0.0)
    accepted = after[SPEC_COUNTERS["spec_accepted_tokens"]] - before.get(SPEC_COUNTERS["spec_accepted_tokens"], 0.0)
    assert drafts > 0 and drafted == 4 * drafts  # 4 tokens drafted each time
    assert view["spec_acceptance"] == pytest.approx(accepted / drafted) and 0 < view["spec_acceptance"] <= 1
    assert view["spec_mean_accepted_length"] == pytest.approx(1 + accepted / drafts)
    per_pos = [view[f"spec_accepted_pos_{k}"] for k in range(4)]
    assert sum(per_pos) * drafts == pytest.approx(accepted)  # the positions add up to the total
    assert per_pos == sorted(per_pos, reverse=True)  # a later token is accepted only after the earlier ones
    assert "spec_accepted_pos_4" not in view


def test_without_speculation_the_view_has_no_spec_key(before, after):
    assert not [k for k in deltas(before, after) if k.startswith("spec_")]
