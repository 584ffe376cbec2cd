"""`sensitivity`: re-measure the best configuration with one knob moved at a time, the
single-variable experiment operators run by hand, each effect shown against the noise band.

A knob moves one step from the best's value: a numeric knob doubles (a log range) or moves by a
quarter of its range, upward unless that leaves the range; a categorical knob takes the next
choice. `--to knob=value` picks the value instead. Each run is a full measurement (no early
stop, driver/measure_once.py), stored under `artifacts/<study>/sensitivity/<knob>/`; the results
go to the study's `sensitivity` user attribute (the report shows them). The band where one more
run of the best lands, and each move's verdict, are verdict/sensitivity.py's; a row's words are
text/sensitivity.py's.
"""

from __future__ import annotations

import argparse

from optimizer.cli.common import OBJECTIVE_FLAGS, STUDY_FLAGS, add_flags, load
from optimizer.config.flags import from_cli_args
from optimizer.errors import ConfigError
from optimizer.record import remeasured
from optimizer.text.sensitivity import describe
from optimizer.verdict.recommendation import recommend
from optimizer.search.sensitivity import moves
from optimizer.verdict.sensitivity import band, best_trial, effect
from optimizer.verdict.trials import knobs_of

NAME = "sensitivity"
BOOTS_VLLM = True
INTERRUPTED = "interrupted: the running server was stopped; the knobs measured so far are stored on the study"
KEY = 2_000_000  # board keys of these runs: no trial or confirmation reaches them


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="re-measure the best configuration with one knob moved at a time")
    p.add_argument("--knobs", help="comma-separated knobs to move (default: every knob of the space)")
    p.add_argument("--to", action="append", default=[], metavar="KNOB=VALUE",
                   help="the value a knob moves to (default: one step: x2 on a log range, a quarter of the "
                   "range otherwise, the next choice)")
    p.add_argument("--repeats", type=int, default=0, help="extra runs of the best for its noise band "
                   "(default 0: its search run and confirmation re-measurements)")
    add_flags(p, *OBJECTIVE_FLAGS, *STUDY_FLAGS)
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.config.candidate import parse_candidate
    from optimizer.driver.measure_once import measuring
    from optimizer.driver.plan import prepare, stamp_mismatch
    from optimizer.driver.progress import Progress
    from optimizer.driver.store.finished_study import open_finished

    if ns.repeats < 0:
        raise ConfigError(f"--repeats {ns.repeats}: a count of extra runs, 0 or more")
    cfg = load(ns)
    plan = prepare(cfg)  # every check first; then the study
    f = open_finished(cfg)
    mismatch = stamp_mismatch(f.study, plan)
    if mismatch:
        raise ConfigError(f"study '{cfg.study_name}' was run with another {mismatch[0].replace('_', ' ')} "
                          f"({mismatch[1]}); pass the config it ran with: the moves must measure what it measured")
    knobs = [k.strip() for k in ns.knobs.split(",") if k.strip()] if ns.knobs else None
    to = parse_candidate(" ".join(ns.to), "--to") if ns.to else None
    prepared = prepare_run(f.study, plan, knobs, to)  # bad knobs are refused before Ray starts
    progress = Progress(console)
    with measuring(plan, progress) as measure:
        rows = run(f.study, plan, progress, measure, prepared, ns.repeats)
    return 0 if any(r["value"] is not None for r in rows) else 1


def prepare_run(study, plan, knobs=None, to=None) -> tuple:
    """The best trial, its full parameters and the planned moves; raises ConfigError (before any boot)."""
    best, rec = best_trial(study), recommend(study)
    # The recommendation's knobs as it was measured (the minimal change's, rounded values included).
    base = from_cli_args(list(rec.args)) if rec is not None else knobs_of(best)
    planned = moves(base, plan.space, knobs, to)
    if not planned:
        raise ConfigError("sensitivity: no knob to move (each is fixed or has one value in the space); widen the space")
    return best, base, planned


def run(study, plan, progress, measure, prepared, repeats: int = 0) -> list[dict]:
    """Measure the best once more `repeats` times, then each move once; `measure(params, key,
    log_dir)` runs one full measurement (driver/measure_once.measure_once) and returns its value or None. The
    rows are stored on the study after each move: an interruption loses one run at most."""
    best, base, planned = prepared
    rec = recommend(study)
    own = rec is not None and rec.trial.number == best.number
    values = list(rec.values) if own else [best.value]
    # The band's centre is the recommended flags' own runs; every other configuration re-measured
    # pools the noise. When the minimal change put knobs back, the winner trial's re-measured runs
    # are another configuration's, and count.
    others = None if own and rec.changed_from_trial else best.number
    progress.console.print(f"[bold]Sensitivity[/] of trial {best.number} ({len(planned)} knob(s), "
                           f"{repeats} extra run(s) of the best for its noise band)")
    for k in range(repeats):
        value = measure(base, KEY + k, f"sensitivity/best-{k}")
        if value is not None:
            values.append(value)
        progress.console.print(f"  best again: {value if value is None else round(value, 2)}")
    noise = band(values, remeasured.read_confirmation(study).every_values(but=others))
    maximize = study.direction.name == "MAXIMIZE"  # optuna's StudyDirection
    record = []
    for i, (name, old, new) in enumerate(planned):
        value = measure({**base, name: new}, KEY + 100 + i, f"sensitivity/{name}")
        record.append({**effect(name, old, new, value, noise, maximize), "trial": best.number})
        progress.console.print(f"  {name} {old} -> {new}: {describe(record[-1], plan.objective.unit)}")
        remeasured.write_sensitivity(study, record)
    return record
