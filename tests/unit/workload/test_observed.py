"""workload/observed.py: lengths drawn from vLLM's coarse token buckets keep the buckets' shares
and the window's mean, the prefix share reproduces a hit rate, and the workload is seeded."""

import math
import random
import statistics

import pytest

from optimizer.config.workload_spec import ObservedSpec
from optimizer.traffic import window as window_mod
from optimizer.traffic.histogram import Histogram
from optimizer.traffic.window import Window
from optimizer.traffic.lengths import draw_lengths
from optimizer.workload.observed import (
    fit_prefix_share,
    observed_workload,
    simulated_hit_rate,
)
from optimizer.workload.tokens import Vocabulary

VLLM_TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, math.inf)


def histogram_of(lengths) -> Histogram:
    counts = tuple(float(sum(1 for x in lengths if x <= b)) for b in VLLM_TOKEN_BUCKETS)
    return Histogram(VLLM_TOKEN_BUCKETS, counts, float(sum(lengths)))


def shares(h: Histogram):
    return [n / h.count for _, _, n in h.buckets()]


@pytest.mark.parametrize("mu, sigma", [(5.5, 0.8), (4.0, 0.3), (6.8, 0.5)])
def test_drawn_lengths_keep_the_bucket_shares_and_the_mean_of_a_known_distribution(mu, sigma):
    rng = random.Random(7)
    truth = [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(5000)]
    observed = histogram_of(truth)
    drawn = draw_lengths(observed, 20000, random.Random(1))
    again = histogram_of(drawn)
    assert max(abs(a - b) for a, b in zip(shares(observed), shares(again))) < 0.015
    assert statistics.fmean(drawn) == pytest.approx(statistics.fmean(truth), rel=0.02)
    # Inside a bucket the truth is unknown; the quantiles land within the truth's own bucket.
    for q in (0.1, 0.5, 0.9):
        t, d = statistics.quantiles(truth, n=20)[int(q * 20) - 1], statistics.quantiles(drawn, n=20)[int(q * 20) - 1]
        assert 1 / 2.5 < d / t < 2.5, (q, t, d)


def test_one_narrow_band_inside_a_wide_bucket_is_drawn_near_its_mean():
    truth = [1500 + (i % 40) for i in range(400)]  # all in (1000, 2000]
    drawn = draw_lengths(histogram_of(truth), 4000, random.Random(2))
    assert statistics.fmean(drawn) == pytest.approx(statistics.fmean(truth), rel=0.01)
    assert min(drawn) > 1000 and max(drawn) <= 2000


def test_the_prefix_share_reproduces_the_hit_rate_in_whole_blocks():
    prompts = draw_lengths(histogram_of([300 + i for i in range(200)]), 200, random.Random(3))
    for target in (0.1, 0.4, 0.7):
        share = fit_prefix_share(prompts, target, block=16)
        assert simulated_hit_rate(prompts, share, 16) == pytest.approx(target, abs=0.02)
    assert fit_prefix_share(prompts, None, 16) == 0.0 and simulated_hit_rate(prompts, 0.0, 16) == 0.0
    # A hit rate no shared prefix can reach: the whole prompt but its last token, shared.
    assert fit_prefix_share(prompts, 0.999, 16) == 1.0


def _window_file(tmp_path, **more):
    lengths = [400 + (i * 7) % 300 for i in range(120)]
    outs = [40 + (i * 3) % 60 for i in range(120)]
    w = Window({"kind": "vllm_metrics", "urls": ["http://prod:8000/metrics"]}, 1000.0, 1120.0, 120.0,
               histogram_of(lengths), histogram_of(outs), prefix_queries=float(sum(lengths)),
               prefix_hits=0.3 * sum(lengths), sub_s=12.0, counts=(12.0,) * 10,
               cache_config={"block_size": "16"}, **more)
    return window_mod.write(w, tmp_path / "window.json"), w


def test_the_workload_has_the_window_s_rate_prefix_share_and_records_its_source(tmp_path):
    path, w = _window_file(tmp_path)
    vocab = Vocabulary(32000, None, 4096)
    wl = observed_workload(ObservedSpec(path=str(path), requests=100, warmup_requests=2), vocab)
    assert len(wl.requests) == 100 and len(wl.warmup) == 2 and wl.concurrency is None
    assert wl.requests[-1].offset_s == pytest.approx(100 / w.rate)  # 1 req/s, rescaled as vLLM does
    lengths = [len(r.prompt_token_ids) for r in wl.requests]
    hits = simulated_hit_rate(lengths, _shared_share(wl), 16)
    assert hits == pytest.approx(0.3, abs=0.03)
    assert "http://prod:8000/metrics" in wl.notes[0] and "1970-01-01 00:16:40" in wl.notes[0]
    assert "observed 30%" in wl.notes[1]
    again = observed_workload(ObservedSpec(path=str(path), requests=100, warmup_requests=2), vocab)
    assert again.content_hash() == wl.content_hash()  # seeded: the same window, the same requests
    other = observed_workload(ObservedSpec(path=str(path), requests=100, warmup_requests=2, seed=1), vocab)
    assert other.content_hash() != wl.content_hash()


def _shared_share(wl) -> float:
    """The share of each prompt that is the common prefix (from the requests themselves)."""
    first = wl.requests[0].prompt_token_ids
    shares = []
    for r in wl.requests:
        k = 0
        while k < min(len(first), len(r.prompt_token_ids)) and first[k] == r.prompt_token_ids[k]:
            k += 1
        shares.append(k / len(r.prompt_token_ids))
    return statistics.median(shares[1:])


