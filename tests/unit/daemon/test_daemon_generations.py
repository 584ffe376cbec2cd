"""The daemon's generations on a real SQLite storage: naming, finding the latest, the warm starts
a new generation takes from the previous one, and what a dead driver's RUNNING trials become."""

import json
import socket

import optuna
import pytest

from optimizer.config.schema import build_config
from optimizer.daemon.generations import generation_name, latest_generation, with_source
from optimizer.daemon.warm_start import warm_starts
from optimizer.driver import confirm
from optimizer.driver.recovery import recover
from optimizer.search.enqueue import queue_again
from optimizer.driver.store.database import open_storage
from optimizer.driver.store.driver_lock import RunState
from optimizer.errors import ConfigError
from optimizer.verdict import confirmed

COMPLETE, FAIL, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED
RUNNING, WAITING = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """One database for the module (making one costs ~0.2 s): every test names its own studies."""
    return f"sqlite:///{tmp_path_factory.mktemp('db') / 'trials.db'}"


_OPEN: dict[str, optuna.storages.RDBStorage] = {}


def _study(url, name: str, **kw) -> optuna.Study:
    if url not in _OPEN:  # one storage object per database: opening one costs ~0.1 s
        _OPEN[url] = open_storage(url)
    return optuna.create_study(storage=_OPEN[url], study_name=name, **kw)


def _ask(study, seqs: int | None, block: int = 16, attrs: dict | None = None) -> optuna.Trial:
    """Start a trial of these parameters (None: the next queued one)."""
    if seqs is not None:
        study.enqueue_trial({"max-num-seqs": seqs, "block-size": block}, user_attrs=attrs or {})
    trial = study.ask()
    trial.suggest_int("max-num-seqs", 1, 512)
    trial.suggest_categorical("block-size", [16, 32])
    return trial


def _tell(study, seqs: int, value, block: int = 16, excess: float | None = None, state=COMPLETE) -> int:
    trial = _ask(study, seqs, block)
    if excess is not None:  # as outcome.constrain does: one named constraint per SLO, <= 0 holds
        trial.set_constraint("ttft_ms_p99", excess)
    if state == COMPLETE:
        study.tell(trial, value)
    else:
        study.tell(trial, state=state)
    return trial.number


def _p(seqs: int, block: int = 16) -> dict:
    return {"max-num-seqs": seqs, "block-size": block}


# --- names -----------------------------------------------------------------------------------------
def test_generation_names():
    assert [generation_name("base", n) for n in (1, 2, 10)] == ["base", "base-g2", "base-g10"]


def test_latest_generation_on_an_empty_storage_or_of_an_absent_base_is_the_first(tmp_path, url):
    assert latest_generation(f"sqlite:///{tmp_path / 'empty.db'}", "base") == (1, {})
    _study(url, "absent-other")
    assert latest_generation(url, "absent") == (1, {})


def test_latest_generation_is_the_highest_of_this_base_only(url):
    for name in ("base-g3", "base", "base-g2", "base-gx", "other-g9", "basex-g4", "base-g2-g7"):
        _study(url, name).set_user_attr("who", name)
    assert latest_generation(url, "base") == (3, {"who": "base-g3"})
    _study(url, "base-g10").set_user_attr("traffic_source", "/t/new.jsonl")  # numeric, not text, order
    assert latest_generation(url, "base") == (10, {"traffic_source": "/t/new.jsonl"})


def test_latest_generation_of_the_first_alone_keeps_its_attrs(url):
    _study(url, "alone").set_user_attr("generation", 1)
    assert latest_generation(url, "alone") == (1, {"generation": 1})


def test_with_source_points_the_trace_workload_at_the_new_file(tiny_model, tmp_path):
    cfg = build_config({"model": {"path": str(tiny_model)},
                        "workload": {"scenario": "trace", "path": str(tmp_path / "old.jsonl")}})
    assert with_source(cfg, None) is cfg
    moved = with_source(cfg, tmp_path / "new.jsonl")
    assert moved.workload.path == str(tmp_path / "new.jsonl") and cfg.workload.path == str(tmp_path / "old.jsonl")


