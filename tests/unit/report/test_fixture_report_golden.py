"""The report of a real stored study, held against its golden text: what the tool reads from a study's
record must not change when the code that reads it does.

The fixture is the database the daemon wrote on 2026-12-05 (tests/fixtures/studies/daemon_2026-12-05.db):
'live' (a baseline, a winner and a re-measurement), 'live-g2' (a failed baseline, trials waiting) and
'live-g3' (nothing run yet). For each, `report` runs on a copy: its console output (a fixed width, no
colour), the written report.md, best.yaml and k8s.yaml, with the temporary directory replaced by
`<tmp>`. Everything else in them is read from the study and deterministic; the pictures and the HTML
page (drawn by matplotlib and plotly) are left out.

To write the golden file again after a deliberate change of the report: VLLM_OPTIMIZER_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

from rich.console import Console

from optimizer.cli import report
from optimizer.cli.entry import parser

STUDIES = Path(__file__).resolve().parents[2] / "fixtures" / "studies"
FIXTURE = STUDIES / "daemon_2026-12-05.db"
GOLDEN = STUDIES / "daemon_2026-12-05.report.txt"
FILES = ("report.md", "best.yaml", "k8s.yaml")


def _report(tmp_path: Path, study: str) -> str:
    db = tmp_path / "trials.db"
    if not db.exists():
        shutil.copy(FIXTURE, db)
    out = tmp_path / f"out-{study}"
    ns = parser().parse_args(["report", "--storage", f"sqlite:///{db}", "--study-name", study, "--model", "/m",
                              "--objective", "latency", "--metric", "ttft_p50",
                              "--artifacts-dir", str(tmp_path / "artifacts"), "--out", str(out)])
    text = io.StringIO()
    code = report.main(ns, Console(file=text, width=120, highlight=False, soft_wrap=True, color_system=None))
    parts = [f"=== {study}: exit {code}, console", text.getvalue()]
    for name in FILES:
        if (out / name).is_file():
            parts += [f"=== {study}: {name}", (out / name).read_text()]
    return "\n".join(parts).replace(str(tmp_path), "<tmp>")


def test_the_fixture_study_reports_as_its_golden_text(tmp_path):
    got = "\n".join(_report(tmp_path, s) for s in ("live", "live-g2", "live-g3"))
    if os.environ.get("VLLM_OPTIMIZER_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got.splitlines() == GOLDEN.read_text().splitlines()
