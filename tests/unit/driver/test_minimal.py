"""driver/minimal.py: what each changed knob goes back to, the step's record, and its resumption."""

import math
import random
from pathlib import Path
from types import SimpleNamespace

import optuna

from optimizer.config.flags import from_cli_args
from optimizer.driver import minimal
from optimizer.verdict.recommendation import MINIMAL, recommend

WINNER_ARGS = ["--max-num-seqs", "36", "--gpu-memory-utilization", "0.23", "--max-model-len", "44288",
               "--kv-cache-dtype", "auto"]
BASE_ARGS = ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.5", "--max-model-len", "8192",
             "--kv-cache-dtype", "auto"]


def plan(longest=2000, minimal_boots=8):
    return SimpleNamespace(cfg=SimpleNamespace(confirm=SimpleNamespace(minimal=True, minimal_boots=minimal_boots,
                                                                       repeats=2)),
                           workload=SimpleNamespace(longest_request=lambda: longest),
                           space=SimpleNamespace(block=128), model=SimpleNamespace(max_positions=65536),
                           objective=SimpleNamespace(unit="ms", direction="minimize"),
                           artifacts=Path("/nonexistent/artifacts"))


def test_each_changed_knob_goes_back_to_the_baseline_or_to_the_smallest_round_value_that_fits():
    winner = {"max-num-seqs": 36, "gpu-memory-utilization": 0.23, "max-model-len": 44288, "kv-cache-dtype": "auto"}
    base = {"max-num-seqs": 16, "gpu-memory-utilization": 0.5, "max-model-len": 8192, "kv-cache-dtype": "auto"}
    assert minimal.reversions(winner, base, plan()) == {"max-num-seqs": 16, "gpu-memory-utilization": 0.5,
                                                        "max-model-len": 8192}
    # The workload's longest request (9000 tokens) does not fit the baseline's 8192: the next power of two does.
    assert minimal.reversions(winner, base, plan(longest=9000))["max-model-len"] == 16384
    # A knob the baseline leaves to vLLM goes back to vLLM's default (None: the flag dropped); one only the
    # baseline sets is put back to its value.
    assert minimal.reversions({"max-num-seqs": 36}, {"block-size": 32}, plan()) == {"max-num-seqs": None,
                                                                                    "block-size": 32}


def _ask(study, args: list[str]):
    """A trial that ran exactly `args` (its params drawn from them), not yet told."""
    study.enqueue_trial(from_cli_args(args))
    t = study.ask()
    t.suggest_int("max-num-seqs", 1, 256)
    t.suggest_float("gpu-memory-utilization", 0.05, 0.9)
    t.suggest_int("max-model-len", 1024, 65536)
    t.suggest_categorical("kv-cache-dtype", ["auto", "fp8"])
    t.set_user_attr("vllm_args", args)
    return t


def finished_study(runner_up: float = 320.0):
    """Baseline 2400 ms, trial 1 (the confirmed winner) 300 ms, trial 2 `runner_up` in its one search
    run (320 ms, or below trial 1's: Optuna's best single run), 320 ms on average; confirmation done."""
    study = optuna.create_study(direction="minimize")
    for args, value, base in ((BASE_ARGS, 2400.0, True), (WINNER_ARGS, 300.0, False),
                              (WINNER_ARGS[:1] + ["30"] + WINNER_ARGS[2:], runner_up, False)):
        t = _ask(study, args)
        if base:
            t.set_user_attr("baseline", True)
        study.tell(t, value)
    study.set_user_attr("confirmation", {
        "runs": {"1": {"values": [300.0, 290.0, 315.0], "failed": 0}, "2": {"values": [runner_up, 330.0, 310.0], "failed": 0},
                 "0": {"values": [2400.0, 2300.0, 2550.0], "failed": 0}},
        "repeats": 2, "top": 2, "candidates": ["1", "2"] if runner_up >= 300 else ["2", "1"], "baseline": 0, "disqualified": [],
        "intervals": {}, "winner": 1, "clear": True})
    return study


def run_step(study, monkeypatch, booted, stop_after=None):
    rng = random.Random(0)

    def measure_once(plan_, config, key, log_dir, board, progress, runstate, within_slos=False):
        booted.append(log_dir)
        if stop_after is not None and len(booted) > stop_after:
            raise KeyboardInterrupt
        slow = config.get("max-num-seqs") == 16  # only max-num-seqs matters here
        return (2400.0 if slow else 300.0) * math.exp(rng.gauss(0, 0.05))

    monkeypatch.setattr(minimal, "measure_once", measure_once)
    monkeypatch.setattr(minimal, "make_spec", lambda n, p, params, d: SimpleNamespace(
        vllm_args=tuple(f"--{k}={v}" for k, v in params.items())))
    progress = SimpleNamespace(minimizing=lambda *a: None, reverted=lambda r: None, minimized=lambda *a: None)
    return minimal.minimize(study, plan(), None, progress, None)


