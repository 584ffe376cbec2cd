"""measure/metrics.py: summarize() over hand-built request records, numbers worked out by hand."""

import math
import random

import numpy as np
import pytest

from optimizer.measure.metrics import PERCENTILES, percentile, summarize
from optimizer.measure.replay import ReplayResult, RequestRecord

# A: sent on time at 0, 5 tokens in 5 one-token chunks 100 ms apart.
A = RequestRecord("a", 0.0, 0.0, 0.1, 0.5, (0.1, 0.2, 0.3, 0.4, 0.5), 10, 5, 5, True, 200)
# B: sent 100 ms late; 4 tokens in 2 chunks (the last one carries 3); asked for 8 (short output).
B = RequestRecord("b", 0.1, 0.2, 0.4, 1.0, (0.4, 1.0), 20, 4, 8, True, 200)
# C: HTTP 500.
C = RequestRecord("c", 0.3, 0.3, None, None, (), 30, 0, 8, False, 500, "boom")
RESULT = ReplayResult((A, B, C), window_s=1.0)


def test_counts_and_throughputs_use_completed_requests_over_the_window():
    m = summarize(RESULT)
    assert (m["requests"], m["completed"], m["output_tokens"], m["short_outputs"]) == (3, 2, 9, 1)
    assert m["error_rate"] == pytest.approx(1 / 3)
    assert m["duration_s"] == 1.0
    assert m["request_throughput"] == pytest.approx(2.0)
    assert m["output_throughput"] == pytest.approx(9.0)
    assert m["total_token_throughput"] == pytest.approx(9.0 + 10 + 20)  # the failed prompt does not count


def test_latencies_in_ms():
    m = summarize(RESULT)
    assert m["ttft_ms_mean"] == pytest.approx(150)  # 100 and 200
    assert m["e2el_ms_p50"] == pytest.approx(650)  # 500 and 800
    assert m["tpot_ms_mean"] == pytest.approx(150)  # (500-100)/4 = 100 and (1000-400)/3 = 200
    assert m["tpot_ms_p99"] == pytest.approx(199)


def test_itl_splits_a_multi_token_chunk_gap():
    m = summarize(RESULT)
    # A: four 100 ms gaps; B: one 600 ms gap carrying 3 tokens -> 200 ms each, three times.
    assert m["itl_ms_p50"] == pytest.approx(100)
    assert m["itl_ms_mean"] == pytest.approx((4 * 100 + 3 * 200) / 7)
    assert m["itl_ms_p99"] == pytest.approx(200)


def test_schedule_lag_counts_every_request():
    m = summarize(RESULT)
    assert m["schedule_lag_p50_ms"] == pytest.approx(0)
    assert m["schedule_lag_p99_ms"] == pytest.approx(98)  # lags 0, 0, 100 ms


def test_all_failed_gives_nan_latencies_and_zero_throughput():
    m = summarize(ReplayResult((C,), window_s=0.3))
    assert m["error_rate"] == 1.0 and m["output_throughput"] == 0.0
    assert all(math.isnan(m[f"{k}_ms_p95"]) for k in ("ttft", "tpot", "itl", "e2el"))


def test_one_token_output_has_no_tpot():
    one = RequestRecord("o", 0.0, 0.0, 0.2, 0.2, (0.2,), 5, 1, 1, True, 200)
    m = summarize(ReplayResult((one,), window_s=0.2))
    assert m["ttft_ms_p50"] == pytest.approx(200) and math.isnan(m["tpot_ms_p50"])


def test_percentile_matches_numpy():
    rng = random.Random(7)
    for n in (1, 2, 5, 100):
        values = [rng.uniform(0, 1000) for _ in range(n)]
        for q in PERCENTILES:
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], 50))


def test_itl_splits_a_multi_token_chunk_evenly_and_counts_every_token():
    from optimizer.measure.metrics import _itl

    # 6 output tokens in 3 chunks: 5 tokens after the first arrive in 2 gaps (0.1 s, 0.2 s)
    values = _itl((0.0, 0.1, 0.3), 6)
    assert len(values) == 5
    assert sum(values) == pytest.approx(300.0)
    assert sorted(values) == pytest.approx([100 / 3] * 3 + [100.0] * 2)
