"""bench/strategies.py: the strategy simulators on a tiny hand-made landscape whose answer is known
(the best needs fp8, which auto_tune.sh's grid never tries; the sweep reaches it at a known boot)."""

import itertools
import math
import sys
from pathlib import Path

import optuna
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import strategies as st  # noqa: E402

from optimizer.search.convergence import CONVERGED_AFTER  # noqa: E402

GRID = {"max-num-seqs": [8, 16, 32, 64], "max-num-batched-tokens": [256, 1024],
        "kv-cache-dtype": ["auto", "fp8"], "enable-prefix-caching": [True, False]}


def score(p: dict) -> float:
    """More sequences help until the bf16 cache runs out at 64 (fp8 holds them); prefix caching helps."""
    s = {8: 10, 16: 20, 32: 40, 64: 80}[p["max-num-seqs"]]
    if p["max-num-seqs"] == 64 and p["kv-cache-dtype"] == "auto":
        s = 30  # preempted
    s *= 1.25 if p["enable-prefix-caching"] else 1.0
    s *= 1.1 if p["max-num-batched-tokens"] == 1024 else 1.0
    return s


@pytest.fixture(scope="module")
def land() -> st.Landscape:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    points = {}
    for values in itertools.product(*GRID.values()):
        p = dict(zip(GRID, values))
        points[st.key(p)] = st.Point(p, score(p), boot_cold_s=60.0, boot_warm_s=35.0, replay_s=20.0)
    return st.Landscape(GRID, points)


def test_the_landscape_best_is_the_hand_made_one(land):
    assert land.best == pytest.approx(80 * 1.25 * 1.1)
    best = max(land.points.values(), key=lambda p: p.score).params
    assert best == {"max-num-seqs": 64, "max-num-batched-tokens": 1024, "kv-cache-dtype": "fp8",
                    "enable-prefix-caching": True}


def test_the_sweep_reaches_the_best_at_its_cartesian_position_and_pays_cold_then_warm(land):
    run = st.sweep(land, 0, 32)
    order = [dict(zip(GRID, v)) for v in itertools.product(*GRID.values())]
    position = order.index({"max-num-seqs": 64, "max-num-batched-tokens": 1024, "kv-cache-dtype": "fp8",
                            "enable-prefix-caching": True}) + 1
    boots, seconds = run.to_target(0.95 * land.best)
    assert boots == position == 31
    # prefix caching on/off (the last knob) share a compile key: the first of each pair is cold
    assert seconds == sum(60 + 20 if i % 2 == 0 else 35 + 20 for i in range(position))


def test_auto_tune_never_tries_fp8_so_it_never_reaches_the_best(land):
    run = st.auto_tune(land, 0, 48)
    assert len(run.boots) == 8 and all(p["kv-cache-dtype"] == "auto" and p["enable-prefix-caching"] for p in run.booted)
    assert run.to_target(0.95 * land.best) == (math.inf, math.inf)
    assert run.boots[0][0] == 60 + 2 * 20  # a boot and two replays (unbounded rate, then the lowered one)


def test_random_search_never_boots_a_point_twice_and_finds_the_best_within_the_grid(land):
    for seed in range(5):
        run = st.random_search(land, seed, 32)
        assert len({st.key(p) for p in run.booted}) == 32 and run.to_target(land.best)[0] <= 32


@pytest.mark.parametrize("strategy", [st.ours, st.ours_indep])
def test_ours_never_boots_a_configuration_twice_and_cuts_losers(land, strategy):
    run = strategy(land, 0, 16)
    # 16 boots, or fewer once the sampler proposed CONVERGED_AFTER told configurations in a row
    assert len(run.boots) == 16 or (len(run.boots) >= 12 and run.asks - len(run.boots) >= CONVERGED_AFTER)
    keys = [st.key(p) for p in run.booted]
    assert len(keys) == len(set(keys))  # exact repeats are told, not booted
    assert all(v in GRID[k] for p in run.booted for k, v in p.items())  # ladders: only grid values run
    # early stop: a boot that could not win paid a quarter of its replay
    full, cut = 60 + 20, 60 + 20 / 4
    steps = [b - a for a, b in zip([0.0] + [s for s, _ in run.boots], [s for s, _ in run.boots])]
    assert any(step in (cut, 35 + 20 / 4) for step in steps) and steps[0] == full


