"""The single-winner rule: every surface names the one recommendation (verdict/recommendation.py)."""

import yaml
from optuna_dashboard import get_note

from optimizer.daemon.loop import warm_starts
from optimizer.daemon.status_feed import best_of
from optimizer.fleet import capacity
from optimizer.verdict import sensitivity
from optimizer.report.dashboard_notes import save_study_note
from optimizer.verdict.recommendation import CONFIRMED, MINIMAL, recommend
from optimizer.text.verdicts import gain_text
from optimizer.deploy.serve import serve_command, serve_yaml
from optimizer.report.summary import summarize_study
from tests.unit.driver.test_minimal import finished_study

MINIMAL_ARGS = ["--max-num-seqs", "36", "--gpu-memory-utilization", "0.5", "--max-model-len", "8192",
                "--kv-cache-dtype", "auto"]


def with_minimal(study):
    study.set_user_attr("minimal", {
        "winner": 1, "done": True, "candidates": study.user_attrs["confirmation"]["candidates"], "repeats": 2,
        "boots": 4, "wall_s": 200.0, "runs": {},
        "rows": [{"knob": "max-num-seqs", "baseline": 16, "winner": 36, "reverted_to": 16, "values": [2400.0, 2350.0],
                  "failed": False, "effect": {"ratio": 7.9, "low": 6.8, "high": 9.1}, "verdict": "kept", "note": ""},
                 {"knob": "max-model-len", "baseline": 8192, "winner": 44288, "reverted_to": 8192, "values": [305.0],
                  "failed": False, "effect": {"ratio": 1.01, "low": 0.85, "high": 1.2}, "verdict": "reverted",
                  "note": ""}],
        "combined": None, "final": {"knobs": {}, "args": MINIMAL_ARGS, "values": [305.0], "dir": "minimal/config-2/run-0",
                                                              "metrics": {"total_token_throughput": 3000.0,
                                                                          "request_throughput": 10.0}}})
    return study


class Objective:
    name, metric, unit, direction, multi = "latency", "ttft_p95", "ms", "minimize", False


def test_the_console_summary_best_yaml_the_note_status_and_warm_starts_name_one_configuration(tmp_path):
    study = with_minimal(finished_study(runner_up=280.0))
    # Optuna's best single run is trial 2 (280 ms once); the confirmed winner is trial 1 (best mean),
    # and the recommendation is trial 1 with max-model-len put back.
    rec = recommend(study)
    assert study.best_trial.number == 2
    assert rec.source == MINIMAL and rec.args == tuple(MINIMAL_ARGS) and rec.trial.number == 1
    s = summarize_study(study, "/m", tmp_path)
    assert s.command == serve_command("/m", MINIMAL_ARGS)
    assert yaml.safe_load(s.yaml_path.read_text()) == serve_yaml(MINIMAL_ARGS)
    assert save_study_note(study, s, None) is None
    note = get_note(study)
    assert note.splitlines()[2].startswith("**Recommended** (minimal change): trial 1 with the knobs that had no effect")
    assert "badge shows trial 2" in note and f"`{s.command}`" in note
    assert "| max-model-len | 8192 | 44288 | 1.01x [0.85, 1.20] over 1 run | reverted |" in note
    status = best_of(study, Objective(), "/m")
    assert status["command"] == s.command and status["source"] == MINIMAL and status["value"] == 305.0
    assert [r["verdict"] for r in status["what_mattered"]] == ["kept", "reverted"]
    assert warm_starts(study, 2)[0] == {"max-num-seqs": 36, "gpu-memory-utilization": 0.5, "max-model-len": 8192,
                                        "kv-cache-dtype": "auto"}
    assert capacity._pick(study, None).number == sensitivity.best_trial(study).number == 1
    planned = capacity.measurement_from_study(study)  # from the minimal change's own run, not trial 1's
    assert (planned.trial, planned.value, planned.tensor_parallel_size) == (1, 3000.0, 1)


def test_a_minimal_record_made_for_another_confirmation_is_not_recommended():
    study = with_minimal(finished_study())
    record = study.user_attrs["minimal"]
    study.set_user_attr("minimal", {**record, "candidates": ["1", "3"]})  # the same winner, another top
    assert recommend(study).source == CONFIRMED
    study.set_user_attr("minimal", {**record, "repeats": 1})
    assert recommend(study).source == CONFIRMED


def test_the_gain_reads_higher_as_better_when_maximizing():
    import optuna

    study = optuna.create_study(direction="maximize")
    for value, base in ((200.0, True), (1000.0, False)):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", "1" if base else "16"])
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, value)
    study.set_user_attr("confirmation", {"runs": {"1": {"values": [1000.0, 1100.0], "failed": 0},
                                                  "0": {"values": [200.0, 210.0], "failed": 0}},
                                         "repeats": 1, "top": 1, "candidates": ["1"], "baseline": 0,
                                         "intervals": {}, "winner": 1, "clear": True})
    g = recommend(study).gain
    assert 1 < g["low"] < g["ratio"] < g["high"] and abs(g["ratio"] - (1048.8 / 204.9)) < 0.05


def test_without_the_step_the_confirmed_winner_is_named_and_the_gain_carries_both_sides_noise(tmp_path):
    study = finished_study()
    rec = recommend(study)
    assert rec.source == CONFIRMED and rec.values == (300.0, 290.0, 315.0)
    assert rec.gain["runs"] == [3, 3] and 1 < rec.gain["low"] < 2400 / 300 < rec.gain["high"]
    assert gain_text(rec.gain).startswith(f"{rec.gain['ratio']:.2f}x (95% CI ")


def test_an_interval_that_includes_one_says_no_measurable_gain():
    assert gain_text({"ratio": 1.05, "low": 0.88, "high": 1.25}) == "no measurable gain: 1.05x (95% CI 0.88-1.25x)"
