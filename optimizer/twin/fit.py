"""Fit a linear step cost to real runs: the per-request times the replayer recorded, nothing else.

Given the schedule vLLM's scheduler makes for a run (which steps ran, what each held, which step
gave each request its first and last token), every measured time is linear in the coefficients:

    TTFT_i          = (start of the step in progress when i arrived - i's arrival) + intake
                      + the costs of the steps from that one to i's first token
    end_i - first_i = the costs of the steps after i's first token up to its last

so the coefficients are a non-negative least-squares solution, each row weighted by 1 / its
measured value (relative errors: a 20 ms TPOT and a 2 s TTFT count alike) and re-weighted once to
damp outliers (the real server stalls for 1-3 s at random). The schedule itself depends on the
costs (a faster step admits the next arrival sooner), so the fit alternates: simulate each run at
its real send times with the current costs, solve, simulate again, and keeps the coefficients
whose simulation matched the measured times best.

What is fitted is a set of terms (`Terms`): the linear step cost's own (`LINEAR`), or a correction
of a GPU step cost by a study's runs on that GPU (twin/gpu/correction.py). Each says what a step's
row of counts is for a run, and what cost to simulate a run with for given coefficients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from optimizer.twin.step_cost import COLUMN, FP8_FALLBACK, TERMS, LinearStepCost, StepShape

ITERATIONS = 16
DAMPING = 0.5  # each step moves half way from the current costs to the new solution: no oscillation
SPLIT_PENALTY = 0.01  # of the per-sequence column's own weight: decides only where the rows cannot
# The columns that give way in a tie (each toward 0, `SPLIT_PENALTY` of its own weight): the per-sequence
# decode cost to the step's fixed cost, the decode memory cost (each dtype's) to the decode context cost.
PENALIZED = (COLUMN["decode_seq_s"], COLUMN["decode_kv_s"], COLUMN["fp8_decode_kv_s"])
START = LinearStepCost((0.01, 1e-4, 1e-5, 1e-3, 1e-4, 1e-5, 1e-4, 1e-5, 1e-4, 1e-5), 0.005)


@dataclass
class MeasuredRun:
    """One real run to calibrate on: its twin server, the requests it sent, and what each took."""

    label: str
    server: object  # TwinServer
    requests: tuple  # workload Requests, in the order of `times`
    times: list[tuple[float, float | None, float | None, int, bool]]  # (sent, first token, end, output tokens, ok), s
    base: object = None  # the step cost a correction corrects for this run (twin/gpu/correction.py); None otherwise
    spans_only: bool = False  # fit its decode spans, not its TTFTs (the step probe's bursts: twin/probe.py)


class Terms(Protocol):
    """What a fit solves for: the coefficients of a step's counts, plus the intake."""

    size: int

    def row(self, run: MeasuredRun, shape: StepShape) -> np.ndarray: ...
    def make(self, coef: np.ndarray, intake: float, labels: tuple) -> object: ...
    def unpack(self, fitted) -> tuple[np.ndarray, float]: ...
    def cost_for(self, fitted, run: MeasuredRun): ...  # the StepCost the run is simulated with
    def fill(self, coef: np.ndarray, used: np.ndarray) -> None: ...  # coefficients no row informed


class LinearTerms:
    """The linear step cost's terms (step_cost.TERMS); fp8 costs what 16-bit costs without an fp8 run."""

    size = len(TERMS)

    def row(self, run, shape):
        return shape.features()

    def make(self, coef, intake, labels):
        return LinearStepCost(tuple(float(c) for c in coef), float(intake), calibrated_on=tuple(labels))

    def unpack(self, fitted):
        return np.array(fitted.coefficients), fitted.intake_s

    def cost_for(self, fitted, run):
        return fitted

    def fill(self, coef: np.ndarray, used: np.ndarray) -> None:
        for fp8, base in FP8_FALLBACK.items():  # no fp8 run to fit on: fp8 costs what bf16 costs
            if not used[fp8]:
                coef[fp8] = coef[base]


LINEAR = LinearTerms()


@dataclass
class FitResult:
    cost: object  # what `terms.make` builds: a LinearStepCost unless told otherwise
    error: float  # median |log(simulated / measured)| over the runs' TTFTs and end-first spans
    history: list[float] = field(default_factory=list)


