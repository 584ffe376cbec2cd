"""The sensitivity command's noise band when the recommendation is the minimal change's: its own
runs are the band's centre, and the winner trial's re-measured runs (another configuration once
knobs were put back) pool the noise."""

import io
from types import SimpleNamespace

from rich.console import Console

from optimizer.cli import sensitivity
from optimizer.config.flags import from_cli_args
from optimizer.record import remeasured
from optimizer.verdict.recommendation import MINIMAL, recommend
from tests.unit.driver.test_minimal import finished_study
from tests.unit.report.test_recommendation import MINIMAL_ARGS, with_minimal


def _only_the_winner_re_measured():
    """Trial 1 re-measured 3 times, the baseline settled on its one run, the minimal change's
    recommendation measured once (305 ms)."""
    study = finished_study()
    conf = remeasured.confirmation_as_stored(study)
    remeasured.write_confirmation(study, {**conf, "runs": {"1": conf["runs"]["1"], "0": {"values": [2400.0], "failed": 0}},
                                          "candidates": ["1"], "top": 1})
    study = with_minimal(study)
    record = remeasured.minimal_as_stored(study)
    remeasured.write_minimal(study, {**record, "candidates": ["1"]})
    return study


def test_the_winners_re_measured_runs_give_the_minimal_recommendation_a_band():
    study = _only_the_winner_re_measured()
    rec = recommend(study)
    assert rec.source == MINIMAL and rec.changed_from_trial and list(rec.values) == [305.0]
    best = study.trials[1]
    plan = SimpleNamespace(objective=SimpleNamespace(unit="ms"))
    progress = SimpleNamespace(console=Console(file=io.StringIO()))
    prepared = (best, from_cli_args(MINIMAL_ARGS), [("max-num-seqs", 36, 72)])
    (row,) = sensitivity.run(study, plan, progress, lambda params, key, log_dir: 310.0, prepared)
    assert row["n"] == 1 and row["best_mean"] == 305.0
    assert row["band_low"] is not None and row["band_low"] < 305.0 < row["band_high"]  # trial 1's 3 runs pooled
    assert row["verdict"] == "within noise"  # 310 against 305, one run's noise about 4% here
