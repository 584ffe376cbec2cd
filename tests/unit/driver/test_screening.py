"""The screening phase: each knob of the space moved alone from the baseline, in the space's order,
then the sampler over the knobs that moved the objective, the others held at the baseline's value."""

import io

import optuna
import pytest
from rich.console import Console

from optimizer.config.schema import build_config
from optimizer.search.screening import screening_moves
from optimizer.driver.launch import Running, launch
from optimizer.driver.plan import open_study, prepare
from optimizer.driver.progress import Progress
from optimizer.driver.recovery import ensure_baseline
from optimizer.record.of_trial import SCREEN
from optimizer.verdict.screening import held, screening, shows_effect

COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
BASE = {"max-num-seqs": 16, "max-model-len": 2048, "kv-cache-dtype": "auto"}


@pytest.fixture
def opened(tmp_path, tiny_model, booted):
    def make(screen=True, **extra):
        cfg = build_config({
            "study_name": "scr", "storage": f"sqlite:///{tmp_path / f'{screen}.db'}", "precheck": False,
            "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
            "space": {"max-num-seqs": {"low": 4, "high": 64, "log": True}, "max-model-len": {"low": 1024, "high": 8192},
                      "kv-cache-dtype": {"choices": ["auto", "fp8"]}},
            "baseline": BASE, "search": {"screen": screen}, "n_trials": 8,
            "objective": {"name": "latency", "metric": "ttft_p95"},
            "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16], "long_input": [32, 64],
                         "output": [4, 8]}, **extra,
        })
        study, plan = open_study(prepare(cfg))
        ensure_baseline(study, plan)
        return study, plan
    return make, booted


def _next(study, plan, out=None):
    return launch(study, plan, None, Progress(Console(file=out or io.StringIO(), width=200)), None, 0)


def test_each_knob_is_moved_alone_from_the_baseline_in_the_spaces_order(opened):
    make, booted = opened
    study, plan = make()
    moves = screening_moves(BASE, plan.space)
    kv = [("kv-cache-dtype", "fp8")] if plan.device.fp8_kv else []  # left out where the CPU cannot run fp8
    assert moves == [("max-num-seqs", 32), ("max-model-len", 4096)] + kv  # doubled on a log range, or a quarter up
    for _ in range(1 + len(moves)):
        r = _next(study, plan)
        assert isinstance(r, Running)
        study.tell(r.trial, 100.0)
    assert booted[0] == BASE
    assert booted[1:] == [{**BASE, knob: value} for knob, value in moves]
    assert [t.user_attrs.get(SCREEN) for t in study.trials] == [None] + [k for k, _ in moves]


def test_the_sampler_then_moves_only_the_knobs_that_moved_the_objective(opened):
    make, booted = opened
    study, plan = make()
    n = 1 + len(screening_moves(BASE, plan.space))
    values = {0: 1000.0, 1: 200.0, 2: 1050.0, 3: 990.0}  # only max-num-seqs moved p95 TTFT (5x)
    for i in range(n):
        r = _next(study, plan)
        study.tell(r.trial, values[i])
    out = io.StringIO()
    r = _next(study, plan, out)
    while not isinstance(r, Running):  # a draw of a measured configuration is told without a boot
        r = _next(study, plan, out)
    assert held(study) == {"max-model-len"} | ({"kv-cache-dtype"} if plan.device.fp8_kv else set())
    assert r.params["max-model-len"] == 2048 and r.params["kv-cache-dtype"] == "auto"
    assert "max-model-len" not in r.trial.params  # not drawn: held at the baseline's value
    text = out.getvalue()
    assert "Screening" in text and "max-num-seqs 16 -> 32" in text and "0.20x the baseline" in text
    assert "held at 2048" in text and "the sampler now moves max-num-seqs" in text
    assert study.user_attrs["screening"]["max-num-seqs"]["searched"] is True
    for _ in range(6):  # every later draw keeps the held knobs at the baseline's values
        r = _next(study, plan)
        if isinstance(r, Running):
            assert r.params["max-model-len"] == 2048
            study.tell(r.trial, 300.0)


def test_without_screening_the_sampler_moves_every_knob_from_the_start(opened):
    make, booted = opened
    study, plan = make(screen=False)
    assert all(SCREEN not in t.user_attrs for t in study.trials)
    r = _next(study, plan)
    study.tell(r.trial, 100.0)
    assert screening(study) is None and held(study) == set()
    r = _next(study, plan)
    assert "max-model-len" in r.trial.params


def test_the_screening_rule():
    assert shows_effect(0.5) and shows_effect(1.3) and not shows_effect(1.1) and not shows_effect(0.9)
    assert shows_effect(None, stopped_early=True) and shows_effect(1.0, missed_slos=True)
    assert not shows_effect(None)


def test_a_move_that_could_not_run_is_held_and_one_stopped_early_is_searched(opened):
    make, _ = opened
    study, plan = make()
    n = 1 + len(screening_moves(BASE, plan.space))
    for i in range(n):
        r = _next(study, plan)
        if i == 1:
            r.trial.set_user_attr("failure_kind", "early_stopped")
            study.tell(r.trial, state=PRUNED)
        elif i == 2:
            r.trial.set_user_attr("failure_kind", "kv_too_small")
            study.tell(r.trial, state=PRUNED)
        else:
            study.tell(r.trial, 1000.0)
    found = screening(study)
    assert found["max-num-seqs"]["searched"] and "stopped early" in found["max-num-seqs"]["why"]
    assert not found["max-model-len"]["searched"] and "kv_too_small" in found["max-model-len"]["why"]