# --- warm starts ---------------------------------------------------------------------------------
def test_warm_starts_rank_feasible_complete_trials_best_first_when_maximizing(url):
    study = _study(url, "ws-max", direction="maximize")
    _tell(study, 8, 5.0)
    _tell(study, 16, 9.0, excess=0.0)  # on the SLO: feasible
    _tell(study, 32, 50.0, excess=12.0)  # best value, but misses an SLO
    _tell(study, 64, None, state=PRUNED)
    _tell(study, 128, None, state=FAIL)
    _tell(study, 16, 8.0)  # the same configuration again: listed once
    _tell(study, 4, 7.0, block=32)
    _ask(study, 256)  # still RUNNING
    assert warm_starts(study, 10) == [_p(16), _p(4, 32), _p(8)]
    assert warm_starts(study, 2) == [_p(16), _p(4, 32)]


def test_warm_starts_rank_ascending_when_minimizing(url):
    study = _study(url, "ws-min", direction="minimize")
    for seqs, value in ((8, 30.0), (16, 10.0), (32, 20.0)):
        _tell(study, seqs, value)
    _tell(study, 64, 1.0, excess=0.5)
    assert warm_starts(study, 3) == [_p(16), _p(32), _p(8)]


def test_no_warm_starts_for_k_zero_or_a_pareto_study(url):
    study = _study(url, "ws-k0", direction="maximize")
    _tell(study, 8, 5.0)
    assert warm_starts(study, 0) == [] and warm_starts(study, -1) == []
    pareto = _study(url, "ws-pareto", directions=["maximize", "minimize"])
    trial = _ask(pareto, 8)
    pareto.tell(trial, [5.0, 100.0])
    assert warm_starts(pareto, 3) == []
    assert warm_starts(_study(url, "ws-empty"), 3) == []


def test_the_confirmed_winner_goes_first_while_its_confirmation_holds(url):
    study = _study(url, "ws-winner", direction="maximize")
    a, b = _tell(study, 8, 10.0), _tell(study, 16, 9.0)
    _tell(study, 32, 8.0)
    # re-measured: the search's 10.0 for `a` was luck, `b` is the better configuration
    record = confirm.remeasure(study, 2, 1, lambda t, k: {a: 1.0, b: 20.0}[t.number])
    assert record["winner"] == b and confirmed.current_winner(study) == b
    assert warm_starts(study, 3) == [_p(16), _p(8), _p(32)]
    assert warm_starts(study, 1) == [_p(16)]
    _tell(study, 64, 11.0)  # a new best after the confirmation: it no longer describes the top two
    assert confirmed.current_winner(study) is None
    assert warm_starts(study, 3) == [_p(64), _p(8), _p(16)]


# --- a dead driver's RUNNING trials ---------------------------------------------------------------
def test_queue_again_records_why(url):
    study = _study(url, "qa")
    first = _ask(study, 8, attrs={"warm_start": True})
    study.tell(first, state=FAIL)
    assert queue_again(study, first, always=True, reason="disk") is True
    assert queue_again(study, study.trials[first.number]) is True  # from a FrozenTrial too; no reason given
    waiting = study.get_trials(states=(WAITING,))
    assert [t.user_attrs for t in waiting] == [{"warm_start": True, "retry_of": first.number, "retry_reason": "disk"},
                                               {"warm_start": True, "retry_of": first.number}]
    assert all(t.system_attrs["fixed_params"] == _p(8) for t in waiting)


