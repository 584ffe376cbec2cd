"""Noise control for the winner: re-measure the top configurations and say how sure we are.

One measurement per configuration is what the search affords, and on a busy machine the
same configuration moves 10-15% from run to run (measured). After the budget, the `top`
feasible configurations, and the baseline, are booted and measured `repeats` more times each
(full runs: no early stop): the gain over the baseline then carries both sides' noise. Each gets a mean and a 95% confidence interval (Student's t over its
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
from typing import Callable

import optuna

from optimizer.driver.measure_once import CONFIRM_KEY, measure_once
from optimizer.driver.plan import Plan
from optimizer.driver.progress import Progress
from optimizer.driver.store.driver_lock import RunState
from optimizer.measure.noise import interval, verdict
from optimizer.report.confirmed import ATTR, baseline_trial, candidates, settled
from optimizer.report.summary import knobs_of


def remeasure(study: optuna.Study, top: int, repeats: int, measure: Callable[[optuna.trial.FrozenTrial, int], float | None],
              on_value: Callable[[int, int, float | None], None] = lambda n, k, v: None) -> dict:
    """Measure each candidate, and the baseline, until it has 1 + `repeats` values (resuming from the
    study's record). `measure(trial, k)` boots and measures the trial's configuration (None: that run failed)."""
    record = dict(study.user_attrs.get(ATTR) or {})
    runs = dict(record.get("runs") or {})
    current = candidates(study, top)
    base = baseline_trial(study)
    if base is not None and (base.state != optuna.trial.TrialState.COMPLETE or not base.value):
        base = None  # a baseline that did not complete has nothing to re-measure
    for t in current + ([base] if base is not None and base.number not in {c.number for c in current} else []):
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
    names = [str(t.number) for t in current]
    # A configuration that failed a re-measurement is out: one good run does not make it reliable.
    intervals = [interval(int(n), runs[n]["values"]) for n in names if not runs[n]["failed"]]
    winner, clear = verdict(intervals, maximize)
    record = {"runs": runs, "repeats": repeats, "top": top, "candidates": names,
              "baseline": base.number if base is not None else None,
              "disqualified": [int(n) for n in names if runs[n]["failed"]],
              "intervals": {str(i.trial): {"mean": i.mean, "low": _finite(i.low), "high": _finite(i.high),
                                           "n": len(i.values)} for i in intervals},
              "winner": winner.trial if winner else None, "clear": clear}
    study.set_user_attr(ATTR, record)
    return record


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def confirmation_pending(study: optuna.Study, plan: Plan) -> bool:
    """The top (or the baseline: a study confirmed before the baseline was re-measured) still needs runs."""
    c = plan.cfg.confirm
    if not (c.top and c.repeats) or not candidates(study, c.top):
        return False
    return not settled(study, c.top, c.repeats) or _baseline_short(study, c.repeats)


def _baseline_short(study: optuna.Study, repeats: int) -> bool:
    base = baseline_trial(study)
    if base is None or base.state != optuna.trial.TrialState.COMPLETE or not base.value:
        return False
    entry = ((study.user_attrs.get(ATTR) or {}).get("runs") or {}).get(str(base.number)) or {}
    return len(entry.get("values") or []) + int(entry.get("failed") or 0) < 1 + repeats


def confirm_top(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState) -> None:
    """Re-measure the top configurations: full runs, no early stop."""
    c = plan.cfg.confirm
    progress.confirming(c.top, c.repeats)

    def measure(t: optuna.trial.FrozenTrial, k: int) -> float | None:
        params = knobs_of(t)  # as it ran: the baseline's fixed knobs and the rounded values included
        # Its own board key: the trial's verdicts and server are not its.
        return measure_once(plan, params, CONFIRM_KEY + t.number * 100 + k, f"trial-{t.number}/confirm-{k}",
                            board, progress, runstate)

    record = remeasure(study, c.top, c.repeats, measure, progress.confirm_value)
    progress.confirmed(record, plan.objective)
