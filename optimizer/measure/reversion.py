"""The smallest change that carries the gain: the operator's "one variable at a time against the
baseline", run backwards from the winner.

For each knob the winner changed, the winner is measured with that one knob put back (to the
baseline's value, or to the value that fits the workload when the baseline's does not). Then
every reverted knob is put back at once and measured: kept if still within the noise of the
winner, else only the cheapest single reversion stands (it was measured on its own) and the row
says why.

Each verdict is sequential: it stops measuring as soon as it is made. After each run, with the
95% interval of (reverted / winner) on the one statistic of measure/noise.py (log scale, the
noise of one run pooled over every repeated run):
- wholly on the worse side of 1: measurably worse, the knob is kept (no further run can undo it);
- otherwise, when the measured effect is under TOLERANCE (15%): reverted;
- otherwise (worse by more than 15% but within the noise): one more run, up to `max_runs`;
  after the last, reverted unless measurably worse (the rule a fixed `max_runs` runs would apply).
Within the noise is no reason to revert when the noise is so wide that the interval reaches the
baseline's level (putting the knob back might lose the whole gain, when that gain is more than
TOLERANCE): the runs cannot tell "no effect" from "all of it". Such a knob is measured up to `max_runs`, and then, still that wide,
it is **undecided**: kept at the winner's value, its row naming how far runs of one
configuration moved (something else was using the machine), never reverted on a guess.
The caller's `measure(config, k)` returns the objective's value of the k-th run of `config`, or
None when that run failed; it may answer from runs the study already made (driver/minimal.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from optimizer.measure.noise import Ratio, geomean, pooled, ratio

REVERTED, KEPT, UNMEASURED, UNDECIDED = "reverted", "kept", "not measured", "undecided"


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
    config: dict = field(default_factory=dict)  # the configuration measured

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

    def __init__(self, groups: list[list[float]], measure: Callable[[dict, int], float | None], cap: int,
                 spent: Callable[[], int] | None, free: Callable[[dict], int], whole: float | None = None):
        self.groups, self.measure, self.cap, self.calls = [list(g) for g in groups], measure, cap, 0
        self.spent, self.free = spent or (lambda: self.calls), free
        self.whole = whole  # reverted / winner at the baseline's level: the whole gain lost (None: unknown)

    @property
    def boots(self) -> int:
        return self.spent()

    def judge(self, row: Row, config: dict, reference: list[float], maximize: bool, max_runs: int) -> None:
        """Measure `config` until the verdict is made (module docstring), and set it on `row`. The
        runs the study already has (`free(config)` of them) are all read before the first verdict."""
        row.config, free = config, self.free(config)
        self.groups.append(row.values)  # its repeated runs say something about the noise too
        while self.boots < self.cap or len(row.values) < free:  # a run already made costs no boot
            value = self.measure(config, len(row.values))
            self.calls += 1
            if value is None or value <= 0:
                row.failed, row.verdict = True, KEPT
                row.note = "putting it back failed the run (or missed the SLOs)"
                return
            row.values.append(value)
            if len(row.values) < free:
                continue
            noise = pooled(self._groups(row)) or pooled([reference])
            if noise is None:
                row.verdict, row.note = UNMEASURED, "no repeated runs to judge the noise by"
                return
            row.effect = ratio(row.values, reference, noise)
            verdict = decide(row.effect, maximize, last=len(row.values) >= max(max_runs, free), whole=self.whole)
            if verdict == UNDECIDED:
                row.note = (f"undecided: runs of one configuration moved {self.spread():.1f}x, so its interval reaches "
                            "the baseline's level; something else may be using the machine")
            if verdict:
                row.verdict = verdict
                return
        if not row.values:
            row.note = "the cap on extra boots was reached first"
        else:
            row.verdict, row.note = KEPT, "the cap on extra boots was reached before a clear verdict"


    def spread(self) -> float:
        """The most runs of one configuration moved: the largest max / min over the repeated runs."""
        return max((max(g) / min(g) for g in self.groups if len(g) >= 2 and min(g) > 0), default=1.0)

    def _groups(self, row: Row) -> list[list[float]]:
        """Every repeated run once: the row's own runs, and the groups given except one the row's runs
        begin with (a reversion that is the baseline, or a candidate, reads that group's runs)."""
        n = len(row.values)
        return [g for g in self.groups if g is row.values or not (g and len(g) <= n and row.values[:len(g)] == g)]


def decide(effect: Ratio, maximize: bool, last: bool, whole: float | None = None) -> str:
    """The verdict after a run (KEPT, REVERTED, UNDECIDED), or '' for one more run (module docstring).
    `whole`: the ratio reverted / winner at which the whole gain over the baseline is lost."""
    if effect.worse(maximize):
        return KEPT
    if whole is not None and (effect.low <= whole if maximize else effect.high >= whole):
        return UNDECIDED if last else ""  # the interval reaches the baseline's level
    loss = 1 / effect.ratio if maximize else effect.ratio
    return REVERTED if last or loss <= 1 + TOLERANCE else ""


# A measured effect under this is not worth another run to tell from noise (single runs move 10-15% here).
TOLERANCE = 0.15


def minimal_change(winner: dict, baseline: dict, revert_to: dict, winner_values: list[float],
                   groups: list[list[float]], measure: Callable[[dict, int], float | None], maximize: bool,
                   max_runs: int = 3, cap: int = 8, on_row: Callable[[Row], None] = lambda row: None,
                   spent: Callable[[], int] | None = None, free: Callable[[dict], int] = lambda config: 0,
                   baseline_values: list[float] | None = None) -> Outcome:
    """Run the reversions (module docstring). `revert_to[knob]` is what each changed knob goes back
    to; `groups` are the repeated runs already made (confirmation), `winner_values` among them.
    `cap` bounds the boots, `spent()` counts them (default: every call of `measure` is one);
    `free(config)` is how many of `config`'s runs the study already has (read before any verdict);
    `baseline_values`, the baseline's runs, set the level at which a reversion lost the whole gain."""
    runs = _Runs(groups, measure, cap, spent, free, _whole_gain_lost(baseline_values, winner_values, maximize))
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


def _whole_gain_lost(baseline_values: list[float] | None, winner_values: list[float], maximize: bool) -> float | None:
    """reverted / winner at the baseline's level, when the winner's gain over the baseline is more
    than TOLERANCE (a smaller gain is all within what a reversion may lose anyway): else None."""
    if not baseline_values or not winner_values:
        return None
    whole = geomean(baseline_values) / geomean(winner_values)
    gain = 1 / whole if maximize else whole
    return whole if gain > 1 + TOLERANCE else None


def _loss(row: Row, maximize: bool) -> float:
    """How much worse than the winner the reversion measured (smaller is cheaper)."""
    r = row.effect.ratio if row.effect else float("inf")
    return 1 / r if maximize else r
