"""report/production.py: the watched servers' own latencies beside the baseline trial's, in the
console and the written report, with the caveat; nothing for a study not tuned on live traffic."""

import io

import optuna
from rich.console import Console

from optimizer.report.console import _print_production
from optimizer.report.production import CAVEAT, production_table
from optimizer.report.written import _Doc, _production
from tests.unit.driver.test_minimal import finished_study

PRODUCTION = {"latencies": {"ttft_p50_ms": 40.0, "ttft_p95_ms": 235.0, "e2e_p95_ms": 1666.7},
              "flags": {"gpu-memory-utilization": "0.9", "block-size": "16"}, "requests": 1200.0, "rate": 2.0}


def study_with_production():
    study = optuna.create_study(direction="minimize")
    t = study.ask()
    t.set_user_attr("baseline", True)
    t.set_user_attr("metrics", {"ttft_ms_p50": 61.2, "ttft_ms_p95": 2400.0, "e2el_ms_p95": 3100.0})
    study.tell(t, 2400.0)
    study.set_user_attr("production", PRODUCTION)
    return study


def test_the_rows_pair_production_with_the_baseline_trial():
    title, rows, flags = production_table(study_with_production())
    assert title == "Production (1200 requests at 2.00 req/s) beside the baseline trial 0"
    assert rows == [["TTFT p50", "40.0 ms", "61.2 ms"], ["TTFT p95", "235 ms", "2400 ms"],
                    ["E2E p95", "1667 ms", "3100 ms"]]
    assert flags == "Production flags seen in vllm:cache_config_info: gpu-memory-utilization 0.9, block-size 16."
    assert production_table(finished_study()) is None


def test_console_and_written_report_show_them_with_the_caveat():
    study = study_with_production()
    out = io.StringIO()
    _print_production(study, Console(file=out, width=200))
    assert "235 ms" in out.getvalue() and CAVEAT in out.getvalue().replace("\n", " ")
    doc = _Doc()
    _production(doc, study)
    md = doc.markdown()
    assert "## Production beside the baseline" in md and "| TTFT p95 | 235 ms | 2400 ms |" in md and CAVEAT in md
