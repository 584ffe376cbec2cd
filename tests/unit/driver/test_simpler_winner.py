"""The simpler winner: within the noise of the best geometric mean, the candidate that changes fewer
knobs from the baseline wins the confirmation, says so, and leaves the minimal change less to put back."""

import optuna

from optimizer.driver.confirm import remeasure
from optimizer.measure.noise import pooled
from optimizer.record.remeasured import Confirmation
from optimizer.text.verdicts import confirmation_lines, verdict_phrase
from optimizer.verdict import confirmed
from optimizer.verdict.confirmed import changed_knobs, decide
from optimizer.verdict.recommendation import CONFIRMED, recommend

BASE = ["--max-num-seqs", "8", "--max-model-len", "2048", "--gpu-memory-utilization", "0.5"]
THREE = ["--max-num-seqs", "32", "--max-model-len", "4096", "--gpu-memory-utilization", "0.6"]  # 3 knobs moved
ONE = ["--max-num-seqs", "32", "--max-model-len", "2048", "--gpu-memory-utilization", "0.5"]  # 1 knob moved


def _runs(**values):
    return {n: {"values": v, "failed": 0} for n, v in values.items()}


def _study(values: dict[str, float]) -> optuna.Study:
    """Maximize: the baseline (trial 0), then trial 1 with THREE and trial 2 with ONE."""
    study = optuna.create_study(direction="maximize")
    for args, v, base in ((BASE, values["0"], True), (THREE, values["1"], False), (ONE, values["2"], False)):
        t = study.ask()
        t.set_user_attr("vllm_args", args)
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, v)
    return study


def test_within_the_noise_the_candidate_with_fewer_changed_knobs_wins_and_says_over_which():
    runs = _runs(**{"1": [100.0, 104.0, 97.0], "2": [98.0, 101.0, 95.0]})
    got = decide(runs, ["1", "2"], pooled(e["values"] for e in runs.values()), True, {"1": 3, "2": 1})
    assert got["winner"] == 2 and not got["clear"]
    assert got["simpler"]["over"] == 1 and (got["simpler"]["knobs"], got["simpler"]["over_knobs"]) == (1, 3)
    r = got["simpler"]["ratio"]
    assert r["low"] <= 1.0 <= r["high"] and r["ratio"] < 1.0  # the simpler one's mean is the lower, within the noise
    assert set(got["ratios"]) == {"1"}  # the others are now read against the winner
    phrase = verdict_phrase(Confirmation.of(got))
    assert phrase.startswith("the simpler choice: within the noise of trial 1, the best geometric mean")
    assert "changes 1 knob(s) from the baseline against 3" in phrase


def test_a_measurably_better_leader_or_an_equal_count_keeps_the_best_mean():
    far = _runs(**{"1": [100.0, 101.0, 99.0], "2": [80.0, 81.0, 79.0]})
    got = decide(far, ["1", "2"], pooled(e["values"] for e in far.values()), True, {"1": 3, "2": 1})
    assert got["winner"] == 1 and got["clear"] and got["simpler"] is None
    close = _runs(**{"1": [100.0, 104.0, 97.0], "2": [98.0, 101.0, 95.0]})
    same = decide(close, ["1", "2"], pooled(e["values"] for e in close.values()), True, {"1": 2, "2": 2})
    assert same["winner"] == 1 and same["simpler"] is None
    without = decide(close, ["1", "2"], pooled(e["values"] for e in close.values()), True)  # no baseline to count from
    assert without["winner"] == 1 and without["simpler"] is None


def test_a_study_confirms_the_simpler_configuration_and_recommends_it():
    study = _study({"0": 50.0, "1": 100.0, "2": 98.0})
    assert changed_knobs(study, ["1", "2"]) == {"1": 3, "2": 1}
    again = {1: [103.0, 97.0], 2: [101.0, 95.0], 0: [51.0, 49.0]}
    record = remeasure(study, top=2, repeats=2, measure=lambda t, k: again[t.number][k - 1])
    assert record["winner"] == 2 and record["simpler"]["over"] == 1
    conf = confirmed.read(study)
    assert conf.current_winner == 2 and conf.simpler["knobs"] == 1
    rec = recommend(study)
    assert rec.trial.number == 2 and rec.source == CONFIRMED and list(rec.args) == ONE
    assert rec.gain["ratio"] > 1.5  # still measured against the re-measured baseline

    class Objective:
        direction, unit = "maximize", "tok/s"

    lines = confirmation_lines(conf, Objective())
    assert lines[-1].startswith("recommended: trial 2, the simpler choice: within the noise of trial 1")
