"""`report`: print a stored study's report and write it (Markdown, HTML, pictures, best.yaml)."""

from __future__ import annotations

import argparse
from pathlib import Path

from optimizer.cli.common import OBJECTIVE_FLAGS, STUDY_FLAGS, add_flags, load

NAME = "report"


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="write a stored study's report: Markdown, HTML, pictures, best.yaml")
    p.add_argument("--out", help="directory for the report (default: artifacts/<study>/report)")
    add_flags(p, *OBJECTIVE_FLAGS, *STUDY_FLAGS)
    return p


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.config.paths import directory_expected
    from optimizer.driver.store.finished_study import open_finished
    from optimizer.report.console import print_report

    if ns.out:
        directory_expected(ns.out, "--out", "pass a directory for the report (created if missing)")
    cfg = load(ns)
    directory_expected(cfg.artifacts_dir, "artifacts_dir", "pass --artifacts-dir with the directory the study ran with")
    f = open_finished(cfg)
    out = Path(ns.out) if ns.out else f.artifacts / "report"
    summary = print_report(f.study, f.model, f.artifacts, f.objective, console)
    # read-only: the study database is left byte for byte as it was (its note is `run`'s to write)
    code = write_report_files(f.study, f.model, f.artifacts, f.objective, out, console, note=False, cfg=cfg)
    return code if summary.best is not None or summary.front else 1


def write_report_files(study, model: str, artifacts: Path, objective, out: Path, console, note: bool = True,
                       cfg=None) -> int:
    """The written report (report/written.py), with the what-if table the config's `whatif.report`
    asks for, and (`note`) the study's dashboard note; a full disk is a note, never a failed run."""
    from optimizer.errors import first_line
    from optimizer.measure.slo import parse_slos
    from optimizer.report.dashboard_notes import save_study_note
    from optimizer.report.written import write_report
    from optimizer.whatif.report_table import section

    try:
        whatif = section(study, model, cfg.whatif, parse_slos(cfg.objective.slos)) if cfg is not None else None
        files = write_report(study, model, artifacts, objective, out, extra=(whatif,) if whatif else ())
    except Exception as exc:  # noqa: BLE001 - a full disk, a picture that cannot be drawn: the study is fine
        why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {first_line(exc)}"
        console.print(f"[yellow]note[/]: the written report was not stored in {out} ({why})")
        return 1
    console.print(f"Report: {files.html} (and {files.markdown.name}, pictures beside them); "
                  f"dashboard: make dashboard")
    unsaved = save_study_note(study, files.summary, files.html) if note else None
    if unsaved:
        console.print(f"[yellow]note[/]: {unsaved}")
    return 0
