"""Trial files in Optuna's artifact store and the trial's Markdown note, as the driver writes them
(upload before the tell, note after), read back the way optuna-dashboard reads them."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.artifacts import get_all_artifact_meta
from optuna_dashboard import get_note

from optimizer.report import dashboard_notes as dashboard


@pytest.fixture
def study(tmp_path):
    return optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'trials.db'}", direction="minimize")


def _files(trial_dir):
    trial_dir.mkdir(parents=True)
    (trial_dir / "result.json").write_text(json.dumps({"trial": 0}))
    (trial_dir / "requests.jsonl").write_text('{"ok": true}\n')
    (trial_dir / "server.log").write_text("# launch: python -m vllm...\nINFO ready\n")


def _ref(study, number):
    """What get_note reads of a trial."""
    return dashboard._TrialRef(study, study.trials[number])


def test_files_are_uploaded_before_the_tell_and_readable_from_the_store(study, tmp_path):
    trial = study.ask()
    _files(tmp_path / "artifacts" / "s" / "trial-0")
    assert dashboard.upload_trial_files(trial, tmp_path / "artifacts" / "s" / "trial-0", tmp_path / "artifacts") is None
    trial.set_user_attr("metrics", {"ttft_ms_p95": 123.4})
    study.tell(trial, 123.4)
    metas = get_all_artifact_meta(study.trials[0], storage=study._storage)
    assert sorted(m.filename for m in metas) == ["requests.jsonl", "result.json", "server.log"]
    store = dashboard.artifact_store(tmp_path / "artifacts")
    log = next(m for m in metas if m.filename == "server.log")
    with store.open_reader(log.artifact_id) as f:
        assert f.read().startswith(b"# launch:")
    assert log.mimetype == "text/plain"


def test_a_missing_file_is_skipped_and_a_refused_store_is_one_line(study, tmp_path):
    trial = study.ask()
    d = tmp_path / "t"
    d.mkdir()
    (d / "result.json").write_text("{}")
    assert dashboard.upload_trial_files(trial, d, tmp_path / "a") is None
    assert [m.filename for m in get_all_artifact_meta(trial, storage=study._storage)] == ["result.json"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    why = dashboard.upload_trial_files(trial, d, blocker / "store")  # cannot mkdir under a file
    assert why.startswith("artifacts for optuna-dashboard not stored") and str(d) in why


def test_note_of_a_complete_trial_has_config_value_and_metrics(study):
    trial = study.ask()
    trial.set_user_attr("vllm_args", ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.3", "--load-format",
                                      "dummy"])
    trial.set_user_attr("metrics", {"ttft_ms_p95": 512.25, "output_throughput": 1800.0, "completed": 48})
    trial.set_user_attr("baseline", True)
    study.tell(trial, 512.25)
    assert dashboard.save_trial_note(study, 0, "ttft_p95", "ms") is None
    note = get_note(_ref(study, 0))
    assert note.startswith("## Trial 0 (baseline): COMPLETE")
    assert "`max-num-seqs=16`" in note and "`gpu-memory-utilization=0.3`" in note
    assert "**ttft_p95**: 512.2 ms" in note
    assert "| p95 TTFT | 512.2 ms |" in note and "| output | 1800 tok/s |" in note
    assert "`vllm serve MODEL --max-num-seqs 16 --gpu-memory-utilization 0.3 --load-format dummy`" in note


def test_note_of_a_pruned_trial_has_kind_evidence_remedy_and_a_diagnosis(study):
    trial = study.ask()
    trial.set_user_attr("vllm_args", ["--max-model-len", "65536"])
    trial.set_user_attr("failure_kind", "kv_too_small")
    trial.set_user_attr("evidence", "ValueError: To serve at least one request with the models's max seq len "
                        "(65536), (1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
                        "(0.14 GiB). Based on the available memory, the estimated maximum model length is 9216.")
    trial.set_user_attr("remedy", "lower max-model-len to at most 9216")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    dashboard.save_trial_note(study, 0, "ttft_p95", "ms")
    note = get_note(_ref(study, 0))
    assert note.startswith("## Trial 0: PRUNED, `kv_too_small`")
    assert "**Failure**: `kv_too_small`: `ValueError: To serve" in note
    assert "**Remedy**: lower max-model-len to at most 9216" in note
    assert "**Diagnosis**" in note


def test_rewriting_a_note_replaces_it(study):
    for value in (3.0, 1.0):
        trial = study.ask()
        study.tell(trial, value)
    dashboard.save_trial_note(study, 1, "ttft_p95", "ms")
    dashboard.save_trial_note(study, 1, "ttft_p95", "ms")
    assert get_note(_ref(study, 1)).count("## Trial 1") == 1
    assert get_note(_ref(study, 0)) == ""


def test_the_study_note_gives_the_best_its_gain_and_the_command(study, tmp_path):
    from optimizer.report.summary import summarize_study

    for value, seqs, baseline in ((900.0, "16", True), (300.0, "32", False)):
        trial = study.ask()
        trial.set_user_attr("vllm_args", ["--max-num-seqs", seqs])
        if baseline:
            trial.set_user_attr("baseline", True)
        study.tell(trial, value)
    summary = summarize_study(study, "/models/m", tmp_path)
    assert dashboard.save_study_note(study, summary, tmp_path / "report.html") is None
    note = get_note(study)
    assert ("**Recommended** (best single run): trial 1, value 300 over 1 run(s), **3.00x (one run each side: no interval)** the baseline (trial 0)") in note
    assert "`vllm serve /models/m --max-num-seqs 32`" in note and str(tmp_path / "report.html") in note