def test_the_step_keeps_what_mattered_reverts_the_rest_and_becomes_the_recommendation(monkeypatch):
    study, booted = finished_study(), []
    assert minimal.minimal_pending(study, plan())
    record = run_step(study, monkeypatch, booted)
    verdicts = {r["knob"]: r["verdict"] for r in record["rows"]}
    assert verdicts == {"max-num-seqs": "kept", "gpu-memory-utilization": "reverted", "max-model-len": "reverted"}
    assert record["final"]["knobs"] == {"max-num-seqs": 36, "gpu-memory-utilization": 0.5, "max-model-len": 8192,
                                        "kv-cache-dtype": "auto"}
    # max-num-seqs put back measured 8x worse on its first run: kept without a second boot.
    assert record["combined"]["verdict"] == "reverted" and record["boots"] == len(booted) == 4
    assert [r["runs_from"] for r in record["rows"]] == [["minimal/config-0/run-0"], ["minimal/config-1/run-0"],
                                                        ["minimal/config-2/run-0"]]
    assert not minimal.minimal_pending(study, plan())
    rec = recommend(study)
    assert rec.source == MINIMAL and rec.trial.number == 1 and rec.changed_from_trial
    assert rec.values == tuple(record["combined"]["values"]) and rec.run_dir == record["final"]["dir"]
    assert rec.gain["low"] > 5  # 2400 ms against ~300 ms, both measured more than once


def test_an_interrupted_step_resumes_without_booting_again_what_it_measured(monkeypatch):
    study, booted = finished_study(), []
    try:
        run_step(study, monkeypatch, booted, stop_after=3)
    except KeyboardInterrupt:
        pass
    assert len(study.user_attrs["minimal"]["runs"]) == 3 and minimal.minimal_pending(study, plan())
    again = []
    record = run_step(study, monkeypatch, again)
    assert len(again) == record["boots"] - 3  # the three stored runs were read back, not booted


def test_putting_every_knob_back_is_the_baseline_and_its_own_runs_answer_without_a_boot(monkeypatch):
    study, booted = finished_study(), []
    monkeypatch.setattr(minimal, "measure_once", lambda *a, **k: (booted.append(a[3]), 300.0)[1])
    monkeypatch.setattr(minimal, "make_spec", lambda n, p, params, d: SimpleNamespace(vllm_args=("--x",)))
    progress = SimpleNamespace(minimizing=lambda *a: None, reverted=lambda r: None, minimized=lambda *a: None)
    record = minimal.minimize(study, plan(), None, progress, None)
    # Each knob alone measured like the winner, so all three were reverted; together they are the
    # baseline, whose confirmation runs (2300-2550 ms) answer: that hurts, so only one reversion stands.
    assert len(booted) == record["boots"] == 3
    # Its runs (the baseline trial's and its two re-measurements) say it, all read before the
    # verdict: kept, nothing booted.
    assert record["combined"]["values"] == [2400.0, 2300.0, 2550.0] and record["combined"]["verdict"] == "kept"
    assert record["combined"]["runs_from"] == ["trial 0", "trial 0 re-measure 1", "trial 0 re-measure 2"]
    assert sum(r["verdict"] == "reverted" for r in record["rows"]) == 1


def test_a_search_trial_with_the_reverted_flags_answers_for_the_reversion(monkeypatch):
    """Evidence the study already has: trial 3 ran the winner with max-model-len at the baseline's 8192,
    so that reversion is not booted; a trial with another flag changed too does not count."""
    study, booted = finished_study(), []
    reverted = [a if a != "44288" else "8192" for a in WINNER_ARGS]
    other = [a if a != "0.23" else "0.3" for a in reverted]  # also a different memory fraction
    for args, value in ((reverted, 335.0), (other, 5000.0)):  # neither in the top 2: the confirmation stands
        t = _ask(study, args)
        study.tell(t, value)
    record = run_step(study, monkeypatch, booted)
    rows = {r["knob"]: r for r in record["rows"]}
    assert rows["max-model-len"]["runs_from"] == ["trial 3"] and rows["max-model-len"]["values"] == [335.0]
    assert rows["max-model-len"]["verdict"] == "reverted"
    assert len(booted) == record["boots"] == 3  # max-num-seqs, the memory fraction, both reverted together
