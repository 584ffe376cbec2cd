"""The smallest change that carries the gain: the operator's "one variable at a time against the
baseline", run backwards from the winner.

For each knob the winner changed, the winner is measured with that one knob put back (to the
baseline's value, or to the value that fits the workload when the baseline's does not). A knob
whose reversion is not measurably worse than the winner is reverted; one whose reversion is
worse, judged on repeated runs (one bad run may be a stall), is kept. Then every reverted knob
is put back at once and measured: kept if still within the noise of the winner, else only the
cheapest single reversion stands (it was measured on its own) and the row says why.

"Measurably worse": the 95% interval of (reverted / winner) lies wholly on the worse side of 1.
The noise is pooled over every configuration measured more than once (measure/noise.py), so
one reverted run is judged against the prediction interval of one run, the band the
confirmation already estimates. The caller's `measure(config, k)` returns the objective's
value of the k-th run of `config`, or None when that run failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from optimizer.measure.noise import Ratio, pooled, ratio

REVERTED, KEPT, UNMEASURED = "reverted", "kept", "not measured"


@dataclass
class Row:
    """One knob the winner changed: what putting it back measured, and the verdict."""

    knob: str
    baseline: object  # the baseline's value (None: not set, vLLM's default)
    winner: object
    reverted_to: object  # what it was put back to (None: the flag dropped)
    values: list[float] = field(default_factory=list)
    failed: bool = False
    effect: Ratio | None = None  # reverted / winner
    verdict: str = UNMEASURED
    note: str = ""

    def as_dict(self) -> dict:
        return {"knob": self.knob, "baseline": self.baseline, "winner": self.winner, "reverted_to": self.reverted_to,
                "values": self.values, "failed": self.failed, "effect": self.effect.as_dict() if self.effect else None,
                "verdict": self.verdict, "note": self.note}


@dataclass
class Outcome:
    rows: list[Row]
    final: dict  # the configuration recommended (knob -> value; a knob set to None is left to vLLM)
    final_values: list[float]
    combined: Row | None = None  # every reverted knob put back at once (when more than one was)
    boots: int = 0


def with_reverted(config: dict, changes: dict) -> dict:
    """`config` with `changes` applied; a change to None drops the knob (vLLM's default)."""
    out = dict(config)
    for knob, value in changes.items():
        if value is None:
            out.pop(knob, None)
        else:
            out[knob] = value
    return out


class _Runs:
    """Measurements made so far, for the pooled noise and the boot cap."""

    def __init__(self, groups: list[list[float]], measure: Callable[[dict, int], float | None], cap: int):
        self.groups, self.measure, self.cap, self.boots = [list(g) for g in groups], measure, cap, 0

    def judge(self, row: Row, config: dict, reference: list[float], maximize: bool, max_runs: int) -> None:
        """Measure `config` until the verdict is clear (at most `max_runs` runs), and set it on `row`."""
        self.groups.append(row.values)  # its repeated runs say something about the noise too
        while self.boots < self.cap:
            value = self.measure(config, len(row.values))
            self.boots += 1
            if value is None or value <= 0:
                row.failed, row.verdict = True, KEPT
                row.note = "putting it back failed the run (or missed the SLOs)"
                return
            row.values.append(value)
            noise = pooled(self.groups) or pooled([reference])
            if noise is None:
                row.verdict, row.note = UNMEASURED, "no repeated runs to judge the noise by"
                return
            row.effect = ratio(row.values, reference, noise)
            if not row.effect.worse(maximize):
                row.verdict = REVERTED
                return
            if len(row.values) >= max_runs:
                row.verdict = KEPT
                return
        if not row.values:
            row.note = "the cap on extra boots was reached first"
        else:
            row.verdict, row.note = KEPT, "the cap on extra boots was reached before a clear verdict"


def minimal_change(winner: dict, baseline: dict, revert_to: dict, winner_values: list[float],
                   groups: list[list[float]], measure: Callable[[dict, int], float | None], maximize: bool,
                   max_runs: int = 2, cap: int = 8, on_row: Callable[[Row], None] = lambda row: None) -> Outcome:
    """Run the reversions (module docstring). `revert_to[knob]` is what each changed knob goes back
    to; `groups` are the repeated runs already made (confirmation), `winner_values` among them."""
    runs = _Runs(groups, measure, cap)
    rows = []
    for knob, back in revert_to.items():
        row = Row(knob, baseline.get(knob), winner.get(knob), back)
        runs.judge(row, with_reverted(winner, {knob: back}), winner_values, maximize, max_runs)
        rows.append(row)
        on_row(row)
    reverted = [r for r in rows if r.verdict == REVERTED]
    if not reverted:
        return Outcome(rows, dict(winner), list(winner_values), boots=runs.boots)
    if len(reverted) == 1:
        only = reverted[0]
        return Outcome(rows, with_reverted(winner, {only.knob: only.reverted_to}), list(only.values), boots=runs.boots)
    together = {r.knob: r.reverted_to for r in reverted}
    combined = Row("+".join(together), None, None, None)
    runs.judge(combined, with_reverted(winner, together), winner_values, maximize, max_runs)
    on_row(combined)
    if combined.verdict == REVERTED:
        return Outcome(rows, with_reverted(winner, together), list(combined.values), combined, runs.boots)
    cheapest = min(reverted, key=lambda r: _loss(r, maximize))
    why = {KEPT: "hurt", UNMEASURED: "could not be measured (the cap on extra boots)"}.get(combined.verdict, "hurt")
    if combined.failed:
        why = "failed the run"
    for r in reverted:
        if r is not cheapest:
            r.verdict, r.note = KEPT, f"reverted alone it stayed within noise, but reverted with {cheapest.knob} it {why}"
    return Outcome(rows, with_reverted(winner, {cheapest.knob: cheapest.reverted_to}), list(cheapest.values),
                   combined, runs.boots)


def _loss(row: Row, maximize: bool) -> float:
    """How much worse than the winner the reversion measured (smaller is cheaper)."""
    r = row.effect.ratio if row.effect else float("inf")
    return 1 / r if maximize else r
