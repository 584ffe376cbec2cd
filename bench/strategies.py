"""Tuning strategies replayed on a measured landscape (a lookup table: each point costs the seconds
it took to boot and measure), so strategies are compared on the same points and the same budget.

A landscape is a grid of points (a dict of knob values each), each with a score (higher is
better; 0 for a configuration that could not start or met no SLO), its boot seconds cold and
warm, and its replay seconds. A boot is cold the first time its compile key (the knobs in
vLLM's compile key: max-num-seqs, max-num-batched-tokens, KV dtype) is seen, warm after: the
study's compile cache. A strategy that draws a value off the grid (a free integer range) runs
the nearest grid point's score, but a value not drawn before is a new compile key: cold.

The strategies:
    ours          as `run` searches: TPE (4 start-up trials, constant liar; one joint density
                  over the knobs, as Optuna 5 does by default for one objective), the compile-key
                  knobs drawn on their log scale and run at the nearest rung (ladders), exact
                  repeats of a finished point told its value without a boot (8 in a row end
                  the search: it has converged), and early stop
                  (a point that cannot come within the margin of the best is cut after the
                  first of 4 stages: a quarter of its replay)
    screen        as `run` searches by default (`search.screen`): the baseline, then each knob moved
                  alone from it (an integer knob doubled, or halved at the top of its range; a
                  choice the next one), then TPE as `ours` over the knobs whose move changed the
                  score by more than 15% (verdict/screening.py's rule), the others held at the
                  baseline's values until TPE proposes 4 measured points in a row (then every
                  knob is free); the baseline and the screening points are told to TPE first
    ours_base     `ours` with the baseline as its first trial, as `run` queues it
    ours_indep    the same with independent TPE (one density per knob, Optuna 4's default and
                  Optuna 5's for several objectives: it cannot model how knobs interact)
    gp            the same, with Optuna's GPSampler (4 start-up trials)
    random        random search without replacement over the grid
    auto_tune     vLLM's auto_tune.sh: the grid over max-num-seqs x max-num-batched-tokens in
                  its nested order, the other knobs at vLLM's defaults; each point pays a run at
                  an unbounded rate and one at the lowered rate that meets the SLO (its loop
                  lowers the rate until it does: at least two runs; two are counted)
    sweep         `vllm bench sweep`: the Cartesian product of every knob's values, in order
    atv           auto-tuning-vllm (openshift-psap/auto-tuning-vllm) as its code runs: trial 0
                  boots vLLM's defaults with no sampled parameter (so its TPE has a trial
                  without them and samples each knob on its own), then plain TPE (10 random
                  start-up trials, no pruner, no early stop); integer knobs are linear ranges
                  with a step (never log), the others categorical lists; a run that started
                  is told COMPLETE with its value even at zero goodput, only a configuration
                  that could not start is told FAIL; a repeat is booted again
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

COMPILE_KEY = ("max-num-seqs", "max-num-batched-tokens", "kv-cache-dtype")
INT_KNOBS = ("max-num-seqs", "max-num-batched-tokens")
DEFAULTS = {"enable-prefix-caching": True, "kv-cache-dtype": "auto"}  # vLLM's, for auto_tune
EARLY_STOP_MARGIN = 0.1
STAGES = 4


@dataclass(frozen=True)
class Point:
    params: dict
    score: float
    boot_cold_s: float
    boot_warm_s: float
    replay_s: float
    started: bool = True  # False: the configuration could not start (its score is 0)


@dataclass
class Landscape:
    grid: dict  # knob -> the values measured, in order
    points: dict = field(default_factory=dict)  # key(params) -> Point

    @property
    def best(self) -> float:
        return max(p.score for p in self.points.values())

    def at(self, params: dict) -> Point:
        return self.points[key(params)]

    def nearest(self, params: dict) -> dict:
        """The grid point nearest `params` (integers in log space, the rest as given)."""
        out = {}
        for k, values in self.grid.items():
            v = params.get(k, DEFAULTS.get(k))
            out[k] = min(values, key=lambda g: abs(math.log(g / v))) if k in INT_KNOBS else v
        return out


def key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


@dataclass
class Run:
    """What a strategy did: per boot, the seconds spent so far and the best score so far."""

    boots: list = field(default_factory=list)  # (cumulative seconds, best so far) after each boot
    booted: list = field(default_factory=list)  # the grid point each boot measured
    seen_keys: set = field(default_factory=set)
    asks: int = 0  # trials a sampler asked for, repeats told without a boot included
    spent: float = 0.0
    best: float = 0.0

    def boot(self, land: Landscape, params: dict, compile_key: tuple, replay_share: float = 1.0,
             replays: int = 1) -> float:
        point = land.at(params)
        cold = compile_key not in self.seen_keys
        self.seen_keys.add(compile_key)
        self.spent += (point.boot_cold_s if cold else point.boot_warm_s) + replays * replay_share * point.replay_s
        self.best = max(self.best, point.score)
        self.boots.append((self.spent, self.best))
        self.booted.append(dict(params))
        return point.score

    def to_target(self, target: float) -> tuple[float, float]:
        """(boots, seconds) until the best reached `target` (inf when it never did)."""
        for i, (spent, best) in enumerate(self.boots):
            if best >= target:
                return i + 1, spent
        return math.inf, math.inf

    def best_after(self, boots: int) -> float:
        return self.boots[min(boots, len(self.boots)) - 1][1] if self.boots else 0.0


def compile_key(params: dict) -> tuple:
    return tuple(params[k] for k in COMPILE_KEY)


def _optuna_search(land: Landscape, sampler, max_boots: int, ladder: bool, repeat_skip: bool, early_stop: bool,
                   fail_starts: bool = False, first: tuple = (), held: Callable[[int], dict] = lambda streak: {},
                   linear: bool = False, unsampled_first: dict | None = None, skip_failed_repeats: bool = True) -> Run:
    """Ask, boot, tell until `max_boots` boots, or, as `run` does, until the sampler proposed
    CONVERGED_AFTER configurations in a row that it had been told (repeats cost no boot).
    `first`: points enqueued before the sampler's own; `held(streak)`: knobs not drawn, at these values.
    `linear`: integer knobs drawn on a linear range with the grid's smallest step (else log).
    `unsampled_first`: the first trial suggests nothing and runs these values (vLLM's defaults).
    With `fail_starts`, only a point that could not start is told FAIL; the others their score."""
    import optuna

    from optimizer.search.convergence import CONVERGED_AFTER

    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params in first:
        study.enqueue_trial(params)
    run, told, streak = Run(), {}, 0
    while len(run.boots) < max_boots and streak < CONVERGED_AFTER:
        run.asks += 1
        trial = study.ask()
        fixed = {} if len(study.trials) <= len(first) else held(streak)
        if unsampled_first is not None and len(study.trials) == 1:
            fixed = dict(unsampled_first)
        drawn = dict(fixed)
        for k, values in land.grid.items():
            if k in fixed:
                continue
            if k in INT_KNOBS and linear:
                step = min(b - a for a, b in zip(sorted(values), sorted(values)[1:]))
                drawn[k] = trial.suggest_int(k, min(values), max(values), step=step)
            elif k in INT_KNOBS:
                drawn[k] = trial.suggest_int(k, min(values), max(values), log=True)
            else:
                drawn[k] = trial.suggest_categorical(k, values)
        params = land.nearest(drawn)
        ran = params if ladder else drawn  # a free draw is its own compile key
        if key(ran) in told and (repeat_skip or (skip_failed_repeats and told[key(ran)] is None)):
            value = told[key(ran)]
            _tell(study, trial, value, fail_starts)
            streak += 1
            continue
        streak = 0
        score = land.at(params).score
        share = 1.0
        if early_stop and run.best > 0 and score < run.best / (1 + EARLY_STOP_MARGIN):
            share = 1 / STAGES  # cut after the first stage: cannot win
        run.boot(land, params, compile_key(ran), share)
        value = (score if land.at(params).started else None) if fail_starts else (None if score <= 0 else score)
        told[key(ran)] = value
        _tell(study, trial, value, fail_starts)
    return run


def _tell(study, trial, value: float | None, fail_starts: bool) -> None:
    import optuna

    if value is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL if fail_starts else optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, value)


def ours(land: Landscape, seed: int, max_boots: int) -> Run:
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4)
    return _optuna_search(land, sampler, max_boots, ladder=True, repeat_skip=True, early_stop=True)


# The baseline an operator might run today on the landscape: a cautious max-num-seqs, the middle
# batched-token budget, vLLM's defaults for the rest.
BASELINE = {"max-num-seqs": 16, "max-num-batched-tokens": 1024, "kv-cache-dtype": "auto", "enable-prefix-caching": True}


def ours_base(land: Landscape, seed: int, max_boots: int, baseline: dict | None = None) -> Run:
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4)
    return _optuna_search(land, sampler, max_boots, ladder=True, repeat_skip=True, early_stop=True,
                          first=(dict(baseline or BASELINE),))


def screening_points(land: Landscape, baseline: dict) -> list[dict]:
    """The baseline, then each knob moved alone one step: an integer knob to the next grid value up
    (down at the top of its range; the grid's steps are 2-4x, as `run`'s doubling), a choice to
    the next one."""
    out = [dict(baseline)]
    for k, values in land.grid.items():
        if k in INT_KNOBS:
            above = [v for v in values if v > baseline[k]]
            new = min(above) if above else max(v for v in values if v < baseline[k])
        else:
            new = values[(values.index(baseline[k]) + 1) % len(values)]
        out.append({**baseline, k: new})
    return out


def minimal_boots(land: Landscape, run: Run, baseline: dict) -> tuple[int, dict]:
    """The minimal-change step after `run`, on the landscape's scores (no noise: a reversion within
    15% of the winner is reverted, as measure/reversion.py's tolerance): its boots (a reversion the
    search already booted costs none) and the configuration it recommends."""
    from optimizer.measure.reversion import TOLERANCE

    winner = max(run.booted, key=lambda p: land.at(p).score)
    seen, boots = {key(p) for p in run.booted}, 0

    def measured(p: dict) -> float:
        nonlocal boots
        if key(p) not in seen:
            seen.add(key(p))
            boots += 1
        return land.at(p).score

    best = land.at(winner).score
    reverted = [k for k in winner if winner[k] != baseline[k]
                and measured({**winner, k: baseline[k]}) * (1 + TOLERANCE) >= best]
    final = {**winner, **{k: baseline[k] for k in reverted}}
    if len(reverted) > 1 and measured(final) * (1 + TOLERANCE) < best:
        cheapest = max(reverted, key=lambda k: land.at({**winner, k: baseline[k]}).score)
        final = {**winner, cheapest: baseline[cheapest]}
    return boots, final


def screen(land: Landscape, seed: int, max_boots: int, baseline: dict | None = None) -> Run:
    import optuna

    from optimizer.search.screening import RELEASE_AFTER
    from optimizer.verdict.screening import shows_effect

    baseline = dict(baseline or BASELINE)
    points = screening_points(land, baseline)

    released = []

    def held(streak: int) -> dict:
        if streak >= RELEASE_AFTER or released:  # nothing new among the screened knobs: move them all
            released.append(True)
            return {}
        base = land.at(baseline).score
        out = {}
        for p in points[1:]:
            knob = next(k for k in p if p[k] != baseline[k])
            score = land.at(p).score
            stopped = base > 0 and 0 < score < base / (1 + EARLY_STOP_MARGIN)
            if base > 0 and (score <= 0 or not shows_effect(score / base, stopped_early=stopped)):
                out[knob] = baseline[knob]
        return out

    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4)
    return _optuna_search(land, sampler, max_boots, ladder=True, repeat_skip=True, early_stop=True,
                          first=tuple(points), held=held)


def ours_indep(land: Landscape, seed: int, max_boots: int) -> Run:
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=4, multivariate=False)
    return _optuna_search(land, sampler, max_boots, ladder=True, repeat_skip=True, early_stop=True)


def gp(land: Landscape, seed: int, max_boots: int) -> Run:
    import optuna

    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=4)
    return _optuna_search(land, sampler, max_boots, ladder=True, repeat_skip=True, early_stop=True)


# vLLM 0.32's own values on this CPU platform where a flag is not given (`vllm serve` resolves them:
# twin/vllm_scheduler.py's shape_of), for the knobs of the landscape's grid.
VLLM_DEFAULTS = {"max-num-seqs": 128, "max-num-batched-tokens": 2048, "kv-cache-dtype": "auto",
                 "enable-prefix-caching": True}


def atv(land: Landscape, seed: int, max_boots: int) -> Run:
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed)  # 10 random start-up trials, univariate, no liar
    return _optuna_search(land, sampler, max_boots, ladder=False, repeat_skip=False, early_stop=False,
                          fail_starts=True, linear=True, unsampled_first=VLLM_DEFAULTS, skip_failed_repeats=False)


def random_search(land: Landscape, seed: int, max_boots: int) -> Run:
    import random

    order = list(land.points.values())
    random.Random(seed).shuffle(order)
    run = Run()
    for p in order[:max_boots]:
        run.boot(land, p.params, compile_key(p.params))
    return run


def auto_tune(land: Landscape, seed: int, max_boots: int) -> Run:
    run = Run()
    for seqs, tokens in itertools.product(land.grid["max-num-seqs"], land.grid["max-num-batched-tokens"]):
        params = land.nearest({"max-num-seqs": seqs, "max-num-batched-tokens": tokens})
        if len(run.boots) < max_boots:
            run.boot(land, params, compile_key(params), replays=2)
    return run


def sweep(land: Landscape, seed: int, max_boots: int) -> Run:
    run = Run()
    for values in itertools.product(*land.grid.values()):
        if len(run.boots) < max_boots:
            params = dict(zip(land.grid, values))
            run.boot(land, params, compile_key(params))
    return run


STRATEGIES = {"ours": ours, "ours_base": ours_base, "screen": screen, "ours_indep": ours_indep, "gp": gp, "random": random_search, "auto_tune": auto_tune, "sweep": sweep, "atv": atv}
DETERMINISTIC = ("auto_tune", "sweep")  # the same run for every seed
