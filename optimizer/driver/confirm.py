"""Noise control for the winner: re-measure the top configurations and say how sure we are.

One measurement per configuration is what the search affords, and on a busy machine the
same configuration moves 10-15% from run to run (measured). After the budget, the `top`
feasible configurations, and the baseline, are booted and measured up to `repeats` more times
each (full runs: no early stop), the leader (the best single run) first. Every verdict uses the
one statistic of measure/noise.py: geometric means, the noise of one run pooled over every
repeated run. A configuration that is already measurably worse than the leader, with the noise
pooled so far, is not booted again (more runs of it cannot make it win); a baseline skipped so
keeps its one run for the gain (docs/search.md#re-measurement). The winner is the best geometric mean; it is clear when
every other candidate is measurably worse, else the report says "no clear winner". A
configuration with a failed re-measurement is disqualified (listed, never the winner). New
trials after a confirmation (a raised budget) make it stale: it is done again for the new top.

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
from optimizer.measure.noise import geomean, ratio, settled
from optimizer.record import remeasured
from optimizer.verdict import confirmed
from optimizer.verdict.confirmed import baseline_trial, candidates, changed_knobs, decide, noise_of
from optimizer.verdict.trials import knobs_of


def remeasure(study: optuna.Study, top: int, repeats: int, measure: Callable[[optuna.trial.FrozenTrial, int], float | None],
              on_value: Callable[[int, int, float | None], None] = lambda n, k, v: None,
              on_settled: Callable[[int, dict], None] = lambda n, r: None) -> dict:
    """Measure each candidate, and the baseline, until it has 1 + `repeats` values or is settled
    (already measurably worse than the leader: module docstring), resuming from the study's record.
    `measure(trial, k)` boots and measures the trial's configuration (None: that run failed)."""
    record = remeasured.confirmation_as_stored(study)
    runs = dict(record.get("runs") or {})
    current = candidates(study, top)
    base = baseline_trial(study)
    if base is not None and (base.state != optuna.trial.TrialState.COMPLETE or not base.value):
        base = None  # a baseline that did not complete has nothing to re-measure
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    names = [str(t.number) for t in current]
    for t in current + ([base] if base is not None and base.number not in {c.number for c in current} else []):
        entry = runs.get(str(t.number)) or {"values": [t.value], "failed": 0}
        runs[str(t.number)] = entry
        while not _done(entry, repeats):
            leader = _leader(runs, names, maximize)
            if leader != str(t.number) and settled(entry["values"], runs[leader]["values"],
                                                   noise_of(study, runs), maximize):
                entry["settled"] = leader
                on_settled(t.number, ratio(entry["values"], runs[leader]["values"], noise_of(study, runs)).as_dict())
                break
            value = measure(t, len(entry["values"]) + entry["failed"])
            if value is None or not math.isfinite(value) or value <= 0:
                entry["failed"] += 1
            else:
                entry["values"].append(value)
            on_value(t.number, len(entry["values"]) + entry["failed"] - 1, value)
            remeasured.write_confirmation(study, {**record, "runs": runs})  # after every run: an interruption loses one
    record = {"runs": runs, "repeats": repeats, "top": top, "candidates": names,
              "baseline": base.number if base is not None else None,
              **decide(runs, names, noise_of(study, runs), maximize, changed_knobs(study, names))}
    remeasured.write_confirmation(study, record)
    return record


def _done(entry: dict, repeats: int) -> bool:
    return len(entry["values"]) + entry["failed"] >= 1 + repeats or bool(entry.get("settled"))


def _leader(runs: dict, names: list[str], maximize: bool) -> str:
    """The candidate with the best geometric mean so far, among those with no failed run."""
    ok = [n for n in names if n in runs and not runs[n]["failed"]] or names[:1]
    return sorted(ok, key=lambda n: geomean(runs[n]["values"]), reverse=maximize)[0]


def confirmation_pending(study: optuna.Study, plan: Plan) -> bool:
    """The top (or the baseline: a study confirmed before the baseline was re-measured) still needs runs."""
    c = plan.cfg.confirm
    if not (c.top and c.repeats) or not candidates(study, c.top):
        return False
    return not confirmed.settled(study, c.top, c.repeats) or _baseline_short(study, c.repeats)


def _baseline_short(study: optuna.Study, repeats: int) -> bool:
    base = baseline_trial(study)
    if base is None or base.state != optuna.trial.TrialState.COMPLETE or not base.value:
        return False
    runs = remeasured.read_confirmation(study).runs.get(base.number) or remeasured.Runs()
    return runs.settled is None and len(runs.values) + runs.failed < 1 + repeats


def confirm_top(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState) -> None:
    """Re-measure the top configurations: full runs, no early stop."""
    c = plan.cfg.confirm
    progress.confirming(c.top, c.repeats)

    def measure(t: optuna.trial.FrozenTrial, k: int) -> float | None:
        params = knobs_of(t)  # as it ran: the baseline's fixed knobs and the rounded values included
        # Its own board key: the trial's verdicts and server are not its.
        return measure_once(plan, params, CONFIRM_KEY + t.number * 100 + k, f"trial-{t.number}/confirm-{k}",
                            board, progress, runstate)

    record = remeasure(study, c.top, c.repeats, measure, progress.confirm_value, progress.confirm_settled)
    progress.confirmed(remeasured.Confirmation.of(record), plan.objective)
