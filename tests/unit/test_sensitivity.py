"""One-factor sensitivity: which value each knob moves to, and how an effect is judged against
the best configuration's noise band."""

from __future__ import annotations

import pytest

from optimizer import sensitivity
from optimizer.errors import ConfigError
from optimizer.space import KNOBS, Dimension, SearchSpace


def _space():
    return SearchSpace((
        Dimension(KNOBS["max-num-seqs"], 4, 64, log=True),
        Dimension(KNOBS["gpu-memory-utilization"], 0.2, 0.6),
        Dimension(KNOBS["kv-cache-dtype"], choices=("auto", "fp8")),
    ))


def test_each_knob_moves_one_step_inside_its_range():
    best = {"max-num-seqs": 16, "gpu-memory-utilization": 0.3, "kv-cache-dtype": "auto"}
    assert sensitivity.moves(best, _space()) == [
        ("max-num-seqs", 16, 32), ("gpu-memory-utilization", 0.3, 0.4), ("kv-cache-dtype", "auto", "fp8")]


def test_a_knob_at_the_top_of_its_range_moves_down():
    best = {"max-num-seqs": 64, "gpu-memory-utilization": 0.6, "kv-cache-dtype": "fp8"}
    assert sensitivity.moves(best, _space()) == [
        ("max-num-seqs", 64, 32), ("gpu-memory-utilization", 0.6, 0.5), ("kv-cache-dtype", "fp8", "auto")]


def test_chosen_knobs_and_values():
    best = {"max-num-seqs": 16, "gpu-memory-utilization": 0.3, "kv-cache-dtype": "auto"}
    assert sensitivity.moves(best, _space(), ["max-num-seqs"], {"max-num-seqs": 8}) == [("max-num-seqs", 16, 8)]
    with pytest.raises(ConfigError, match="'block-size' is not a knob of this study's space"):
        sensitivity.moves(best, _space(), ["block-size"])
    with pytest.raises(ConfigError, match="--to kv-cache-dtype=... names a knob not being moved"):
        sensitivity.moves(best, _space(), ["max-num-seqs"], {"kv-cache-dtype": "fp8"})


def test_effect_inside_the_band_is_noise_outside_is_better_or_worse():
    noise = sensitivity.band([500.0, 520.0, 540.0])  # p95 TTFT, ms: lower is better
    assert noise.low < 500 and noise.high > 540
    same = sensitivity.effect("max-num-seqs", 16, 32, 530.0, noise, maximize=False)
    assert same["verdict"] == "within noise" and same["ratio"] == pytest.approx(520 / 530)
    worse = sensitivity.effect("max-num-seqs", 16, 4, 2000.0, noise, maximize=False)
    assert worse["verdict"] == "worse" and worse["ratio"] == pytest.approx(0.26)
    better = sensitivity.effect("x", 1, 2, 100.0, noise, maximize=False)
    assert better["verdict"] == "better" and better["ratio"] == pytest.approx(5.2)
    failed = sensitivity.effect("x", 1, 2, None, noise, maximize=False)
    assert failed["verdict"] == "failed" and failed["ratio"] is None


def test_throughput_direction_and_a_single_measurement_has_no_band():
    one = sensitivity.band([1000.0])
    row = sensitivity.effect("max-num-seqs", 16, 32, 1200.0, one, maximize=True)
    assert row["ratio"] == pytest.approx(1.2) and row["band_low"] is None
    assert row["verdict"] == "better (no band: one measurement of the best)"
    assert "no band" in sensitivity.describe(row, "tok/s")
