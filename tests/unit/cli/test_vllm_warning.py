"""A command that boots vLLM warns in one line when the installed vLLM is not the tested release;
the commands that only read a study do not, and the tested release prints nothing."""

from __future__ import annotations

import pytest

from optimizer.cli import entry as cli_main
from optimizer.engine import vllm_version


@pytest.mark.parametrize("installed, command, warned", [
    ("0.33.1", "run", True), ("0.33.1", "regress", True), ("0.33.1", "report", False),
    ("0.32.0+cpu", "run", False)])
def test_a_command_that_boots_vllm_names_the_tested_release(monkeypatch, tmp_path, capsys, installed, command,
                                                             warned):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vllm_version, "installed_vllm", lambda: installed)
    code = cli_main.main([command, "--config", "missing.yaml"])  # refused at once: nothing boots
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1
    lines = [line for line in out.splitlines() if "tested with vLLM" in line]
    assert lines == ([f"warning: vLLM {installed} is installed; this release of vllm-optimizer was tested with vLLM "
                      "0.32.0 (its failure classifier and knob rules follow that release): results may differ"]
                     if warned else [])
