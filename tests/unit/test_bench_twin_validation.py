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


def _ctx(values: list[float], repeats: dict) -> "tv.Context":
    """A rag-probe-like set: one run per configuration at `values` output tok/s, and `repeats`
    (configuration -> its runs' tok/s)."""
    from optimizer.measure.slo import parse_slos

    def row(v):
        return {"metrics": {"output_throughput": v, "duration_s": 10.0}, "requests": []}

    reps = {k: [row(v) for v in vs] for k, vs in repeats.items()}
    return tv.Context("rag-probe", None, parse_slos("ttft:3000"), [row(v) for v in values], reps)


def test_the_spearman_ceiling_is_one_without_noise_and_falls_where_configurations_tie():
    spaced = [100.0 * 2 ** i for i in range(12)]
    assert tv.noise_spearman(_ctx(spaced, {"a": [50.0, 50.0], "b": [80.0, 80.0]})) == pytest.approx(1.0)
    noisy = {"a": [97.0, 103.0, 100.0], "b": [98.0, 102.0]}  # a ~2% run-to-run spread
    assert tv.noise_spearman(_ctx(spaced, noisy)) > 0.99  # configurations 2x apart: noise cannot reorder them
    tied = [100.0 + 0.5 * i for i in range(12)]  # 12 configurations within 6% of each other
    assert tv.noise_spearman(_ctx(tied, noisy)) < 0.8
    assert tv.noise_spearman(_ctx(tied, {})) is None  # no repeats: no noise to say anything with


def _target(seqs: int) -> dict:
    return {"params": {"max-num-seqs": seqs}, "metrics": {"output_throughput": 0.0, "duration_s": 10.0}, "requests": []}


def test_the_ranking_against_each_configurations_mean_averages_its_runs_and_needs_repeats_of_every_one():
    targets = [_target(s) for s in (4, 8, 16)]
    runs = {4: [100.0, 120.0], 8: [200.0, 100.0, 90.0], 16: [300.0, 280.0]}  # means 110, 130, 290
    ctx = _ctx([], {tv.landscape.key({"max-num-seqs": s}): vs for s, vs in runs.items()})
    rho, top = tv._against_means(ctx, targets, [1.0, 2.0, 3.0])  # the twin's order: 4 < 8 < 16
    assert rho == pytest.approx(1.0) and top is True
    rho, _ = tv._against_means(ctx, targets, [3.0, 2.0, 1.0])
    assert rho == pytest.approx(-1.0)
    del ctx.repeats[tv.landscape.key({"max-num-seqs": 8})]
    assert tv._against_means(ctx, targets, [1.0, 2.0, 3.0]) == (None, None)  # one configuration ran once
