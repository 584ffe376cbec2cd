"""The step-cost fit recovers known coefficients from timings the twin itself produced with them,
and a step cost maps a step's counts to seconds term by term (fp8 terms in their own columns)."""

import random

import pytest

from optimizer.measure.metrics import summarize
from optimizer.twin.fit import MeasuredRun, fit
from optimizer.twin.step_cost import TERMS, LinearStepCost, StepShape
from optimizer.workload.base import Request

TRUTH = LinearStepCost((0.008, 0.00004, 0.00002, 0.0012, 0.0002, 0.0001, 0.00007, 0.00003, 0.0001, 0.00005), 0.003)


def _workload(seed: int, n: int = 48, rate: float = 6.0, shared: float = 0.0) -> tuple:
    """`n` Poisson arrivals; a `shared` fraction of them open with one of two 1,024-token prefixes."""
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(100, 3000) for _ in range(1024)) for _ in range(2)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        head = rng.choice(prefixes) if rng.random() < shared else ()
        out.append(Request(f"req-{i}", head + tuple(rng.randrange(100, 3000) for _ in range(rng.randint(50, 900))),
                           rng.randint(8, 64), t))
    return tuple(out)


def _measured(server, reqs, label: str) -> MeasuredRun:
    sim = server.run(reqs, None, TRUTH)
    times = [(r.sent_s, r.first_chunk_s, r.end_s, r.output_tokens, r.ok) for r in sim.result.records]
    return MeasuredRun(label, server, reqs, times)


def test_the_fit_recovers_known_coefficients_from_synthetic_timings(twin):
    reqs = _workload(1, shared=0.7)
    runs = [_measured(twin("--max-num-seqs", "4", "--max-num-batched-tokens", "256"), reqs, "a"),
            _measured(twin("--max-num-seqs", "16", "--max-num-batched-tokens", "1024", "--no-enable-prefix-caching"),
                      reqs, "b"),
            _measured(twin("--max-num-seqs", "8", "--kv-cache-dtype", "fp8"), reqs, "c")]
    got = fit(runs)
    assert got.error < 0.01, got.history  # the simulation matches the timings it came from
    truth, fitted = dict(zip(TERMS, TRUTH.coefficients)), dict(zip(TERMS, got.cost.coefficients))
    # The terms each step holds in every run come back within 5%. Per-token prefill and prefill
    # attention trade off against each other (a long prompt is also a long context), so each of
    # the prefill terms comes back within 20% while their sum per prompt, below, is exact enough.
    for term, rel in (("step_s", 0.05), ("decode_seq_s", 0.05), ("prefill_token_s", 0.2), ("fp8_prefill_token_s", 0.2)):
        assert fitted[term] == pytest.approx(truth[term], rel=rel), (term, got.cost.describe())
    # The intake only ever adds to a TTFT that also waits for steps of ~8 ms: within 0.75 ms of it.
    assert got.cost.intake_s == pytest.approx(TRUTH.intake_s, abs=0.00075), got.cost.describe()
    prompt = StepShape(prefill_tokens=600, prefill_attention=600 * 300 / 1000)
    assert got.cost.seconds(prompt) == pytest.approx(TRUTH.seconds(prompt), rel=0.05)
    # Decode attention: the runs with and without prefix caching tell the context read from the
    # memory held apart, so 16 sequences of 1,000 tokens cost what the truth says whether they share
    # half of the memory they read or nothing.
    def attention(cost, held):  # a decode step's cost beyond that of its sequences without context
        return cost.seconds(StepShape(decode_seqs=16, decode_context=16.0, decode_kv=held)) - cost.seconds(
            StepShape(decode_seqs=16))

    for held in (16.0, 8.0):
        assert attention(got.cost, held) == pytest.approx(attention(TRUTH, held), rel=0.1), (held, got.cost.describe())
    # and configurations it never saw come out as the truth would have it, sharing prefixes or not
    for other, shared in ((twin("--max-num-seqs", "32", "--max-num-batched-tokens", "512"), 0.7),
                          (twin("--max-num-seqs", "32", "--no-enable-prefix-caching"), 0.0)):
        want = summarize(other.run(_workload(2, shared=shared), None, TRUTH).result)
        have = summarize(other.run(_workload(2, shared=shared), None, got.cost).result)
        for k, rel in (("request_throughput", 0.03), ("tpot_ms_p50", 0.03), ("ttft_ms_p95", 0.08)):
            assert have[k] == pytest.approx(want[k], rel=rel), (k, shared)


