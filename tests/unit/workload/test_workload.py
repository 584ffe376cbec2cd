"""workload/chat.py: the chat mix is seeded, in range, warm-up apart, and on the arrival schedule asked for."""

import statistics

import pytest

from optimizer.config.workload_spec import ChatSpec
from optimizer.workload import Vocabulary
from optimizer.workload import build_workload as _build

VOCAB = 4096


def build_workload(spec, vocab_size):
    return _build(spec, Vocabulary(vocab_size))


def spec(**kw) -> ChatSpec:
    base = dict(seed=0, requests=40, warmup_requests=4, long_share=0.25, short_input=(16, 64),
                long_input=(512, 1024), output=(8, 32))
    return ChatSpec(**{**base, **kw})


def test_same_seed_same_workload_other_seed_other_workload():
    a, b = build_workload(spec(), VOCAB), build_workload(spec(), VOCAB)
    assert a == b and a.content_hash() == b.content_hash()
    assert build_workload(spec(seed=1), VOCAB).content_hash() != a.content_hash()
    closed_64 = spec(arrival={"process": "closed", "concurrency": 64})
    assert build_workload(closed_64, VOCAB).content_hash() != a.content_hash()  # the schedule counts too


def test_lengths_inside_the_configured_spans():
    w = build_workload(spec(), VOCAB)
    lengths = [len(r.prompt_token_ids) for r in w.requests + w.warmup]
    assert all(16 <= n <= 64 or 512 <= n <= 1024 for n in lengths)
    assert any(n >= 512 for n in lengths) and any(n <= 64 for n in lengths)
    assert all(8 <= r.max_tokens <= 32 for r in w.requests + w.warmup)
    assert w.longest_request() == max(len(r.prompt_token_ids) + r.max_tokens for r in w.requests + w.warmup)


def test_token_ids_skip_special_tokens_and_stay_in_the_vocabulary():
    for vocab in (VOCAB, 50):
        w = build_workload(spec(), vocab)
        ids = [t for r in w.requests + w.warmup for t in r.prompt_token_ids]
        assert min(ids) >= 3 and max(ids) < vocab


def test_warmup_prompts_are_not_in_the_measured_set():
    w = build_workload(spec(), VOCAB)
    assert len(w.requests) == 40 and len(w.warmup) == 4
    measured_ids = {r.id for r in w.requests}
    assert not measured_ids & {r.id for r in w.warmup}
    measured_prefixes = {r.prompt_token_ids[:16] for r in w.requests}
    assert not measured_prefixes & {r.prompt_token_ids[:16] for r in w.warmup}  # no shared prefix-cache block


def test_closed_loop_has_concurrency_and_no_schedule():
    w = build_workload(spec(arrival={"process": "closed", "concurrency": 8}), VOCAB)
    assert w.concurrency == 8
    assert {r.offset_s for r in w.requests} == {0.0}


def test_poisson_offsets_increase_with_mean_gap_one_over_rate():
    s = spec(requests=2000, warmup_requests=0, long_share=0.0, short_input=(1, 2), output=(1, 2),
             arrival={"process": "poisson", "rate": 10.0})
    w = build_workload(s, VOCAB)
    offsets = [r.offset_s for r in w.requests]
    assert w.concurrency is None and offsets[0] > 0.0  # vLLM: the first request waits one gap
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert all(g > 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(0.1, rel=0.15)  # exponential: sd == mean


def test_constant_arrivals_are_evenly_spaced():
    w = build_workload(spec(requests=5, arrival={"process": "constant", "rate": 4.0}), VOCAB)
    assert [r.offset_s for r in w.requests] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
