"""The step-cost fit recovers known coefficients from timings the twin itself produced with them,
and a step cost maps a step's counts to seconds term by term (fp8 terms in their own columns)."""

import random

import pytest

from optimizer.measure.metrics import summarize
from optimizer.twin.fit import MeasuredRun, fit
from optimizer.twin.step_cost import TERMS, LinearStepCost, StepShape
from optimizer.workload.base import Request

TRUTH = LinearStepCost((0.008, 0.00004, 0.00002, 0.0012, 0.0002, 0.00007, 0.00003, 0.0001), 0.003)


def _workload(seed: int, n: int = 48, rate: float = 6.0) -> tuple:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(Request(f"req-{i}", tuple(rng.randrange(100, 3000) for _ in range(rng.randint(50, 900))),
                           rng.randint(8, 64), t))
    return tuple(out)


def _measured(server, reqs, label: str) -> MeasuredRun:
    sim = server.run(reqs, None, TRUTH)
    times = [(r.sent_s, r.first_chunk_s, r.end_s, r.output_tokens, r.ok) for r in sim.result.records]
    return MeasuredRun(label, server, reqs, times)


def test_the_fit_recovers_known_coefficients_from_synthetic_timings(twin):
    reqs = _workload(1)
    runs = [_measured(twin("--max-num-seqs", "4", "--max-num-batched-tokens", "256"), reqs, "a"),
            _measured(twin("--max-num-seqs", "16", "--max-num-batched-tokens", "1024"), reqs, "b"),
            _measured(twin("--max-num-seqs", "8", "--kv-cache-dtype", "fp8"), reqs, "c")]
    got = fit(runs)
    assert got.error < 0.01, got.history  # the simulation matches the timings it came from
    truth, fitted = dict(zip(TERMS, TRUTH.coefficients)), dict(zip(TERMS, got.cost.coefficients))
    # The terms each step holds in every run come back within 5%. Per-token prefill and prefill
    # attention trade off against each other (a long prompt is also a long context), so each of
    # the prefill terms comes back within 20% while their sum per prompt, below, is exact enough.
    for term, rel in (("step_s", 0.05), ("decode_seq_s", 0.05), ("prefill_token_s", 0.2), ("fp8_prefill_token_s", 0.2)):
        assert fitted[term] == pytest.approx(truth[term], rel=rel), (term, got.cost.describe())
    assert got.cost.intake_s == pytest.approx(TRUTH.intake_s, rel=0.1)
    prompt = StepShape(prefill_tokens=600, prefill_attention=600 * 300 / 1000)
    assert got.cost.seconds(prompt) == pytest.approx(TRUTH.seconds(prompt), rel=0.05)
    # and a configuration it never saw comes out as the truth would have it
    other = twin("--max-num-seqs", "32", "--max-num-batched-tokens", "512")
    want = summarize(other.run(_workload(2), None, TRUTH).result)
    have = summarize(other.run(_workload(2), None, got.cost).result)
    for k, rel in (("request_throughput", 0.03), ("tpot_ms_p50", 0.03), ("ttft_ms_p95", 0.08)):
        assert have[k] == pytest.approx(want[k], rel=rel), k


def test_a_step_costs_its_terms_and_fp8_uses_its_own_columns():
    cost = LinearStepCost(tuple(float(i + 1) for i in range(len(TERMS))), 0.0)
    shape = StepShape(prefill_tokens=10, prefill_attention=2.0, prefill_seqs=1, decode_seqs=3, decode_context=4.0)
    assert cost.seconds(shape) == 1 + 2 * 10 + 3 * 2.0 + 4 * 3 + 5 * 4.0
    fp8 = StepShape(10, 2.0, 1, 3, 4.0, fp8=True)
    assert cost.seconds(fp8) == 1 + 6 * 10 + 7 * 2.0 + 4 * 3 + 8 * 4.0
    assert list(fp8.features()) == [1, 0, 0, 3, 0, 10, 2.0, 4.0]
    assert LinearStepCost.from_dict(cost.as_dict()) == cost


def test_without_an_fp8_run_fp8_costs_what_16_bit_costs(twin):
    reqs = _workload(3, n=24)
    got = fit([_measured(twin("--max-num-seqs", "8"), reqs, "a")], iterations=6)
    c = dict(zip(TERMS, got.cost.coefficients))
    assert c["fp8_prefill_token_s"] == c["prefill_token_s"] and c["fp8_decode_context_s"] == c["decode_context_s"]



def test_where_the_rows_cannot_tell_a_steps_fixed_cost_from_its_per_sequence_cost_the_fixed_one_takes_it():
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
        counts = StepShape(decode_seqs=1, decode_context=ctx).features() * n
        rows.append(np.append(counts, 0.0))
        targets.append(n * (0.006 + 0.0002 * ctx))
    coef, _ = _solve(np.array(rows), np.array(targets), LINEAR)
    c = dict(zip(TERMS, coef))
    assert c["step_s"] + c["decode_seq_s"] == pytest.approx(0.006, rel=0.05)
    assert c["decode_seq_s"] < 0.05 * c["step_s"], c
