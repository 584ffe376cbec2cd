"""Every example config and workload under examples/ passes the schema as shipped: a newcomer's
first command never starts with a config error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from optimizer.config.schema import StudyConfig, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_load(path):
    assert load_config(path).study_name


@pytest.mark.parametrize("path", sorted((EXAMPLES / "workloads").glob("*.yaml")), ids=lambda p: p.name)
def test_example_workloads_load(path):
    section = yaml.safe_load(path.read_text())["workload"]
    assert StudyConfig(model={"path": "m"}, workload=section).workload.scenario == section["scenario"]