def test_free_ranges_compile_every_new_value(land):
    run = st.atv(land, 0, 20)
    assert len(run.boots) == 20
    grid_keys = {st.compile_key(p) for p in run.booted}  # what the same boots would compile on ladders
    steps = [b - a for a, b in zip([0.0] + [s for s, _ in run.boots], [s for s, _ in run.boots])]
    assert sum(1 for step in steps if step == 60 + 20) == len(run.seen_keys) > len(grid_keys)


def test_goodput_counts_the_requests_that_met_both_slos_per_second():
    import search_efficiency as se

    # [sent, first token, end, prompt tokens, output tokens, ok]; the window is 0 -> 10 s
    requests = [[0.0, 0.5, 2.5, 100, 41, True],  # TTFT 500 ms, TPOT 50 ms: meets both
                [1.0, 3.0, 4.0, 100, 11, True],  # TTFT 2000 ms: misses
                [2.0, 2.2, 10.0, 100, 41, True],  # TPOT 195 ms: misses
                [3.0, None, None, 100, 0, False]]  # failed
    assert se.goodput(requests, ttft_ms=1500, tpot_ms=50) == pytest.approx(1 / 10)
    assert se.goodput(requests, ttft_ms=2000, tpot_ms=200) == pytest.approx(3 / 10)
    assert se.goodput([], 1500, 50) == 0.0


@pytest.mark.parametrize("strategy", [st.ours, st.ours_indep])
def test_ours_stops_when_the_sampler_keeps_proposing_what_it_was_told(land, strategy):
    run = strategy(land, 1, 1000)  # a budget past the grid's 32 points: only convergence ends it
    assert len(run.boots) <= len(land.points) and run.asks >= len(run.boots) + CONVERGED_AFTER


def test_atv_runs_as_auto_tuning_vllm_does(land, monkeypatch):
    """Trial 0 is vLLM's defaults with nothing sampled; integer knobs are linear ranges; a run that
    started is told its value even at 0; only a configuration that could not start is told FAIL."""
    points = dict(land.points)
    for p in list(points.values()):
        if p.params["max-num-seqs"] == 8:  # started, met no SLO
            points[st.key(p.params)] = st.Point(p.params, 0.0, 60.0, 35.0, 20.0)
        if p.params["max-num-seqs"] == 64 and p.params["kv-cache-dtype"] == "auto":  # could not start
            points[st.key(p.params)] = st.Point(p.params, 0.0, 60.0, 35.0, 20.0, started=False)
    lossy = st.Landscape(GRID, points)
    told = []
    real = st._tell

    def tell(study, trial, value, fail_starts):
        told.append((dict(trial.params), value))
        real(study, trial, value, fail_starts)

    monkeypatch.setattr(st, "_tell", tell)
    run = st.atv(lossy, 0, 30)
    assert run.booted[0] == lossy.nearest(st.VLLM_DEFAULTS) and told[0][0] == {}  # nothing sampled
    seqs = {p["max-num-seqs"] for p, _ in told[1:]}
    assert seqs - set(GRID["max-num-seqs"])  # drawn on a linear range with a step, off the grid's rungs
    for (params, value), booted in zip(told, run.booted):
        point = lossy.at(booted)
        assert value == (point.score if point.started else None)
    assert any(v == 0.0 for _, v in told) and any(v is None for _, v in told)


def test_a_point_measured_more_than_once_scores_the_mean_of_its_runs():
    import search_efficiency as se

    params = {"max-num-seqs": 8, "max-num-batched-tokens": 256, "kv-cache-dtype": "auto", "enable-prefix-caching": True}
    other = {**params, "max-num-seqs": 16}
    fast = [[0.0, 0.1, 1.1, 100, 11, True], [9.0, 9.1, 10.0, 100, 11, True]]  # both good, window 10 s: 0.2
    slow = [[0.0, 0.1, 1.1, 100, 11, True], [9.0, 9.1, 20.0, 100, 11, True]]  # one good, window 20 s: 0.05

    def row(p, requests, repeat=0, cache="hit"):
        return {"params": p, "repeat": repeat, "ok": True, "requests": requests,
                "phases": {"startup_s": 30.0, "replay_s": 10.0 + 10 * repeat}, "startup": {"compile_cache": cache}}

    rows = {"a": row(params, fast, cache="miss"), "a #1": row(params, slow, 1), "b": row(other, fast)}
    land = se.build(rows, ttft_ms=1000, tpot_ms=200)
    assert land.at(params).score == pytest.approx((0.2 + 0.05) / 2)
    assert land.at(params).replay_s == pytest.approx(15.0)
    assert land.at(other).score == pytest.approx(0.2)
