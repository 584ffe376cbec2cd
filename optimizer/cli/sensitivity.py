"""`sensitivity`: re-measure the best configuration with one knob moved at a time."""

from __future__ import annotations

import argparse

from optimizer.cli.common import OBJECTIVE_FLAGS, STUDY_FLAGS, add_flags, load

NAME = "sensitivity"
BOOTS_VLLM = True
INTERRUPTED = "interrupted: the running server was stopped; the knobs measured so far are stored on the study"


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
    from optimizer.errors import ConfigError
    from optimizer.report import sensitivity

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
    prepared = sensitivity.prepare_run(f.study, plan, knobs, to)  # bad knobs are refused before Ray starts
    progress = Progress(console)
    with measuring(plan, progress) as measure:
        rows = sensitivity.run(f.study, plan, progress, measure, prepared, ns.repeats)
    return 0 if any(r["value"] is not None for r in rows) else 1
