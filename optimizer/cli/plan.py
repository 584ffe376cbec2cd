"""`plan`: the replicas and GPUs a peak load needs, from the study's measured best.
"""

from __future__ import annotations

import argparse

from optimizer.cli.common import STUDY_FLAGS, add_flags, load
from optimizer.measure.slo import parse_slos
from optimizer.report.capacity import (
    check_inputs,
    describe,
    measurement_from_study,
    plan,
)

NAME = "plan"


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="replicas and GPUs the best configuration needs for a peak load")
    p.add_argument("--config", help="study YAML (its storage and study_name; see examples/quickstart.yaml)")
    p.add_argument("--storage", help="SQLAlchemy URL (default sqlite:///trials.db)")
    p.add_argument("--study-name")
    p.add_argument("--peak-qps", type=float, required=True, help="peak requests/s to serve")
    p.add_argument("--tokens-per-request", type=float, required=True,
                   help="mean tokens per request at peak, prompt + output")
    p.add_argument("--headroom", type=float, default=0.3,
                   help="share of each replica's measured rate kept free (default 0.3)")
    p.add_argument("--trial", type=int, help="plan on this trial (e.g. a Pareto front member), not the best")
    p.add_argument("--slo", help="SLOs the plan must keep, as for run ('ttft:500 tpot:50'); checked against "
                   "the measured run")
    add_flags(p, *STUDY_FLAGS)
    return p


def main(ns: argparse.Namespace, console) -> int:
    """`python -m optimizer plan`: print the plan; raises OptimizerError for bad input or storage."""
    from optimizer.driver.store.finished_study import open_finished  # noqa: PLC0415

    check_inputs(ns.peak_qps, ns.tokens_per_request, ns.headroom)  # before the study is opened
    slos = parse_slos(ns.slo)
    study = open_finished(load(ns), check_objective=False).study  # --slo here asks, it does not relabel
    p = plan(measurement_from_study(study, ns.trial, slos), ns.peak_qps, ns.tokens_per_request, ns.headroom)
    for line in describe(p):
        console.print(line, markup=False)
    return 0
