"""driver/study.py: a study records what it measures; a resume with another workload is refused without writing,
or, with --new-study, opens a separate study and leaves the old one as it was."""

import gc
import re

import optuna
import pytest

from optimizer.cli.entry import parser as _parser
from optimizer.config.schema import build_config
from optimizer.driver.plan import open_study, prepare
from optimizer.driver.store.database import open_storage
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.errors import ConfigError
from optimizer.workload.materialize import read_workload


@pytest.fixture
def make_cfg(tmp_path, tiny_model):
    def make(seed: int = 0, objective: str = "throughput"):
        return build_config({
            "study_name": "stamp", "storage": f"sqlite:///{tmp_path / 'trials.db'}",
            "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
            "space": {"max-num-seqs": {"low": 4, "high": 8}},  # keeps the node's memory out of it
            "objective": {"name": objective, "metric": "ttft_p95" if objective == "latency" else None},
            "workload": {"seed": seed, "requests": 4, "warmup_requests": 1, "short_input": [8, 16],
                         "long_input": [32, 64], "output": [4, 8]},
        })
    return make


def database_bytes(tmp_path) -> dict:
    gc.collect()  # let closed studies release their connections
    return {p.name: p.read_bytes() for p in sorted(tmp_path.glob("trials.db*"))}


def names(url: str) -> list[str]:
    return sorted(s.study_name for s in optuna.study.get_all_study_summaries(open_storage(url)))


def test_a_new_study_is_stamped_with_its_workload(make_cfg):
    plan = prepare(make_cfg())
    study, opened = open_study(plan)
    attrs = study.user_attrs
    assert opened.cfg.study_name == "stamp"
    assert attrs["workload_hash"] == plan.workload.content_hash()
    assert attrs["objective"] == "throughput:output_throughput" and attrs["model"] == plan.model.source
    assert attrs[RECORD_KEY] == RECORD_VERSION
    stored = read_workload(attrs["workload_file"])
    assert stored.content_hash() == attrs["workload_hash"] and stored == plan.workload
    # reopened with the same config: the same study, the stamp kept
    again, _ = open_study(prepare(make_cfg()))
    assert again._study_id == study._study_id and again.user_attrs == attrs


def test_another_workload_is_refused_and_nothing_is_written(make_cfg, tmp_path):
    study, _ = open_study(prepare(make_cfg(seed=0)))
    study.tell(study.ask(), 1.0)
    del study
    before = database_bytes(tmp_path)
    plan = prepare(make_cfg(seed=1))
    with pytest.raises(ConfigError) as err:
        open_study(plan)
    msg = str(err.value)
    assert "workload hash" in msg and "--new-study" in msg
    del err  # its traceback holds the refused call's storage (an open connection keeps -wal/-shm files)
    assert database_bytes(tmp_path) == before


def test_another_objective_is_refused(make_cfg):
    open_study(prepare(make_cfg()))
    with pytest.raises(ConfigError, match="another objective"):
        open_study(prepare(make_cfg(objective="latency")))


def test_new_study_opens_a_separate_study_once_and_keeps_the_old_one(make_cfg):
    old, _ = open_study(prepare(make_cfg(seed=0)))
    old.tell(old.ask(), 1.0)
    old_attrs, old_trials = old.user_attrs, [(t.number, t.state, t.value) for t in old.trials]

    plan = prepare(make_cfg(seed=1), new_study=True)
    new, opened = open_study(plan)
    assert re.fullmatch(r"stamp-[0-9a-f]{8}", new.study_name) and opened.cfg.study_name == new.study_name
    assert opened.artifacts.name == new.study_name
    assert new.user_attrs["workload_hash"] == plan.workload.content_hash() != old_attrs["workload_hash"]
    assert read_workload(new.user_attrs["workload_file"]) == plan.workload
    assert new.trials == []

    storage = open_storage(plan.storage_url)
    kept = optuna.load_study(study_name="stamp", storage=storage)
    assert kept.user_attrs == old_attrs
    assert [(t.number, t.state, t.value) for t in kept.trials] == old_trials

    # the same command again: the same new study, not a third
    again, _ = open_study(prepare(make_cfg(seed=1), new_study=True))
    assert again.study_name == new.study_name and again._study_id == new._study_id
    assert names(plan.storage_url) == sorted(["stamp", new.study_name])
    # --new-study with the original workload needs no new study at all
    same, _ = open_study(prepare(make_cfg(seed=0), new_study=True))
    assert same.study_name == "stamp" and len(names(plan.storage_url)) == 2


def test_cli_has_the_new_study_flag():
    ns = _parser().parse_args(["run", "--config", "study.yaml", "--new-study"])
    assert ns.new_study is True
    assert _parser().parse_args(["run", "--config", "study.yaml"]).new_study is False
