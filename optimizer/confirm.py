"""Noise control for the winner: re-measure the top configurations and say how sure we are.

One measurement per configuration is what the search affords, and on a busy machine the
same configuration moves 10-15% from run to run (measured). After the budget, the `top`
feasible configurations are booted and measured `repeats` more times each (full runs:
no early stop). Each gets a mean and a 95% confidence interval (Student's t over its
measurements, the search's own one included); the winner is the best mean, and when its
interval overlaps the runner-up's the report says "no clear winner". A configuration with a
failed re-measurement is disqualified (listed, never the winner). New trials after a
confirmation (a raised budget) make it stale: it is done again for the new top.

Results live on the study (`confirmation` user attribute), so an interrupted run resumes
where it stopped and the dashboard shows them. Re-measurements are not Optuna trials:
they would count against the budget and let a lucky repeat become "best".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import optuna

ATTR = "confirmation"
# Two-sided 95% Student's t quantiles by degrees of freedom (n - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


@dataclass(frozen=True)
class Interval:
    trial: int
    values: tuple[float, ...]
    mean: float
    low: float
    high: float

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high


def interval(trial: int, values: list[float], one_run: bool = False) -> Interval:
    """Mean and 95% t-interval of `values`: of their mean, or with `one_run` of where one more run
    lands (a prediction interval, sqrt(1 + 1/n) instead of sqrt(1/n)). A single value: an interval
    of zero width is not claimed; low/high are -inf/inf."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(trial, tuple(values), mean, -math.inf, math.inf)
    spread = math.sqrt(1 + 1 / len(values)) if one_run else 1 / math.sqrt(len(values))
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) * spread
    return Interval(trial, tuple(values), mean, mean - half, mean + half)


def candidates(study: optuna.Study, top: int) -> list[optuna.trial.FrozenTrial]:
    """The `top` best feasible COMPLETE trials, one per configuration, best first."""
    if top <= 0 or len(study.directions) > 1:
        return []
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if all(c <= 0 for c in (t.constraints or {}).values())]
    done.sort(key=lambda t: -t.value if maximize else t.value)
    out, seen = [], set()
    for t in done:
        key = tuple(t.user_attrs.get("vllm_args") or sorted(t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def verdict(intervals: list[Interval], maximize: bool) -> tuple[Interval | None, bool]:
    """The winner (best mean) and whether it is clear (its interval overlaps no other's)."""
    if not intervals:
        return None, False
    ranked = sorted(intervals, key=lambda i: -i.mean if maximize else i.mean)
    winner = ranked[0]
    return winner, all(not winner.overlaps(other) for other in ranked[1:])


def remeasure(study: optuna.Study, top: int, repeats: int, measure: Callable[[optuna.trial.FrozenTrial, int], float | None],
              on_value: Callable[[int, int, float | None], None] = lambda n, k, v: None) -> dict:
    """Measure each candidate until it has 1 + `repeats` values (resuming from the study's record).
    `measure(trial, k)` boots and measures the trial's configuration (None: that run failed)."""
    record = dict(study.user_attrs.get(ATTR) or {})
    runs = dict(record.get("runs") or {})
    for t in candidates(study, top):
        entry = runs.get(str(t.number)) or {"values": [t.value], "failed": 0}
        while len(entry["values"]) + entry["failed"] < 1 + repeats:
            value = measure(t, len(entry["values"]) + entry["failed"])
            if value is None or not math.isfinite(value):
                entry["failed"] += 1
            else:
                entry["values"].append(value)
            on_value(t.number, len(entry["values"]) + entry["failed"] - 1, value)
            runs[str(t.number)] = entry
            study.set_user_attr(ATTR, {**record, "runs": runs})  # after every run: an interruption loses one
        runs[str(t.number)] = entry
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    current = [str(t.number) for t in candidates(study, top)]
    # A configuration that failed a re-measurement is out: one good run does not make it reliable.
    intervals = [interval(int(n), runs[n]["values"]) for n in current if not runs[n]["failed"]]
    winner, clear = verdict(intervals, maximize)
    record = {"runs": runs, "repeats": repeats, "top": top, "candidates": current,
              "disqualified": [int(n) for n in current if runs[n]["failed"]],
              "intervals": {str(i.trial): {"mean": i.mean, "low": _finite(i.low), "high": _finite(i.high),
                                           "n": len(i.values)} for i in intervals},
              "winner": winner.trial if winner else None, "clear": clear}
    study.set_user_attr(ATTR, record)
    return record


def settled(study: optuna.Study, top: int, repeats: int) -> bool:
    """Confirmation is done for the study's current top configurations (new trials may have
    changed them since, or the settings may differ)."""
    record = study.user_attrs.get(ATTR) or {}
    return ("winner" in record and record.get("repeats") == repeats and record.get("top") == top
            and record.get("candidates") == [str(t.number) for t in candidates(study, top)])


def current_winner(study: optuna.Study) -> int | None:
    """The confirmed winner, if the confirmation still describes the study's top configurations."""
    record = study.user_attrs.get(ATTR) or {}
    if record.get("winner") is None or not settled(study, record.get("top", 0), record.get("repeats", 0)):
        return None
    return record["winner"]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
