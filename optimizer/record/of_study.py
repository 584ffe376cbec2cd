"""What a study records about itself: the stamp written when it is created (what it measures, on
what, with which vLLM), whether remedies may suggest an fp8 KV cache, the KV-cache calibration,
the screening phase's state, and the output gate's reference answers.

The stamp's identity keys (objective, model, workload hash) say what a resumed study must still
measure; `workload_hash` is written last, so a study holding it is stamped in full.
"""

from __future__ import annotations

from optimizer.record._holder import attrs, get, has, put

OBJECTIVE = "objective"  # 'latency:ttft_p95 slos p95 TPOT <= 50 ms' (driver/plan.py objective_stamp)
MODEL = "model"
WORKLOAD_HASH = "workload_hash"
IDENTITY = (OBJECTIVE, WORKLOAD_HASH, MODEL)  # what a resumed study must still measure
WORKLOAD = "workload"  # the workload's one-line description
WORKLOAD_NOTES = "workload_notes"
WORKLOAD_FILE = "workload_file"  # where it was materialized
WORKLOAD_FILE_ERROR = "workload_file_error"  # why it could not be (a full disk)
DEVICE = "device"  # "cpu" or "gpu"
DEVICE_NAME = "device_name"  # which GPU
VLLM_VERSION = "vllm_version"
FP8_KV = "fp8_kv"  # whether the driver's device can hold an fp8 KV cache
KV_CALIBRATION = "kv_calibration"
SCREENING = "screening"  # knob -> what its move alone found (verdict/screening.py)
SCREENING_QUEUED = "screening_queued"
SCREENING_RELEASED = "screening_released"  # the trial count when every knob was released
REGRESSION_REFERENCE = "regression_reference"  # the baseline's answers
MAX_FLIP_RATE = "max_flip_rate"
# Every key the stamp may write before `workload_hash` (version.py tells a half-stamped study by them).
STAMP = (WORKLOAD_FILE, WORKLOAD_FILE_ERROR, WORKLOAD, WORKLOAD_NOTES, DEVICE, VLLM_VERSION, DEVICE_NAME,
         OBJECTIVE, MODEL, FP8_KV)


# ---- the stamp -----------------------------------------------------------------------------------
def identity(objective: str, workload_hash: str, model: str) -> dict:
    """The identity keys with their values, in the order they are stamped (and hashed: driver/plan.py)."""
    return {OBJECTIVE: objective, WORKLOAD_HASH: workload_hash, MODEL: model}


def stamped(holder) -> bool:
    """The study carries its full stamp (its workload hash, written last)."""
    return bool(get(holder, WORKLOAD_HASH))


def identity_of(holder) -> dict:
    """The stored identity keys (None where missing), in `identity`'s order."""
    return {key: get(holder, key) for key in IDENTITY}


def objective(holder) -> str:
    return str(get(holder, OBJECTIVE) or "")


def model(holder) -> str | None:
    return get(holder, MODEL) or None


def workload_hash(holder) -> str | None:
    return get(holder, WORKLOAD_HASH) or None


def workload_file(holder) -> str | None:
    return get(holder, WORKLOAD_FILE) or None


def device(holder) -> str:
    """'cpu', 'gpu', or '' when the study does not say."""
    return str(get(holder, DEVICE) or "")


def device_name(holder) -> str:
    return str(get(holder, DEVICE_NAME) or "")


def vllm_version(holder) -> str:
    return str(get(holder, VLLM_VERSION) or "")


def fp8_kv(holder) -> bool | None:
    return get(holder, FP8_KV)


def write_workload_file(study, path: str) -> None:
    put(study, WORKLOAD_FILE, path)


def write_workload_file_error(study, why: str) -> None:
    put(study, WORKLOAD_FILE_ERROR, why)


def write_workload(study, description: str, notes: list[str]) -> None:
    put(study, WORKLOAD, description)
    if notes:
        put(study, WORKLOAD_NOTES, list(notes))


def write_device(study, kind: str, vllm: str, name: str = "") -> None:
    """The device kind, the installed vLLM's version ('' when none) and, where known, the GPU's name."""
    put(study, DEVICE, kind)
    put(study, VLLM_VERSION, vllm)
    if name:
        put(study, DEVICE_NAME, name)


def write_identity(study, values: dict) -> None:
    """The identity keys (`identity`'s dict), `workload_hash` last: the study is stamped once it is there."""
    for key, value in sorted(values.items(), key=lambda kv: kv[0] == WORKLOAD_HASH):
        put(study, key, value)


def write_fp8_kv(study, fp8: bool) -> None:
    put(study, FP8_KV, fp8)


# ---- the KV-cache calibration ------------------------------------------------------------------
def kv_calibration(holder) -> dict | None:
    return get(holder, KV_CALIBRATION)


def write_kv_calibration(study, calibration: dict) -> None:
    put(study, KV_CALIBRATION, calibration)


# ---- screening -----------------------------------------------------------------------------------
def screening(holder) -> dict | None:
    """knob -> what its move alone found, once screening is done (None before)."""
    return get(holder, SCREENING)


def has_screening(holder) -> bool:
    return has(holder, SCREENING)


def write_screening(study, found: dict) -> None:
    put(study, SCREENING, found)


def screening_queued(holder) -> bool:
    return bool(get(holder, SCREENING_QUEUED))


def mark_screening_queued(study) -> None:
    put(study, SCREENING_QUEUED, True)


def screening_released(holder) -> int | None:
    """The number of trials when every knob was released (None: not released)."""
    return get(holder, SCREENING_RELEASED)


def mark_screening_released(study, trials: int) -> None:
    put(study, SCREENING_RELEASED, trials)


# ---- the output gate's reference -------------------------------------------------------------
def regression_reference(holder) -> dict | None:
    """{"trial", "outputs", and what it was asked (prompts digest, max_tokens, top_k, batch)}."""
    return get(holder, REGRESSION_REFERENCE)


def has_regression_reference(holder) -> bool:
    return has(holder, REGRESSION_REFERENCE)


def write_regression_reference(study, trial: int, outputs: list, asked: dict) -> None:
    put(study, REGRESSION_REFERENCE, {"trial": trial, "outputs": list(outputs), **asked})


def max_flip_rate(holder):
    return get(holder, MAX_FLIP_RATE)


def write_max_flip_rate(study, rate: float) -> None:
    put(study, MAX_FLIP_RATE, rate)


def all_attrs(holder) -> dict:
    """Every stored attribute, as a plain mapping these accessors read (a study summary's included)."""
    return dict(attrs(holder))
