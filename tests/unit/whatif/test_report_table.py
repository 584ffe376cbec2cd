"""whatif/report_table.py: the written report's what-if section, predicted for the devices the
config names, at the best trial's request shape, calibrated on the study's own GPU trials; a
prediction that cannot be made is one sentence, never a failed report."""

from __future__ import annotations

import json

import optuna
import pytest

from optimizer.config.schema import WhatIfSpec
from optimizer.measure.slo import parse_slos
from optimizer.report.written import write_report
from optimizer.whatif.report_table import TITLE, section
from tests.unit.whatif.test_plan_whatif import QWEN7B, _gpu_study


@pytest.fixture
def study_and_model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN7B))
    model = str(tmp_path / "m")
    return _gpu_study(f"sqlite:///{tmp_path / 't.db'}", model, bias=1.5), model


def test_no_devices_named_means_no_section(study_and_model):
    study, model = study_and_model
    assert section(study, model, WhatIfSpec(), ()) is None


def test_the_section_predicts_each_device_and_tp_at_the_best_trials_shape(study_and_model):
    study, model = study_and_model
    sec = section(study, model, WhatIfSpec(report=["l4", "h100"], tp=[1, 2]), parse_slos("tpot:150"))
    assert sec.title == TITLE and len(sec.rows) == 4
    assert {(r[0], r[1]) for r in sec.rows} == {("l4", "1"), ("l4", "2"), ("h100", "1"), ("h100", "2")}
    text = sec.paragraphs[0]
    assert text.startswith("Every figure here is predicted, not measured:")
    assert "900 prompt + 100 output tokens a request (the best trial's)" in text
    assert "Calibration: 3 trial(s) of study 's' on l4." in text and "p95 TPOT <= 150 ms" in text


def test_what_cannot_be_predicted_is_one_sentence(study_and_model, tmp_path):
    study, _ = study_and_model
    sec = section(study, str(tmp_path / "nowhere"), WhatIfSpec(report=["h100"]), ())
    assert sec.rows == () and sec.paragraphs[0].startswith("Not predicted: model: directory ")
    sec = section(study, str(tmp_path / "m"), WhatIfSpec(report=["h300"]), ())
    assert sec.paragraphs[0].startswith("Not predicted: what-if: unknown device 'h300'")


def test_the_written_report_ends_with_it(study_and_model, tmp_path):
    from objectives import get_objective

    study, model = study_and_model
    sec = section(study, model, WhatIfSpec(report=["h100"], tp=[1]), ())
    files = write_report(study, model, tmp_path / "artifacts", get_objective("throughput", "output_throughput", ()),
                         tmp_path / "report", extra=(sec,))
    md = files.markdown.read_text()
    assert f"## {TITLE}" in md and "| device | TP | req/s a replica |" in md and "| h100 | 1 |" in md
    assert TITLE in files.html.read_text()


def test_a_multi_objective_study_or_a_broken_config_is_a_sentence_not_a_lost_report(study_and_model, tmp_path):
    _, model = study_and_model
    pareto = optuna.create_study(directions=["maximize", "minimize"])
    sec = section(pareto, model, WhatIfSpec(report=["h100"]), ())
    assert sec.rows == () and sec.paragraphs[0].startswith("Not predicted: a multi-objective study has no one best")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    study, _ = study_and_model
    sec = section(study, str(tmp_path / "bad"), WhatIfSpec(report=["h100"]), ())
    assert sec.paragraphs[0].startswith("Not predicted: what-if: ") and "cannot be read as JSON" in sec.paragraphs[0]
