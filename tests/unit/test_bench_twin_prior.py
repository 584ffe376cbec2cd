"""bench/twin_prior.py's residual correction: what a booted run's latencies say about the twin
corrects its predictions of the configurations near it, the nearest weighing most."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import twin_prior as tp  # noqa: E402


def records(ttft_s: float, tpot_s: float, n: int = 20) -> list:
    """n requests sent 1 s apart, each with this TTFT and 11 tokens at this TPOT."""
    return [(i, i + ttft_s, i + ttft_s + 10 * tpot_s, 100, 11, True) for i in range(n)]


def test_a_twin_that_predicted_ttft_2x_too_fast_is_corrected_by_that_factor():
    ttft, tpot = tp.residual(records(2.0, 0.05), records(1.0, 0.05))
    assert math.exp(ttft) == pytest.approx(2.0) and tpot == pytest.approx(0.0, abs=1e-12)
    assert tp.residual(records(1.0, 0.05), records(1.0, 0.05)) == (0.0, 0.0)


def test_distance_counts_doublings_and_differing_categories():
    a = {"max-num-seqs": 8, "kv-cache-dtype": "auto", "enable-prefix-caching": True}
    assert tp.distance(a, a) == 0
    assert tp.distance(a, {**a, "max-num-seqs": 32}) == pytest.approx(2.0)
    assert tp.distance(a, {**a, "kv-cache-dtype": "fp8", "enable-prefix-caching": False}) == 2.0
    assert tp.distance({"k": 4}, {"k": True}) == tp.distance({"k": True}, {"k": 4}) == 1.0


def test_the_correction_is_the_baseline_alone_then_leans_to_the_nearest_run():
    base, near = {"max-num-seqs": 8}, {"max-num-seqs": 64}
    assert tp.correction({"max-num-seqs": 32}, []) == (1.0, 1.0)
    only = tp.correction({"max-num-seqs": 32}, [(base, (math.log(2), 0.0))])
    assert only == pytest.approx((2.0, 1.0))
    both = tp.correction({"max-num-seqs": 32}, [(base, (math.log(2), 0.0)), (near, (0.0, 0.0))])
    assert 1.0 < both[0] < math.sqrt(2.0)  # 64 is one doubling away, 8 two: the nearer counts twice


def test_goodput_with_a_correction_counts_fewer_requests_good():
    recs = records(1.0, 0.02)  # TTFT 1 s, TPOT 20 ms: all good under 1500 / 50 ms
    assert tp.predicted_goodput(recs, 1500, 50, "spread", (1.0, 2.0)) < tp.predicted_goodput(recs, 1500, 50)
    assert tp.predicted_goodput(recs, 1500, 50, "pessimistic") > 0
    assert tp.predicted_goodput(recs, 1500, 50, "pessimistic", (2.0, 1.0)) == 0  # TTFT 2 s against 1.5 s at most
