"""aiconfigurator-core's estimate of one vLLM replica on a device its authors measured.

aiconfigurator-core (NVIDIA, Apache-2.0) ships per-operation timings measured with vLLM on
A100, H100, H200, B200 and L40S among others, and estimators that add them up for a model's
layers. This module asks it for the two numbers a load is built from, at the batch the load runs:
- closed load: its continuous-batching estimate (`run_agg`) at batch b with one prompt's tokens
  of prefill in each mixed step (the steady state of a closed loop: a request joins as one
  leaves), which gives TTFT and TPOT directly; past the batch, a request waits for a place
  as in the roofline's waves;
- burst: its static-batch estimate (`run_static`) at batch b: the batch's prefill and its decode
  step, composed into waves as the roofline composes them (whatif/roofline.py).
KV capacity and whether a request fits come from the roofline's arithmetic for both predictors.

The library is handed a local directory or a copy of the config.json that was read, never a
Hub id to fetch (it would reach for the network on every call), and the weights' and KV cache's
precision (fp8). Its answer for a system it has no data for, a device the operator described,
or a model it cannot build is the reason instead: the caller falls back to the roofline and
says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from optimizer.whatif import architecture, roofline
from optimizer.whatif.architecture import Architecture, bundled_config
from optimizer.whatif.devices import DeviceSpec

SYSTEMS = {"a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "l40s": "l40s"}
NAME = "aiconfigurator-core"


def version() -> str | None:
    try:
        return metadata.version(NAME)
    except metadata.PackageNotFoundError:
        return None


def covered(device: DeviceSpec) -> bool:
    """The library has vLLM timings for this device (never for one the operator described)."""
    return device.name in SYSTEMS and not device.custom and version() is not None


@lru_cache(maxsize=None)
def _system_database(system: str):
    from aiconfigurator_core.sdk.perf_database import get_database  # noqa: PLC0415

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return get_database(system, "vllm", "current")


def database(device: DeviceSpec):
    """The library's vLLM timings for `device` (a covered one)."""
    return _system_database(SYSTEMS[device.name])


def data_version(device: DeviceSpec) -> str:
    """The vLLM version the library's timings for this device were measured with."""
    return str(getattr(database(device), "version", "?"))


def model_ref(source: str) -> str:
    """What aiconfigurator-core builds the model from, never a name it would look up on the Hub: a
    local directory, a model it knows by id, or a copy of the config.json (and
    hf_quant_config.json) whatif/architecture.py read."""
    path = Path(source).expanduser()
    if path.is_dir():
        return str(path)
    from aiconfigurator_core.sdk.common import DefaultHFModels  # noqa: PLC0415

    if source in DefaultHFModels and bundled_config(source) is not None:
        return source
    cfg, hf_quant = architecture.read(source)
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-optimizer" / "whatif-configs"
    folder = root / source.strip("/").replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return str(folder)


def modes(source: str, arch: Architecture, s: roofline.Serving) -> dict:
    """What the library is told beyond TP: the KV cache's precision always (left to itself it takes
    an fp8 checkpoint's cache for fp8, where vLLM's `auto` keeps it 16-bit); fp8 weights only when
    the config does not declare them (the library reads a declared quantization itself, block-scaled
    fp8 included); for a mixture of experts, its experts split over the TP ranks (vLLM without
    --enable-expert-parallel)."""
    from aiconfigurator_core.sdk import common  # noqa: PLC0415

    fp8_kv = s.kv_dtype.startswith("fp8")
    out = {"kvcache_quant_mode": common.KVCacheQuantMode.fp8 if fp8_kv else common.KVCacheQuantMode.bfloat16}
    cfg, hf_quant = architecture.read(source)
    if arch.fp8_weights and not cfg.get("quantization_config") and not hf_quant:
        out["gemm_quant_mode"] = common.GEMMQuantMode.fp8
    if arch.experts:
        out.update(moe_tp_size=s.tp, moe_ep_size=1)
    return out


def estimate(source: str, arch: Architecture, device: DeviceSpec, s: roofline.Serving,
             load: roofline.Load) -> roofline.Estimate | str:
    """The library's estimate of this replica at this load, or why it has none (one line)."""
    if not covered(device):
        return f"{NAME} has no vLLM timings for {device.name}" if version() else f"{NAME} is not installed"
    base = roofline.estimate(arch, device, s, load)  # KV capacity and the batch
    if not base.fits:
        return base
    try:
        from aiconfigurator_core.sdk import ModelConfig, RuntimeConfig  # noqa: PLC0415
        from aiconfigurator_core.sdk.backends.factory import get_backend  # noqa: PLC0415
        from aiconfigurator_core.sdk.models import get_model  # noqa: PLC0415

        db = database(device)
        model = get_model(model_ref(source), ModelConfig(tp_size=s.tp, **modes(source, arch, s)), "vllm")
        backend = get_backend("vllm")  # a new one each time: its cache is not keyed by model
        runtime = RuntimeConfig(batch_size=base.batch, isl=load.isl, osl=load.osl)
        if load.burst:
            row = backend.run_static(model, db, runtime, mode="static").get_summary_df().iloc[0]
        else:
            row = backend.run_agg(model, db, runtime, ctx_tokens=load.isl).get_summary_df().iloc[0]
        ttft, tpot = float(row["ttft"]) / 1e3, float(row["tpot"]) / 1e3
        if not (math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0):
            raise ValueError(f"it answered TTFT {ttft:g} s, TPOT {tpot:g} s")
    except Exception as exc:  # the library refuses a model or a shape in many ways: one line, then the roofline
        return f"{NAME} could not estimate {arch.name} on {device.name}: {str(exc).splitlines()[0][:160]}"
    b = base.batch
    waves = math.ceil(load.concurrency / b)
    wave = ttft + load.osl * tpot  # a batch's prefill and its decode: the time a place in the batch is held
    if load.burst:
        mean_ttft = (waves - 1) / 2 * wave + ttft * (b + 1) / (2 * b)  # the mean place among b prefills
        return replace(base, ttft_s=mean_ttft, tpot_s=tpot, throughput=load.concurrency * load.osl / (waves * wave))
    # closed: the steady state in the batch, past it the mean wait for a place, as the roofline's waves
    return replace(base, ttft_s=ttft + (waves - 1) / 2 * wave, tpot_s=tpot, throughput=b / tpot)
