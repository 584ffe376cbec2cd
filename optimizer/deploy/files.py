"""The recommendation written as files to deploy, beside the study's artifacts: `best.yaml` (the
`vllm serve --config` of the recommended configuration) and, for a multi-objective study,
`pareto_front.yaml` (each front member's config). Each is written whole (atomic_file.py); a disk
that refuses it gives None, and the study is fine."""

from __future__ import annotations

from pathlib import Path

import yaml

from optimizer.atomic_file import write_atomic
from optimizer.config.flags import random_weights
from optimizer.deploy.serve import serve_yaml
from optimizer.record import of_trial

RANDOM_WEIGHTS_NOTE = ("# Measured with random weights (--load-format dummy): for speed only. Remove load-format\n"
                       "# before serving, or vLLM will answer with noise.\n")


def write_best(artifacts: Path, args: list[str]) -> Path | None:
    """`best.yaml`: the recommended configuration's flags as `vllm serve --config` YAML."""
    return write_yaml(artifacts / "best.yaml", serve_yaml(args), RANDOM_WEIGHTS_NOTE if random_weights(args) else "")


def write_front(artifacts: Path, front) -> Path | None:
    """`pareto_front.yaml`: each front member's number, values and config."""
    return write_yaml(artifacts / "pareto_front.yaml",
                      [{"trial": t.number, "values": list(t.values),
                        "config": serve_yaml(of_trial.vllm_args(t))} for t in front])


def write_yaml(path: Path, data, header: str = "") -> Path | None:
    """Write a YAML artifact whole (atomic_file.py), `header` (comment lines) first; None when the
    disk refuses it (the report says so, the study is fine)."""
    try:
        write_atomic(path, header + yaml.safe_dump(data, sort_keys=False))
    except OSError:
        return None
    return path