def test_a_step_costs_its_terms_and_fp8_uses_its_own_columns():
    cost = LinearStepCost(tuple(float(i + 1) for i in range(len(TERMS))), 0.0)
    shape = StepShape(prefill_tokens=10, prefill_attention=2.0, prefill_seqs=1, decode_seqs=3, decode_context=4.0,
                      decode_kv=1.5)
    assert cost.seconds(shape) == 1 + 2 * 10 + 3 * 2.0 + 4 * 3 + 5 * 4.0 + 6 * 1.5
    fp8 = StepShape(10, 2.0, 1, 3, 4.0, fp8=True, decode_kv=1.5)
    assert cost.seconds(fp8) == 1 + 7 * 10 + 8 * 2.0 + 4 * 3 + 9 * 4.0 + 10 * 1.5
    assert list(fp8.features()) == [1, 0, 0, 3, 0, 0, 10, 2.0, 4.0, 1.5]
    assert LinearStepCost.from_dict(cost.as_dict()) == cost


def test_without_an_fp8_run_fp8_costs_what_16_bit_costs(twin):
    reqs = _workload(3, n=24)
    got = fit([_measured(twin("--max-num-seqs", "8"), reqs, "a")], iterations=6)
    c = dict(zip(TERMS, got.cost.coefficients))
    assert c["fp8_prefill_token_s"] == c["prefill_token_s"] and c["fp8_decode_context_s"] == c["decode_context_s"]
    assert c["fp8_decode_kv_s"] == c["decode_kv_s"]



def test_where_the_rows_cannot_tell_two_terms_apart_the_fixed_and_the_context_ones_take_the_tie():
    """Steps that each decode exactly one sequence (a server at max-num-seqs 1): the fixed column and
    the per-sequence column are the same numbers, and any split fits. The solver takes the fixed cost
    (a decode step reads the weights once whatever its batch), so a batch is not priced as that many
    steps. Where the batch moves (the first test), the timings decide."""
    import numpy as np

    from optimizer.twin.fit import LINEAR, _solve

    rng = random.Random(6)
    rows, targets = [], []
    for _ in range(40):  # a request's decode: n steps of one sequence over a growing context
        n, ctx = rng.randint(8, 64), rng.randint(50, 900) / 1000
        counts = StepShape(decode_seqs=1, decode_context=ctx, decode_kv=ctx).features() * n
        rows.append(np.append(counts, 0.0))
        targets.append(n * (0.006 + 0.0002 * ctx))
    coef, _ = _solve(np.array(rows), np.array(targets), LINEAR)
    c = dict(zip(TERMS, coef))
    assert c["step_s"] + c["decode_seq_s"] == pytest.approx(0.006, rel=0.05)
    assert c["decode_seq_s"] < 0.05 * c["step_s"], c
    # Nothing shared: the memory read is the context, and the context term takes the tie (the
    # conservative price for a configuration that would share: as if it shared nothing).
    assert c["decode_context_s"] + c["decode_kv_s"] == pytest.approx(0.0002, rel=0.05)
    assert c["decode_kv_s"] < 0.05 * c["decode_context_s"], c


def test_a_decode_step_counts_a_shared_prefix_once_in_the_memory_it_reads(twin):
    """With prefix caching, sequences that open with the same prompt hold its blocks once: the
    memory a decode step reads is well under the context its sequences attend to. Without it,
    every sequence holds its own copy, and the two are the same numbers."""
    reqs = _workload(4, n=24, rate=50.0, shared=1.0)  # all at once, every prompt on one of two prefixes
    shared = [s for s in twin("--max-num-seqs", "16").run(reqs, None, TRUTH, keep_steps=True).log.shapes
              if s.decode_seqs == 16]
    assert shared and sorted(s.decode_kv / s.decode_context for s in shared)[len(shared) // 2] < 0.6
    alone = [s for s in twin("--max-num-seqs", "16", "--no-enable-prefix-caching").run(
        reqs, None, TRUTH, keep_steps=True).log.shapes if s.decode_seqs]
    assert alone and all(s.decode_kv == pytest.approx(s.decode_context) for s in alone)
