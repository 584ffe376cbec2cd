"""driver/kv_precheck.py: the driver's use of the KV estimate (predict, prune without a boot, learn)."""

from pathlib import Path
from types import SimpleNamespace

import optuna

from optimizer.config.model_info import load_model_info
from optimizer.driver import kv_precheck as precheck
from optimizer.engine.device import GIB, read_node_memory
from optimizer.engine.failures import Failure
from optimizer.trial.spec import TrialResult

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kvfit"


def plan_for(tiny_model):
    return SimpleNamespace(model=load_model_info(str(tiny_model), "bfloat16"), cfg=SimpleNamespace(
        engine=SimpleNamespace(device="cpu")))


def test_a_length_that_cannot_fit_is_predicted_kv_too_small(tiny_model):
    plan = plan_for(tiny_model)
    study = optuna.create_study()
    util = round((1.2 * GIB) / read_node_memory().total, 4)  # ~0.3 GiB of KV: 65536 tokens need 1 GiB
    est = precheck.predict(study, plan, ["--gpu-memory-utilization", str(util), "--max-model-len", "65536"])
    assert not est.fits and est.budget_bytes > 0
    result = precheck.predicted_result(4, est)
    assert result.failure.kind == "kv_too_small" and result.failure.evidence.startswith("predicted, not booted")
    assert 0 < result.failure.fits_max_model_len < 65536
    assert result.stop is None and result.phases == {}  # nothing ran


def test_no_room_for_any_cache_block_is_predicted_oom_startup(tiny_model):
    plan = plan_for(tiny_model)
    # util 0.001 of node 0 is far below the process's own ~0.9 GiB: vLLM stops before the length check
    est = precheck.predict(optuna.create_study(), plan, ["--gpu-memory-utilization", "0.001", "--max-model-len", "4096"])
    assert not est.fits and est.budget_bytes <= 0
    failure = precheck.predicted_result(4, est).failure
    assert failure.kind == "oom_startup" and "raise gpu-memory-utilization" in failure.remedy


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