def test_requests_longer_than_the_model_takes_are_cut_to_fit_and_said(tmp_path):
    path, _ = _window_file(tmp_path)
    wl = observed_workload(ObservedSpec(path=str(path), requests=50), Vocabulary(32000, None, 512))
    assert max(r.total_tokens for r in wl.requests + wl.warmup) <= 512
    assert any("cut to fit the model's 512 positions" in n for n in wl.notes)


def test_lengths_are_bounded_by_what_production_admits_not_by_the_fitted_tail(tmp_path):
    """The window's prompts reach 699 tokens; production serves --max-model-len 600 (a longer request
    is answered 400, never counted): no drawn request is longer, and the notes say what bounded it."""
    path, _ = _window_file(tmp_path)
    wl = observed_workload(ObservedSpec(path=str(path), requests=80, max_model_len=600), Vocabulary(32000, None, 4096))
    assert max(r.total_tokens for r in wl.requests + wl.warmup) <= 600
    assert any("cut to fit max-model-len 600 (the longest request the watched servers and the trial servers admit)" in n
               for n in wl.notes)
    # the model's positions bound it when they are the tighter
    tight = observed_workload(ObservedSpec(path=str(path), requests=80, max_model_len=600), Vocabulary(32000, None, 512))
    assert max(r.total_tokens for r in tight.requests) <= 512 and any("the model's 512" in n for n in tight.notes)


def test_the_daemon_bounds_the_observed_lengths_by_the_watch_or_the_baseline(tmp_path):
    from optimizer.config.schema import build_config
    from optimizer.daemon.observing import observed_spec

    watch = {"vllm_metrics": ["http://prod:8000/metrics"]}
    cfg = build_config({"model": {"path": "/m"}, "baseline": {"max-model-len": 8192}, "daemon": {"watch": watch}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json").max_model_len == 8192
    cfg = build_config({"model": {"path": "/m"}, "baseline": {"max-model-len": 8192},
                        "daemon": {"watch": {**watch, "max_model_len": 4096}}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json").max_model_len == 4096
    cfg = build_config({"model": {"path": "/m"}, "daemon": {"watch": watch}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json").max_model_len is None


def test_the_observed_lengths_fit_the_trial_servers_too(tmp_path):
    """A daemon reading Prometheus does not learn production's max-model-len, and the study holds
    --max-model-len 4096 in engine.extra_args: a request drawn longer came back a token short from
    every trial server (replay_invalid three times, and the daemon exited). The pinned limit bounds
    the draw, and the shorter of it and production's wins."""
    from optimizer.config.schema import build_config
    from optimizer.daemon.observing import observed_spec

    watch = {"vllm_metrics": ["http://prod:8000/metrics"]}
    fixed = {"extra_args": ["--max-model-len", "4096", "--enforce-eager"]}
    cfg = build_config({"model": {"path": "/m"}, "engine": fixed, "daemon": {"watch": watch}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json").max_model_len == 4096
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json", admits=8192).max_model_len == 4096
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json", admits=2048).max_model_len == 2048
    cfg = build_config({"model": {"path": "/m"}, "engine": {"extra_args": ["--max-model-len=3000"]},
                        "daemon": {"watch": {**watch, "max_model_len": 8192}}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json").max_model_len == 3000
    # a baseline's is no bound: the generation's admission raises it to what production admits
    cfg = build_config({"model": {"path": "/m"}, "baseline": {"max-model-len": 2048}, "daemon": {"watch": watch}})
    assert observed_spec(cfg, cfg.daemon.watch, tmp_path / "w.json", admits=4096).max_model_len == 4096


def test_only_a_whole_pinned_length_bounds_anything():
    """vLLM takes --max-model-len -1 or "auto" as "fit the memory": no pin to cut to or to check."""
    from optimizer.config.flags import pinned_model_len

    assert pinned_model_len(["--max-model-len", "4096", "--enforce-eager"]) == 4096
    assert pinned_model_len(["--max-model-len=3000"]) == 3000
    assert pinned_model_len(["--max-model-len", "2048", "--max-model-len", "8192"]) == 8192  # argparse: the last
    assert pinned_model_len(["--max-model-len", "-1"]) is None and pinned_model_len(["--max-model-len", "auto"]) is None
    assert pinned_model_len(["--max-model-len", "32k"]) is None and pinned_model_len([]) is None


def test_a_pinned_length_below_the_longest_request_is_refused_but_not_on_a_live_daemons_stand_in(tmp_path, tiny_model):
    """`run` on a workload longer than the pinned --max-model-len is refused before a boot; a daemon
    watching live servers checks its config at start on a stand-in chat workload (no window yet)
    whose requests its observed workloads, cut to the pin, will never be: not refused."""
    from optimizer.config.schema import build_config
    from optimizer.driver.plan import prepare
    from optimizer.errors import ConfigError

    cfg = {"study_name": "pin", "storage": f"sqlite:///{tmp_path / 'trials.db'}", "artifacts_dir": str(tmp_path / "a"),
           "model": {"path": str(tiny_model), "load_format": "dummy", "dtype": "bfloat16"},
           "space": {"max-num-seqs": {"low": 2, "high": 8}}, "engine": {"extra_args": ["--max-model-len", "512"]}}
    with pytest.raises(ConfigError, match="--max-model-len 512 is below the workload's longest request"):
        prepare(build_config(cfg))
    live = {**cfg, "daemon": {"watch": {"vllm_metrics": ["http://127.0.0.1:9/metrics"]}}}
    assert prepare(build_config(live)).workload.longest_request() > 512
    auto = {**cfg, "engine": {"extra_args": ["--max-model-len", "-1"]}}
    assert prepare(build_config(auto)).workload.longest_request() > 512
