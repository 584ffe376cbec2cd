"""The minimal-change step on real servers: after the confirmation, each knob the confirmed winner
changed from the baseline is put back, one at a time, and measured (measure/reversion.py decides);
what had no measurable effect goes back to the baseline's value, and the recommendation is the
smallest measured change that carries the gain (verdict/recommendation.py).

What a knob goes back to: the baseline's value; vLLM's own default (the flag dropped) for a knob
the baseline does not set; for `max-model-len`, when the baseline's value is below the
workload's longest request, the smallest round value that fits (config/round_values.py).

A run the study already has with exactly a reversion's flags (a search trial, its
re-measurements, the baseline's runs: verdict/evidence.py) answers without a boot, and each row
records the runs it rests on. Every other run is a full measurement through the same Ray path
as the confirmation's (measure_once), so on a cluster it lands on any free slot. The record lives on the study (`minimal`), written
after every run: an interrupted step resumes where it stopped, without booting again what it
already measured.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import optuna

from optimizer.config.round_values import fitting_model_len
from optimizer.driver.launch import make_spec
from optimizer.driver.measure_once import CONFIRM_KEY, measure_once
from optimizer.driver.plan import Plan, baseline_params
from optimizer.driver.progress import Progress
from optimizer.driver.store.driver_lock import RunState
from optimizer.measure.reversion import minimal_change
from optimizer.record import remeasured
from optimizer.verdict import confirmed
from optimizer.verdict.evidence import config_key, evidence
from optimizer.verdict.recommendation import minimal_record
from optimizer.verdict.trials import knobs_of

MINIMAL_KEY = CONFIRM_KEY // 2  # board keys of these runs: above any trial number, below confirmation's


def _metrics_of(run: Path) -> dict | None:
    """The metrics of one of the step's runs (its result.json), for the capacity plan."""
    try:
        return json.loads((run / "result.json").read_text()).get("metrics") or None
    except (OSError, ValueError):
        return None


def run_dir(slot: int) -> str:
    """Where the runs of the step's `slot`-th configuration keep their files, under artifacts/<study>/."""
    return f"minimal/config-{slot}"


class _Runs:
    """Answers `measure(config, k)` for the reversion rule: from the runs the study already has
    (verdict/evidence.py), then from the step's own record (an interrupted step resumes), then by
    booting; `sources` keeps, per configuration, where each run came from."""

    def __init__(self, known: dict, record: dict, boot, save):
        self.known, self.record, self.boot, self.save, self.sources = known, record, boot, save, {}

    def measure(self, config: dict, k: int) -> float | None:
        key = config_key(config)
        prior, used = self.known.get(key, []), self.sources.setdefault(key, [])
        if k < len(prior):  # measured already, in the search or the confirmation: no boot
            used.append(prior[k][1])
            return prior[k][0]
        own = self.record["runs"]
        runs = own.get(key, [])
        slot = list(own).index(key) if key in own else len(own)
        j = k - len(prior)
        used.append(f"{run_dir(slot)}/run-{j}")
        if j < len(runs):
            return runs[j]  # measured before an interruption: not booted again
        value = self.boot(config, slot, j)
        own[key] = [*runs, value]
        self.save()
        return value


def _first_run(key: str, record: dict, known: dict) -> str | None:
    """Where the recommended configuration's first run keeps its files: a search trial's, or the step's own."""
    if known.get(key):
        label = known[key][0][1]
        return f"trial-{label.split()[1]}" if " re-measure" not in label else None
    return f"{run_dir(list(record['runs']).index(key))}/run-0" if key in record["runs"] else None


def _row(row, sources: dict) -> dict:
    """A row as stored, with the runs it rests on (trials of the search, re-measurements, its own runs)."""
    return {**row.as_dict(), "runs_from": sources.get(config_key(row.config), [])[:len(row.values) + row.failed]}


def _measured(trial) -> bool:
    return trial is not None and trial.state == optuna.trial.TrialState.COMPLETE and bool(trial.value)


def minimal_pending(study: optuna.Study, plan: Plan) -> bool:
    """The step is asked for, a confirmed winner stands, and no finished record describes it."""
    return (plan.cfg.confirm.minimal and len(study.directions) == 1 and confirmed.current_winner(study) is not None
            and minimal_record(study) is None)


def reversions(winner: dict, baseline: dict, plan: Plan) -> dict:
    """knob -> the value it goes back to, for each knob the winner changed (module docstring)."""
    longest = plan.workload.longest_request()
    out = {}
    for knob in list(winner) + [k for k in baseline if k not in winner]:
        back = baseline.get(knob)
        if knob == "max-model-len" and back is not None and int(back) < longest:
            back = fitting_model_len(longest, plan.space.block, plan.model.max_positions)
        if back != winner.get(knob):
            out[knob] = back
    return out


def minimize(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState) -> dict:
    """Run the step for the confirmed winner; returns (and stores) its record."""
    conf = confirmed.read(study)  # one snapshot: the winner and its runs
    number = conf.current_winner
    winner = knobs_of(study.trials[number])
    base = confirmed.baseline_trial(study)
    baseline = knobs_of(base) if base is not None else baseline_params(plan)
    back = reversions(winner, baseline, plan)
    old = remeasured.minimal_as_stored(study)
    record = {"winner": number, "runs": dict(old.get("runs") or {}) if old.get("winner") == number else {}}
    started = time.monotonic() - ((old.get("wall_s") or 0.0) if record["runs"] else 0.0)  # resumed: time so far
    progress.minimizing(number, back, plan.cfg.confirm.minimal_boots)

    known = evidence(study)

    def boot(config: dict, slot: int, j: int) -> float | None:
        return measure_once(plan, config, MINIMAL_KEY + slot * 10 + j, f"{run_dir(slot)}/run-{j}",
                            board, progress, runstate, within_slos=True)

    def save() -> None:  # after every run: an interruption loses one at most
        remeasured.write_minimal(study, copy.deepcopy({**record, "wall_s": time.monotonic() - started}))

    runs = _Runs(known, record, boot, save)
    values = conf.values(number)
    outcome = minimal_change(winner, baseline, back, values, conf.every_values(), runs.measure,
                             maximize=study.direction == optuna.study.StudyDirection.MAXIMIZE,
                             cap=plan.cfg.confirm.minimal_boots, on_row=progress.reverted,
                             spent=lambda: sum(len(r) for r in record["runs"].values()),
                             free=lambda config: len(known.get(config_key(config), [])),
                             baseline_values=(conf.values(base.number) or [base.value]) if _measured(base) else None)
    sources = runs.sources
    args = list(make_spec(number, plan, outcome.final, "-").vllm_args)
    final_key = config_key(outcome.final)
    where = _first_run(final_key, record, known)
    metrics = _metrics_of(plan.artifacts / where) if where else None
    boots = sum(len(runs) for runs in record["runs"].values())  # those its own runs answered are not boots
    candidates = [str(n) for n in conf.candidates] if conf.candidates is not None else None
    record.update(done=True, candidates=candidates, repeats=conf.repeats, boots=boots,
                  wall_s=round(time.monotonic() - started, 1), rows=[_row(r, sources) for r in outcome.rows],
                  combined=_row(outcome.combined, sources) if outcome.combined else None,
                  final={"knobs": outcome.final, "args": args, "values": outcome.final_values, "dir": where,
                         "metrics": metrics})
    remeasured.write_minimal(study, record)
    progress.minimized(record, plan.objective)
    return record
