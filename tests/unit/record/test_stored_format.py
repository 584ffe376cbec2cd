"""record/: the writers store the keys and JSON values studies have always held (old studies read
unchanged), and every key a real stored study holds is one the record names."""

import dataclasses
from pathlib import Path

import optuna
import pytest

from optimizer.record import of_generation, of_study, of_trial, remeasured, version

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "studies" / "daemon_2026-12-05.db"


def _constants(*modules) -> set[str]:
    return {v for m in modules for k, v in vars(m).items() if k.isupper() and isinstance(v, str)}


def test_every_key_of_a_real_study_is_named_by_the_record():
    study_keys = _constants(of_study, of_generation, remeasured, version)
    trial_keys = _constants(of_trial)
    url = f"sqlite:///{FIXTURE}"
    for summary in optuna.get_all_study_summaries(url, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        assert set(study.user_attrs) <= study_keys, set(study.user_attrs) - study_keys
        for t in study.trials:
            assert set(t.user_attrs) <= trial_keys, set(t.user_attrs) - trial_keys


def test_a_trials_writers_store_the_keys_and_values_they_always_did():
    study = optuna.create_study()
    trial = study.ask()
    of_trial.write_vllm_args(trial, ("--max-num-seqs", "8"))
    of_trial.write_cpu_bind(trial, "0-3")
    of_trial.mark_precheck(trial, False)
    of_trial.write_measured(trial, phases={"replay_s": 1.0}, metrics={"ttft_ms_p95": 2.0}, host="h", omp_threads=4,
                            server={"spec_acceptance": 0.5}, early_stop={"by": "slo"})
    of_trial.write_failure(trial, "early_stopped", "why", "do", 2048)
    of_trial.mark_value_from_partial_run(trial)
    of_trial.write_slo_excess(trial, {"ttft_p95": 1.0}, False)
    of_trial.write_regression(trial, {"summary": "s"})
    assert study.trials[0].user_attrs == {
        "vllm_args": ["--max-num-seqs", "8"], "cpu_bind": "0-3", "precheck": "pruned", "phases_s": {"replay_s": 1.0},
        "metrics": {"ttft_ms_p95": 2.0}, "server": {"spec_acceptance": 0.5}, "host": "h", "omp_threads": 4,
        "early_stop": {"by": "slo"}, "failure_kind": "early_stopped", "evidence": "why", "remedy": "do",
        "fits_max_model_len": 2048, "value_from_partial_run": True, "slo_excess": {"ttft_p95": 1.0},
        "feasible": False, "regression": {"summary": "s"}}
    again = study.ask()
    of_trial.mark_repeat(again, study.trials[0], 12)
    assert {k: v for k, v in study.trials[1].user_attrs.items()} == {
        "repeat_of": 0, "budget": 12, "metrics": {"ttft_ms_p95": 2.0}, "server": {"spec_acceptance": 0.5},
        "slo_excess": {"ttft_p95": 1.0}, "feasible": False, "value_from_partial_run": True,
        "early_stop": {"by": "slo"}, "failure_kind": "early_stopped", "evidence": "why", "remedy": "do",
        "fits_max_model_len": 2048}
    assert of_trial.repeat_of(study.trials[1]) == 0 and of_trial.repeat_of(study.trials[0]) is None


def test_the_queue_roles_and_a_retry_keep_their_keys():
    study = optuna.create_study()
    of_trial.enqueue_baseline(study, {"x": 1})
    of_trial.enqueue_screen(study, {"x": 2}, "x")
    of_trial.enqueue_configured(study, {"x": 3})
    of_trial.enqueue_again(study, {"x": 1}, of_trial.roles(study.trials[0]), 0, "driver_lost")
    assert [t.user_attrs for t in study.trials] == [
        {"baseline": True}, {"screen": "x"}, {"enqueued": True},
        {"baseline": True, "retry_of": 0, "retry_reason": "driver_lost"}]
    assert [of_trial.queued(t) for t in study.trials] == [True] * 4


def test_a_studys_stamp_and_its_generation_keep_their_keys_and_order():
    study = optuna.create_study()
    of_study.write_workload_file(study, "/w.jsonl")
    of_study.write_workload(study, "chat", ["a note"])
    of_study.write_device(study, "gpu", "0.32.0", "H100")
    version.stamp(study)
    of_study.write_identity(study, of_study.identity("latency:ttft_p95", "h", "/m"))
    of_generation.write_generation(study, n=2, trigger="t", started=1.0, shape={"requests": 3}, previous="s",
                                   warm=[], admission=[], source="/src", fingerprint="fp", production={"rate": 1})
    assert list(study.user_attrs.items()) == [
        ("workload_file", "/w.jsonl"), ("workload", "chat"), ("workload_notes", ["a note"]), ("device", "gpu"),
        ("vllm_version", "0.32.0"), ("device_name", "H100"), ("vllm_optimizer_record", 1),
        ("objective", "latency:ttft_p95"), ("model", "/m"), ("workload_hash", "h"), ("generation", 2),
        ("trigger", "t"), ("generation_started", 1.0), ("traffic_shape", {"requests": 3}), ("previous_study", "s"),
        ("warm_start", []), ("admission", []), ("traffic_source", "/src"), ("traffic_fingerprint", "fp"),
        ("production", {"rate": 1})]


def test_a_confirmations_runs_are_read_by_trial_number():
    record = {"runs": {"1": {"values": [2.0, 3.0], "failed": 0}, "0": {"values": [9.0], "failed": 0, "settled": "1"}},
              "intervals": {"1": {"mean": 2.4, "n": 2}}}
    conf = remeasured.Confirmation.of(record)
    assert conf.values(1) == [2.0, 3.0] and conf.values(7) == []
    assert conf.runs[0] == remeasured.Runs((9.0,), 0, settled=1) and conf.interval(1)["n"] == 2
    assert conf.every_values(but=1) == [[9.0]]
    assert not conf.judged and conf.winner is None and conf.candidates is None  # stored before any verdict
    assert remeasured.read_confirmation({}) == remeasured.Confirmation() and remeasured.confirmation_as_stored({}) == {}
    assert remeasured.read_minimal({}) == remeasured.MinimalChange() and remeasured.minimal_as_stored({}) == {}


def test_what_is_read_is_frozen_and_leaves_the_stored_record_as_it_was():
    stored = {"confirmation": {"runs": {"1": {"values": [2.0], "failed": 0}}, "candidates": ["1"], "top": 1,
                               "repeats": 1, "winner": 1, "noise": None, "intervals": {"1": {"mean": 2.0, "n": 1}}},
              "minimal": {"done": True, "winner": 1, "candidates": ["1"], "repeats": 1, "rows": [{"knob": "k"}],
                          "runs": {"[]": [1.0, None]}}}
    conf, minimal = remeasured.read_confirmation(stored), remeasured.read_minimal(stored)
    assert conf.judged and conf.candidates == (1,) and minimal.answers(conf)
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.winner = 2
    with pytest.raises(TypeError):
        conf.intervals[1]["mean"] = 3.0
    with pytest.raises(TypeError):
        minimal.rows[0]["knob"] = "other"
    assert stored["minimal"]["rows"] == [{"knob": "k"}] and minimal.runs == {"[]": (1.0, None)}
    assert not minimal.answers(remeasured.Confirmation.of(stored["confirmation"], current=False))  # a stale one
