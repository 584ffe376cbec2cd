"""A file given where a directory is expected is one line naming it, exit 2, before anything is
written or started (an artifacts_dir that is a file used to start the study and then wait
"for disk space" forever)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.engine.tiny_model import write_tiny_model


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = write_tiny_model(tmp_path / "tiny")
    (tmp_path / "study.yaml").write_text(f"model: {{path: {model}, load_format: dummy}}\nn_trials: 2\n"
                                         "space: {max-num-seqs: {low: 4, high: 8}}\n")
    (tmp_path / "afile").write_text("not a directory\n")
    return tmp_path


def _listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


@pytest.mark.parametrize("argv, line", [
    (["run", "--config", "study.yaml", "--artifacts-dir", "afile"],
     "error: artifacts_dir afile: it is a file; pass --artifacts-dir with a directory (created if missing)"),
    (["run", "--config", "study.yaml", "--artifacts-dir", "afile/deeper"],
     "error: artifacts_dir afile/deeper: <dir>/afile is a file; pass --artifacts-dir with a directory (created if missing)"),
    (["run", "--config", "study.yaml", "--study-name", "afile", "--artifacts-dir", "."],
     "error: the study's artifacts directory afile: it is a file; move that file away, or pass another "
     "--artifacts-dir or --study-name"),
    (["workload", "--config", "study.yaml", "--out", "afile"],
     "error: --out afile: it is a file; pass a directory for the workload file (created if missing)"),
    (["report", "--config", "study.yaml", "--out", "afile"],
     "error: --out afile: it is a file; pass a directory for the report (created if missing)"),
    (["report", "--config", "study.yaml", "--artifacts-dir", "afile"],
     "error: artifacts_dir afile: it is a file; pass --artifacts-dir with the directory the study ran with"),
    (["tiny-model", "afile"],
     "error: model: <dir>/afile is a file; the tiny model is written into a new or empty directory: give another path"),
    (["tiny-model", "afile/sub"],
     "error: model: <dir>/afile is a file; the tiny model is written into a new or empty directory: give another path"),
])
def test_a_file_where_a_directory_is_expected(workdir, capsys, argv, line):
    before = _listing(workdir)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [line.replace("<dir>", str(workdir))]
    assert _listing(workdir) == before  # no study, no artifacts, no lock file


def test_the_docs_quote_each_line():
    text = (Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md").read_text()
    for _, line in test_a_file_where_a_directory_is_expected.pytestmark[0].args[1]:
        assert f"`` {line} ``" in text, line
