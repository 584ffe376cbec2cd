"""`run`: run (or resume) a study to its budget, then print and write its report."""

from __future__ import annotations

import argparse

from optimizer.cli.common import add_flags, load

NAME = "run"
BOOTS_VLLM = True
INTERRUPTED = "interrupted: the running trial was told FAIL; re-run the same command to resume"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="run (or resume) a study")
    add_flags(p, "--config", "--model", "--goal", "--objective", "--metric", "--slo")
    p.add_argument("--no-precheck", action="store_true",
                   help="boot every configuration, even one the KV-cache estimate says cannot fit")
    p.add_argument("--no-minimal", action="store_true",
                   help="do not run the minimal-change step: the confirmed winner is recommended as it is "
                        "(a step this study already finished stays its recommendation)")
    add_flags(p, "--n-trials", "--storage", "--study-name", "--ray-address", "--artifacts-dir", "--workload")
    p.add_argument("--skip-bad-rows", action="store_true", default=None,
                   help="replay a trace's good rows when some are malformed (they are listed)")
    p.add_argument("--new-study", action="store_true",
                   help="the study ran another workload/objective/model: start a separate one, keep the old")
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.cli.report import write_report_files
    from optimizer.driver.plan import prepare
    from optimizer.driver.progress import Progress
    from optimizer.driver.study import run
    from optimizer.report import dashboard_notes
    from optimizer.report.console import print_report

    cfg = load(ns)
    plan = prepare(cfg, new_study=ns.new_study)
    _warn_relative_artifacts(cfg, console)
    study, plan = run(plan, Progress(console, dashboard=dashboard_notes))
    summary = print_report(study, plan.model.source, plan.artifacts, plan.objective, console)
    write_report_files(study, plan.model.source, plan.artifacts, plan.objective, plan.artifacts / "report", console,
                       cfg=cfg)
    return 0 if summary.best is not None or summary.front else 1


def _warn_relative_artifacts(cfg, console) -> None:
    """In a Ray job run from an uploaded working dir, a relative artifacts_dir lands in the job's
    temporary copy (like a relative SQLite path, which is refused): the logs would go with it."""
    from pathlib import Path

    from optimizer.driver.ray_runtime import job_working_dir

    if job_working_dir() and not Path(cfg.artifacts_dir).expanduser().is_absolute():
        console.print(f"[yellow]warning[/]: artifacts_dir '{cfg.artifacts_dir}' is relative, and this runs as a Ray "
                      "job whose working directory is a temporary copy: its logs and best.yaml go with the job; "
                      "pass --artifacts-dir with an absolute path to keep them")