def test_held_knobs_are_released_once_the_sampler_has_nothing_new_to_try(opened):
    make, _ = opened
    study, plan = make()
    n = 1 + len(screening_moves(BASE, plan.space))
    for i in range(n):
        r = _next(study, plan)
        study.tell(r.trial, 200.0 if i == 1 else 1000.0)  # only max-num-seqs moved the objective
    assert "max-model-len" in held(study)
    out, released = io.StringIO(), False
    for _ in range(40):  # max-num-seqs alone has few rungs: the sampler soon proposes measured ones
        r = _next(study, plan, out)
        if isinstance(r, Running):
            study.tell(r.trial, 500.0)
            if "max-model-len" in r.trial.params:
                released = True
                break
    assert released and held(study) == set() and study.user_attrs["screening_released"] > n
    line = next(x for x in out.getvalue().splitlines() if "from now on it moves the held ones too (" in x)
    assert "max-model-len" in line.split("held ones too (")[1]  # kv-cache-dtype too where the CPU runs fp8


def test_warm_starts_run_before_screening_and_screening_fits_the_budget(opened, tmp_path, tiny_model):
    cfg = build_config({
        "study_name": "w", "storage": f"sqlite:///{tmp_path / 'w.db'}", "precheck": False, "n_trials": 3,
        "artifacts_dir": str(tmp_path / "artifacts"), "model": {"path": str(tiny_model)},
        "space": {"max-num-seqs": {"low": 4, "high": 64, "log": True}, "max-model-len": {"low": 1024, "high": 8192}},
        "baseline": {"max-num-seqs": 16, "max-model-len": 2048}, "enqueue": [{"max-num-seqs": 8, "max-model-len": 2048}],
        "objective": {"name": "latency", "metric": "ttft_p95"},
        "workload": {"requests": 4, "warmup_requests": 1, "short_input": [8, 16], "long_input": [32, 64], "output": [4, 8]},
    })
    study, plan = open_study(prepare(cfg))
    ensure_baseline(study, plan)
    first = _next(study, plan)
    study.tell(first.trial, state=optuna.trial.TrialState.FAIL)  # the baseline interrupted: not a value yet
    assert all(SCREEN not in t.user_attrs for t in study.trials)  # nothing to move from
    from optimizer.search.enqueue import queue_again
    queue_again(study, first.trial, always=True, reason="interrupted")
    ran = []
    for _ in range(3):
        r = _next(study, plan)
        ran.append(r.trial.user_attrs)
        study.tell(r.trial, 100.0)
    # The warm start was queued before the baseline's retry; screening waits for the baseline's value.
    assert ran[0].get("enqueued") and ran[1].get("baseline") and ran[2].get(SCREEN) == "max-num-seqs"
    # The budget (3) had room for one screening trial: the other move is not queued to wait forever.
    assert [t.user_attrs.get(SCREEN) for t in study.trials if SCREEN in t.user_attrs] == ["max-num-seqs"]


def test_a_baseline_that_missed_the_slos_is_not_screened_from(opened):
    make, _ = opened
    study, plan = make()
    r = _next(study, plan)
    r.trial.set_constraint("tpot_ms_p95", 1.07)  # 107% over the SLO
    study.tell(r.trial, 21000.0)
    r = _next(study, plan)
    assert SCREEN not in r.trial.user_attrs and "max-model-len" in r.trial.params  # the sampler, every knob
    assert "screening_queued" not in study.user_attrs


def test_screening_trials_are_stopped_early_against_the_baseline_not_the_best(opened):
    make, _ = opened
    study, plan = make()
    r = _next(study, plan)
    study.tell(r.trial, 1000.0)  # the baseline
    r = _next(study, plan)
    assert r.trial.user_attrs[SCREEN] == "max-num-seqs" and r.best == 1000.0
    study.tell(r.trial, 200.0)  # a 5x better knob: the best so far
    r = _next(study, plan)
    assert r.trial.user_attrs[SCREEN] == "max-model-len" and r.best == 1000.0  # still the baseline's value


def test_a_move_the_twin_schedules_as_the_baseline_is_held_without_a_boot(opened, monkeypatch):
    """search.prior twin: max-model-len 4096 changes nothing vLLM's scheduler does on this workload (the
    stand-in twin gives it the baseline's value exactly): not booted, and screening holds it."""
    from optimizer.search import prior
    from optimizer.search.prior import Predicted

    def twin(plan, params, runs=None):
        if params.get("kv-cache-dtype") == "fp8":
            return Predicted(100.0, (0,), ("KV dtype fp8 never calibrated",), schedule="base")
        return Predicted(80.0, (0,), schedule="32") if params["max-num-seqs"] == 32 else Predicted(
            100.0, (0,), schedule="base")

    monkeypatch.setattr(prior, "predict", twin)
    make, booted = opened
    study, plan = make(search={"screen": True, "prior": "twin"})
    moves = screening_moves(BASE, plan.space)
    study.tell(_next(study, plan).trial, 100.0)  # the baseline, measured
    for knob, _ in moves:
        r = _next(study, plan)
        if knob == "max-model-len":
            assert r[0] == PRUNED and r[1].kind == "predicted_same"
        else:
            assert isinstance(r, Running)
            study.tell(r.trial, 90.0)
    assert booted == [BASE] + [{**BASE, k: v} for k, v in moves if k != "max-model-len"]
    row = screening(study)["max-model-len"]
    assert row == {"trial": row["trial"], "to": 4096, "ratio": None, "searched": False,
                   "why": "the twin schedules it as the baseline: not booted"}
    assert "max-model-len" in held(study)
