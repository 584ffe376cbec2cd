"""record/version.py: the version of the tool's study record, checked on opening a study."""

import shutil
from pathlib import Path

import optuna
import pytest

from optimizer.record.version import RECORD_KEY, RECORD_VERSION, check, migrate
from optimizer.errors import ConfigError


def _study(**attrs):
    study = optuna.create_study(study_name="s")
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def test_the_tools_studies_open_and_an_old_one_is_stamped_version_1():
    check(_study(**{RECORD_KEY: RECORD_VERSION, "workload_hash": "h"}))
    old = _study(workload_hash="h", objective="latency:ttft_p95")  # made before the stamp existed
    check(old)
    migrate(old)
    assert old.user_attrs[RECORD_KEY] == 1
    half = _study(workload="chat", device="cpu")  # stopped while it was being stamped: still the tool's
    check(half)
    migrate(half)
    assert RECORD_KEY not in half.user_attrs  # stamped in full by the run, not here
    check(_study())  # empty: the run stamps it


def test_a_newer_record_or_another_programs_study_is_refused():
    with pytest.raises(ConfigError, match=r"newer vllm-optimizer \(study record version 2; this one reads up to 1\)"):
        check(_study(**{RECORD_KEY: RECORD_VERSION + 1, "workload_hash": "h"}))
    foreign = _study()
    foreign.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    with pytest.raises(ConfigError, match=r"not made by vllm-optimizer \(it holds 1 trial\(s\)"):
        check(foreign)
    with pytest.raises(ConfigError, match=r"it holds attributes owner and no stamp"):
        check(_study(owner="someone"))


FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "studies" / "daemon_2026-12-05.db"


def test_a_study_stored_before_the_stamp_still_reads_and_is_stamped_version_1_when_a_run_resumes(tmp_path):
    """A real database the daemon wrote on 2026-12-05, before the record version existed: its first
    generation ('live': two trials and a re-measurement), and two more."""
    from optimizer.config.schema import build_config
    from optimizer.driver.store.finished_study import open_finished

    db = tmp_path / "old.db"
    shutil.copy(FIXTURE, db)
    cfg = build_config({"study_name": "live", "storage": f"sqlite:///{db}", "model": {"path": "/m"},
                        "objective": {"name": "latency", "metric": "ttft_p50"}})
    before = db.read_bytes()
    finished = open_finished(cfg)  # what report and plan open: read, never written
    assert len(finished.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
    assert RECORD_KEY not in finished.study.user_attrs and db.read_bytes() == before
    study = optuna.load_study(study_name="live", storage=f"sqlite:///{db}")
    check(study)
    migrate(study)  # as open_study does once the run goes on
    assert optuna.load_study(study_name="live", storage=f"sqlite:///{db}").user_attrs[RECORD_KEY] == 1


def test_a_refused_study_is_left_byte_for_byte_even_in_sqlites_default_journal_mode(tmp_path, tiny_model):
    """The driver opens storage for writing in WAL mode, which rewrites a rollback-journal file's header:
    the check runs on a read-only look first."""
    from optimizer.config.schema import build_config
    from optimizer.driver.plan import open_study, prepare
    from optimizer.driver.store.database import close_storage

    db = tmp_path / "trials.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")  # Optuna's own default: a rollback journal
    other = optuna.create_study(study_name="tune", storage=storage)
    other.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    close_storage(storage)
    before = db.read_bytes()
    cfg = build_config({"study_name": "tune", "storage": f"sqlite:///{db}", "artifacts_dir": str(tmp_path / "a"),
                        "model": {"path": str(tiny_model)}, "space": {"max-num-seqs": {"low": 4, "high": 8}},
                        "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16],
                                     "long_input": [32, 64], "output": [4, 8]}})
    with pytest.raises(ConfigError, match=r"not made by vllm-optimizer \(it holds 1 trial\(s\)") as err:
        open_study(prepare(cfg))
    del err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("trials.db")) == ["trials.db"]