def test_recover_fails_a_dead_drivers_trial_and_queues_it_once(url, tmp_path):
    study = _study(url, "lost", direction="maximize")
    _tell(study, 8, 5.0)
    lost = _ask(study, 16, attrs={"baseline": True})  # the driver was SIGKILLed during this trial
    rs = RunState(url, tmp_path)
    rs.path.write_text(json.dumps({"driver": {"pid": 4_000_000, "host": socket.gethostname(), "create_time": 1.0},
                                   "servers": {}, "ray_processes": []}))
    with rs:
        rs.acquire()
        assert recover(_study_again(url, "lost"), rs.previous) == 1
    t = study.trials[lost.number]
    assert t.state == FAIL and t.user_attrs["failure_kind"] == "infra"
    assert f"pid 4000000 on {socket.gethostname()}" in t.user_attrs["evidence"]
    (again,) = study.get_trials(states=(WAITING,))
    assert again.user_attrs == {"baseline": True, "retry_of": lost.number, "retry_reason": "driver_lost"}

    retry = _ask(study, None)  # the retry is lost with the driver too: it may be what kills the machine
    assert retry.user_attrs["retry_reason"] == "driver_lost"
    assert recover(study, None) == 1
    t = study.trials[retry.number]
    assert t.state == FAIL and "a previous driver" in t.user_attrs["evidence"]
    assert study.get_trials(states=(WAITING, RUNNING)) == []
    assert recover(study, None) == 0


def test_a_retry_for_another_reason_lost_with_the_driver_is_queued_again(url):
    study = _study(url, "lost-retry")
    first = _ask(study, 8)
    study.tell(first, state=FAIL)
    queue_again(study, first, always=True, reason="interrupted")
    retry = _ask(study, None)
    assert retry.user_attrs["retry_reason"] == "interrupted"
    assert recover(study, {"pid": 7, "host": "h"}) == 1
    (again,) = study.get_trials(states=(WAITING,))
    assert again.user_attrs == {"retry_of": retry.number, "retry_reason": "driver_lost"}


def _study_again(url, name: str) -> optuna.Study:
    """The study as a new driver loads it (a fresh storage object on the same file)."""
    return optuna.load_study(study_name=name, storage=open_storage(url))


def test_a_resumed_generation_replays_its_stamped_workload_though_its_trace_grew(tmp_path, tiny_model):
    """A watched trace appended to while the daemon was down: the restart resumes the same study
    (the watch, not the stamp check, decides whether the traffic changed)."""
    from optimizer.config.schema import build_config
    from optimizer.daemon.loop import Daemon
    from optimizer.driver.plan import open_study, prepare

    trace = tmp_path / "t.jsonl"
    rows = [json.dumps({"timestamp": i / 4, "input_tokens": 50 + i, "output_tokens": 8}) for i in range(12)]
    trace.write_text("\n".join(rows) + "\n")
    cfg = build_config({"study_name": "grow", "storage": f"sqlite:///{tmp_path / 'trials.db'}",
                        "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
                        "space": {"max-num-seqs": {"low": 4, "high": 8}},
                        "workload": {"scenario": "trace", "path": str(trace), "warmup_requests": 0}})
    study, plan = open_study(prepare(cfg))
    with open(trace, "a") as f:
        f.write(json.dumps({"timestamp": 3.0, "input_tokens": 70, "output_tokens": 8}) + "\n")
    grown = prepare(cfg)
    assert grown.workload.content_hash() != plan.workload.content_hash()
    with pytest.raises(ConfigError, match="another workload"):
        open_study(grown)  # what a restart did before
    daemon = Daemon(cfg, None, "127.0.0.1", 0, None)
    resumed = daemon._as_stamped(grown, dict(study.user_attrs))
    assert resumed.workload.content_hash() == plan.workload.content_hash()
    again, _ = open_study(resumed)
    assert again.study_name == "grow"


def test_warm_starts_carry_the_knobs_screening_held_at_the_baseline(url):
    """A trial drawn while screening held block-size drew only max-num-seqs; the next generation's
    warm start still names the block size it ran with, so it runs what was measured."""
    study = _study(url, "ws-held", direction="maximize")
    trial = study.ask({"max-num-seqs": optuna.distributions.IntDistribution(1, 256)})
    trial.set_user_attr("vllm_args", ["--max-num-seqs", str(trial.params["max-num-seqs"]), "--block-size", "32"])
    study.tell(trial, 9.0)
    study.set_user_attr("screening", {"block-size": {"searched": False}})
    assert warm_starts(study, 1) == [_p(trial.params["max-num-seqs"], 32)]
