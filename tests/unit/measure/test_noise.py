"""measure/noise.py: the one statistic, at the two levels the project prints (95% for comparisons,
90% for the what-if band)."""

import math

import pytest

def test_where_one_more_point_lands_is_one_statistic_at_either_level():
    from optimizer.measure.noise import Noise, estimate, next_point_band, pooled, t_quantile

    values = [100.0, 120.0, 90.0, 110.0]
    logs = [math.log(v) for v in values]
    one = estimate(0, values, pooled([values]), one_run=True)
    half = math.log(one.high / one.mean)
    assert next_point_band(logs) == pytest.approx(half)  # 95%: what a re-measured run's range uses
    assert t_quantile(9, 0.90) == 1.833 and t_quantile(11, 0.90) == 1.812  # between rows: the lower df's
    assert next_point_band(logs, 0.90) == pytest.approx(half * t_quantile(3, 0.90) / t_quantile(3, 0.95))
    assert isinstance(pooled([values]), Noise)