def fit(runs: list[MeasuredRun], iterations: int = ITERATIONS, start=START, terms: Terms = LINEAR) -> FitResult:
    """The step cost (or correction: `terms`) whose simulation of `runs` at their real send times best
    matches them."""
    cost, best, history = start, None, []
    for _ in range(iterations):
        rows, targets, errors = [], [], []
        for run in runs:
            sim = run.server.run(run.requests, None, terms.cost_for(cost, run), send_times=[t[0] for t in run.times],
                                 keep_steps=True)
            r, t, e = _rows(run, sim, terms)
            rows += r
            targets += t
            errors += e
        error = float(np.median(errors)) if errors else math.inf
        history.append(error)
        if best is None or error < best.error:
            best = FitResult(cost, error)
        labels = tuple(r.label for r in runs)
        coef, intake = _solve(np.array(rows), np.array(targets), terms)
        old, old_intake = terms.unpack(cost)
        cost = terms.make((1 - DAMPING) * old + DAMPING * coef, (1 - DAMPING) * old_intake + DAMPING * intake, labels)
    best.history = history
    return best


def _rows(run: MeasuredRun, sim, terms: Terms) -> tuple[list, list, list]:
    log = sim.log
    feats = np.array([terms.row(run, s) for s in log.shapes]) if log.shapes else np.zeros((0, terms.size))
    cum = np.vstack([np.zeros(terms.size), np.cumsum(feats, axis=0)])
    rows, targets, errors = [], [], []
    for i, (sent, first, end, out, ok) in enumerate(run.times):
        steps = log.token_steps.get(i)
        if not ok or first is None or not steps or i not in log.first_step:
            continue
        j0, k1, kn = log.first_step[i], steps[0], steps[-1]
        const = log.starts[j0] - log.visible[i] if j0 < len(log.starts) else 0.0
        ttft = first - sent
        if ttft > 0 and not run.spans_only:
            rows.append(np.append(cum[k1 + 1] - cum[j0], 1.0))
            targets.append(ttft - const)
            sim_ttft = sim.result.records[i].first_chunk_s - sim.result.records[i].sent_s
            errors.append(abs(math.log(max(sim_ttft, 1e-6) / ttft)))
        span = (end - first) if end is not None else 0.0
        if out > 1 and span > 0 and kn > k1:
            rows.append(np.append(cum[kn + 1] - cum[k1 + 1], 0.0))
            targets.append(span)
            rec = sim.result.records[i]
            errors.append(abs(math.log(max(rec.end_s - rec.first_chunk_s, 1e-6) / span)))
    return rows, targets, errors


def _solve(rows: np.ndarray, targets: np.ndarray, terms: Terms) -> tuple[np.ndarray, float]:
    """Non-negative weighted least squares, then once more with outliers down-weighted (Huber-like).
    The per-sequence decode coefficient carries a small penalty (`SPLIT_PENALTY`): see `_penalty`."""
    from scipy.optimize import lsq_linear

    weight = 1.0 / np.maximum(np.abs(targets), 1e-3)
    scale = np.maximum(np.abs(rows).max(axis=0), 1e-12)  # columns on one scale; an empty column stays 0
    a = rows / scale
    used = np.abs(rows).max(axis=0) > 0
    x = np.zeros(rows.shape[1])
    for _ in range(2):
        aw, tw = a * weight[:, None], targets * weight
        extra = _penalty(aw, terms)
        aw, tw = np.vstack([aw, extra]), np.concatenate([tw, np.zeros(len(extra))])
        sol = lsq_linear(aw[:, used], tw, bounds=(0, np.inf))
        x[used] = sol.x
        residual = np.abs(a @ x - targets) * weight  # relative
        weight = weight / np.maximum(1.0, residual / 0.2)
    coef = x / scale
    terms.fill(coef, used)
    return coef[:-1], float(coef[-1])


def _penalty(weighted: np.ndarray, terms: Terms) -> np.ndarray:
    """Rows that pull the per-sequence decode cost and the decode memory costs towards 0, each
    weighted `SPLIT_PENALTY` of its column.

    Where every decode step holds the same number of sequences (a server at max-num-seqs 1), a
    step's fixed cost and its cost per decoding sequence are the same column in the decode rows, and
    splits that fit alike differ in what they say of a batch. The penalty settles such a tie on the
    fixed cost (a decode step reads the weights once whatever its batch); where the batch moves, the
    rows outweigh it. It does not make a run at one sequence informative about batches (its prefill
    steps hold no decoding sequence, so the tie is not exact there): envelope.py marks those
    predictions outside instead (docs/twin.md, "Fitting").

    Likewise, where no decoding sequences share a block (no prefix caching, or prompts that share
    nothing), a step's decode memory is its decode context, the same column. The tie goes to the
    context: a configuration that would share is then priced as if it shared nothing, too slow
    rather than too fast, until a run that shares tells the two apart."""
    if not isinstance(terms, LinearTerms):
        return np.zeros((0, weighted.shape[1]))
    rows = np.zeros((len(PENALIZED), weighted.shape[1]))
    for i, column in enumerate(PENALIZED):
        rows[i, column] = SPLIT_PENALTY * np.linalg.norm(weighted[:, column])
    return rows
