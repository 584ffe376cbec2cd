"""The study driver's use of kvfit: before a trial boots, predict whether its max-model-len
fits the KV cache; a configuration that clearly cannot is pruned as `kv_too_small`
(predicted, no boot). After every real start-up the driver learns the server's actual
non-KV memory from its log (or from vLLM's "estimated maximum model length" when it
failed), keeps it on the study (`kv_calibration`), and later predictions use it.

`--no-precheck` (config `precheck: false`) boots everything; the estimate is still
recorded on each trial (`kv_estimate`), so a predicted misfit that started is visible.
"""

from __future__ import annotations

import optuna

from optimizer.config import flags
from optimizer.config import kv_fit as kvfit
from optimizer.engine.device import Device, detect
from optimizer.engine.failures import Failure, kv_too_small_remedy
from optimizer.record import of_study, of_trial
from optimizer.trial.spec import TrialResult

def calibration(study: optuna.Study) -> kvfit.Calibration | None:
    return kvfit.Calibration.from_dict(of_study.kv_calibration(study))


def full_params(vllm_args) -> dict:
    """Every knob a trial's flags set (the sampled ones and the fixed extra flags)."""
    return flags.from_cli_args(list(vllm_args))


def device_now(preference: str) -> Device:
    """The device as it is now: node 0's memory changes while a study runs (docs/vllm-facts.md#node-memory-changes)."""
    return detect(preference)


def predict(study: optuna.Study, plan, vllm_args, device: Device | None = None) -> kvfit.Estimate:
    device = device or device_now(plan.cfg.engine.device)
    return kvfit.estimate(plan.model, device, full_params(vllm_args), calibration(study))


def predicted_result(number: int, est: kvfit.Estimate, fp8_kv: bool = True) -> TrialResult:
    """The outcome of a trial that is not booted because it cannot fit (`fp8_kv`: whether the
    remedy may suggest an fp8 KV cache, which needs AVX-512 or AMX on CPU)."""
    if est.memory_short:
        return TrialResult(number, Failure(
            "oom_startup", f"predicted, not booted: {est.basis}",
            "lower gpu-memory-utilization: on CPU each rank claims that share of the node for itself"))
    if est.budget_bytes <= 0:  # vLLM would stop before the length check: no memory for any cache block
        return TrialResult(number, Failure(
            "oom_startup", f"predicted, not booted: {est.basis}",
            "raise gpu-memory-utilization: the weights and runtime leave no room for a KV cache"))
    return TrialResult(number, Failure(
        "kv_too_small", f"predicted, not booted: {est.basis}",
        kv_too_small_remedy(est.predicted_max_model_len, fp8_kv), est.predicted_max_model_len))


def learn(study: optuna.Study, plan, vllm_args, result: TrialResult,
          device: Device | None = None) -> kvfit.Calibration | None:
    """Fold what a real start-up showed about the KV budget into the study's calibration."""
    # `device` as read just before the boot: the node's total as vLLM saw it when it started
    params, device = full_params(vllm_args), device or device_now(plan.cfg.engine.device)
    found = None
    if result.failure is not None and result.failure.fits_max_model_len:
        found = kvfit.Calibration.from_failure(plan.model, device, params, result.failure.fits_max_model_len)
    elif result.kv_lines:
        found = kvfit.Calibration.from_log(plan.model, device, params, result.kv_lines)
    if found is None:
        return None
    merged = found.merge(calibration(study))
    of_study.write_kv_calibration(study, merged.to_dict())
    return merged


def boots_avoided(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if of_trial.pruned_by_precheck(t))
