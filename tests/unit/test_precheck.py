"""precheck.py: the driver's use of the KV estimate (predict, prune without a boot, learn)."""

from pathlib import Path
from types import SimpleNamespace

import optuna

from optimizer import precheck
from optimizer.engine.failures import Failure
from optimizer.modelinfo import load_model_info
from optimizer.trial import TrialResult

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kvfit"


def plan_for(tiny_model):
    return SimpleNamespace(model=load_model_info(str(tiny_model), "bfloat16"), cfg=SimpleNamespace(
        engine=SimpleNamespace(device="cpu")))


def test_a_length_no_node_could_hold_is_predicted_and_the_result_says_so(tiny_model):
    plan = plan_for(tiny_model)
    study = optuna.create_study()
    # util 0.01 of node 0 is far below the process's own ~0.9 GiB: no KV cache at all
    est = precheck.predict(study, plan, ["--gpu-memory-utilization", "0.01", "--max-model-len", "65536"])
    assert not est.fits
    result = precheck.predicted_result(4, est)
    assert result.failure.kind == "kv_too_small" and result.failure.evidence.startswith("predicted, not booted")
    assert result.stop is None and result.phases == {}  # nothing ran


def test_learning_from_a_start_up_log_is_kept_on_the_study(tiny_model):
    plan = plan_for(tiny_model)
    study = optuna.create_study()
    assert precheck.calibration(study) is None
    log = (FIXTURES / "started_mml8192_util0.5.log").read_text()
    args = ["--gpu-memory-utilization", "0.5", "--max-model-len", "8192"]
    learned = precheck.learn(study, plan, args, TrialResult(0, None, kv_lines=log))
    assert learned is not None and precheck.calibration(study) == learned
    # a failure stating vLLM's own estimate is learned too, and merged with what was known
    failed = TrialResult(1, Failure("kv_too_small", "...", "...", 17920))
    merged = precheck.learn(study, plan, ["--gpu-memory-utilization", "0.1167", "--max-model-len", "65536"], failed)
    assert merged.samples == learned.samples + 1
    # a trial that showed nothing about the KV budget changes nothing
    assert precheck.learn(study, plan, args, TrialResult(2, Failure("crash", "x", "y"))) is None


def test_boots_avoided_counts_predicted_prunes():
    study = optuna.create_study()
    for mark in ("pruned", None, "pruned"):
        t = study.ask()
        if mark:
            t.set_user_attr("precheck", mark)
        study.tell(t, state=optuna.trial.TrialState.PRUNED)
    assert precheck.boots_avoided(study) == 2
