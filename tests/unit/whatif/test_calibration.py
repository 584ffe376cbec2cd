"""whatif/calibration.py: a known bias is removed, the band comes from the residuals on a log
scale and widens with fewer points, and without points it is the validated prior."""

from __future__ import annotations

import math

import pytest

from optimizer.whatif import calibration as cal


def _pairs(n, bias=2.0, spread=(1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9, 1.05, 0.95)):
    """Measured = predicted x bias x a residual; the residuals' pattern repeats."""
    out = []
    for i in range(n):
        predicted = {"ttft_s": 0.1 * (i + 1), "tpot_s": 0.01 * (i + 1), "throughput": 100.0 * (i + 1)}
        measured = {k: v * bias * spread[i % len(spread)] for k, v in predicted.items()}
        out.append((measured, predicted))
    return out


def test_a_known_bias_is_removed():
    c = cal.fit(_pairs(10, spread=(1.0,)))
    for m in cal.METRICS:
        assert c.factors[m] == pytest.approx(2.0)
        assert c.apply(m, 5.0) == pytest.approx(10.0)
        assert c.bands[m] == pytest.approx(0.0, abs=1e-12)  # no residual left


def test_the_band_is_the_residuals_t_interval_for_one_more_point_and_widens_with_fewer_points():
    ten, three = cal.fit(_pairs(10)), cal.fit(_pairs(3))
    logs = [math.log(s) for s in (1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9, 1.05, 0.95)]
    mean = sum(logs) / 10
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 9)
    assert ten.bands["tpot_s"] == pytest.approx(1.833 * sd * math.sqrt(1 + 1 / 10))  # t90 at 9 df
    assert three.bands["tpot_s"] > ten.bands["tpot_s"]  # t90 at 2 df is 2.92
    assert three.points["tpot_s"] == 3 and ten.percent("tpot_s") == pytest.approx(math.exp(ten.bands["tpot_s"]) - 1)


def test_fewer_than_three_points_correct_but_print_the_prior():
    two = cal.fit(_pairs(2))
    assert two.factors["ttft_s"] == pytest.approx(2.0 * math.sqrt(1.1), rel=1e-9)
    assert two.bands == cal.PRIOR


def test_without_points_nothing_is_corrected_and_the_band_is_the_prior_with_why():
    c = cal.none("the study ran on CPU: no GPU measurement to calibrate on")
    assert c.factors == {m: 1.0 for m in cal.METRICS} and c.bands == cal.PRIOR
    assert c.basis.startswith("the study ran on CPU") and not any(c.points.values())


def test_the_range_stays_positive_however_wide_the_band():
    c = cal.none("x")
    low, high = c.range("ttft_s", 0.2)
    assert 0 < low < 0.2 < high and low * high == pytest.approx(0.04)


def test_metrics_missing_on_either_side_are_left_out():
    pairs = [({"ttft_s": 0.2}, {"ttft_s": 0.1, "tpot_s": 0.01}), ({"ttft_s": 0.4, "tpot_s": 0}, {"ttft_s": 0.2, "tpot_s": 0.02})]
    c = cal.fit(pairs)
    assert c.points == {"ttft_s": 2, "tpot_s": 0, "throughput": 0} and c.factors["tpot_s"] == 1.0


def test_a_correction_carries_to_another_device_without_ttft_and_with_a_wider_band():
    c = cal.fit(_pairs(10), "10 trials on h100", "h100", "library")
    assert c.for_row("h100", "library") is c
    other = c.for_row("h200", "library")
    assert other.factors["tpot_s"] == c.factors["tpot_s"] and other.factors["ttft_s"] == 1.0
    assert other.bands["ttft_s"] == cal.PRIOR["ttft_s"]
    assert other.bands["tpot_s"] == pytest.approx(math.hypot(c.bands["tpot_s"], cal.TRANSFER["tpot_s"]))
    assert other.basis == "10 trials on h100, carried to h200 (TTFT not)"


def test_a_correction_is_never_applied_to_the_other_estimators_figures():
    c = cal.fit(_pairs(10), "10 trials on h100", "h100", "library")
    rooflines = c.for_row("l4", "roofline")
    assert rooflines.factors == {m: 1.0 for m in cal.METRICS} and rooflines.bands == cal.PRIOR
    assert rooflines.basis == "10 trials on h100, predicted by the library there: not applied to the roofline's"
