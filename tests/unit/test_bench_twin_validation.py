"""bench/twin_validation.py's signed error by batch: the bias a median |error| hides."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import twin_validation as tv  # noqa: E402


def test_errors_of_opposite_sign_at_small_and_large_batches_are_kept_apart_per_dtype():
    params = [{"max-num-seqs": 8, "kv-cache-dtype": "auto"}, {"max-num-seqs": 8, "kv-cache-dtype": "auto"},
              {"max-num-seqs": 64, "kv-cache-dtype": "auto"}, {"max-num-seqs": 64, "kv-cache-dtype": "fp8_e4m3"}]
    meas = [{"request_throughput": 1.0, "tpot_ms_p50": 10.0}] * 4
    preds = [{"request_throughput": 0.5, "tpot_ms_p50": 20.0}, {"request_throughput": 2.0, "tpot_ms_p50": 20.0},
             {"request_throughput": 1.25, "tpot_ms_p50": 8.0}, {"request_throughput": 1.0, "tpot_ms_p50": 0.0}]
    got = tv.signed_by_batch(params, preds, meas)
    assert list(got) == [(8, "16-bit"), (64, "16-bit"), (64, "fp8")]
    assert got[(8, "16-bit")] == pytest.approx((0.0, 1.0))  # 0.5x and 2x: a geometric mean of 1; TPOT 2x
    assert got[(64, "16-bit")] == pytest.approx((0.25, -0.2))
    assert got[(64, "fp8")][0] == pytest.approx(0.0) and math.isnan(got[(64, "fp8")][1])  # no TPOT predicted
