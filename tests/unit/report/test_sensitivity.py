"""One-factor sensitivity: which value each knob moves to, and how an effect is judged against
the best configuration's noise band."""

from __future__ import annotations

import pytest

from optimizer.config.space import KNOBS, Dimension, SearchSpace
from optimizer.errors import ConfigError
from optimizer.search import sensitivity as driven
from optimizer.text import sensitivity as words
from optimizer.verdict import sensitivity


def _space():
    return SearchSpace((
        Dimension(KNOBS["max-num-seqs"], 4, 64, log=True),
        Dimension(KNOBS["gpu-memory-utilization"], 0.2, 0.6),
        Dimension(KNOBS["kv-cache-dtype"], choices=("auto", "fp8")),
    ))


def test_each_knob_moves_one_step_inside_its_range():
    best = {"max-num-seqs": 16, "gpu-memory-utilization": 0.3, "kv-cache-dtype": "auto"}
    assert driven.moves(best, _space()) == [
        ("max-num-seqs", 16, 32), ("gpu-memory-utilization", 0.3, 0.4), ("kv-cache-dtype", "auto", "fp8")]


def test_a_knob_at_the_top_of_its_range_moves_down():
    best = {"max-num-seqs": 64, "gpu-memory-utilization": 0.6, "kv-cache-dtype": "fp8"}
    assert driven.moves(best, _space()) == [
        ("max-num-seqs", 64, 32), ("gpu-memory-utilization", 0.6, 0.5), ("kv-cache-dtype", "fp8", "auto")]


def test_chosen_knobs_and_values():
    best = {"max-num-seqs": 16, "gpu-memory-utilization": 0.3, "kv-cache-dtype": "auto"}
    assert driven.moves(best, _space(), ["max-num-seqs"], {"max-num-seqs": 8}) == [("max-num-seqs", 16, 8)]
    with pytest.raises(ConfigError, match="'block-size' is not a knob of this study's space"):
        driven.moves(best, _space(), ["block-size"])
    with pytest.raises(ConfigError, match="--to kv-cache-dtype=... names a knob not being moved"):
        driven.moves(best, _space(), ["max-num-seqs"], {"kv-cache-dtype": "fp8"})


def test_effect_inside_the_band_is_noise_outside_is_better_or_worse():
    noise = sensitivity.band([500.0, 520.0, 540.0])  # p95 TTFT, ms: lower is better
    assert noise.low < 500 and noise.high > 540
    same = sensitivity.effect("max-num-seqs", 16, 32, 530.0, noise, maximize=False)
    assert same["verdict"] == "within noise" and same["ratio"] == pytest.approx((500.0 * 520.0 * 540.0) ** (1 / 3) / 530)
    worse = sensitivity.effect("max-num-seqs", 16, 4, 2000.0, noise, maximize=False)
    assert worse["verdict"] == "worse" and worse["ratio"] == pytest.approx((500.0 * 520.0 * 540.0) ** (1 / 3) / 2000)
    better = sensitivity.effect("x", 1, 2, 100.0, noise, maximize=False)
    assert better["verdict"] == "better" and better["ratio"] == pytest.approx((500.0 * 520.0 * 540.0) ** (1 / 3) / 100)
    failed = sensitivity.effect("x", 1, 2, None, noise, maximize=False)
    assert failed["verdict"] == "failed" and failed["ratio"] is None


def test_throughput_direction_and_a_single_measurement_has_no_band():
    one = sensitivity.band([1000.0])
    row = sensitivity.effect("max-num-seqs", 16, 32, 1200.0, one, maximize=True)
    assert row["ratio"] == pytest.approx(1.2) and row["band_low"] is None
    assert row["verdict"] == "better (no band: nothing measured twice)"
    assert "no band" in words.describe(row, "tok/s")


@pytest.mark.parametrize("n", [2, 3, 6])
def test_a_knob_that_does_nothing_stays_within_noise_95_percent_of_the_time(n):
    """The band is for one new run of the same configuration (a prediction interval): simulated
    with normal noise, an unchanged configuration's run lands inside it ~95% of the time, for any
    number of measurements of the best (the interval of the mean would catch it far less often)."""
    import random

    rng = random.Random(n)
    inside, rounds = 0, 4000
    for _ in range(rounds):
        noise = sensitivity.band([rng.gauss(500, 40) for _ in range(n)])
        inside += noise.low <= rng.gauss(500, 40) <= noise.high
    assert 0.93 <= inside / rounds <= 0.97


def test_a_zero_throughput_run_is_worse_with_ratio_zero_and_describable():
    row = sensitivity.effect("max-num-seqs", 16, 1, 0.0, sensitivity.band([5.0, 5.2, 4.8]), maximize=True)
    assert row["ratio"] == 0.0 and row["verdict"] == "worse"
    zero_latency = sensitivity.effect("x", 1, 2, 0.0, sensitivity.band([5.0, 5.2]), maximize=False)
    assert zero_latency["ratio"] is None
    assert "no ratio to the best's mean" in words.describe(zero_latency, "ms")
