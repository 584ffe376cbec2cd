"""aiconfigurator-core's estimate of one vLLM replica on a device its authors measured.

aiconfigurator-core (NVIDIA, Apache-2.0) ships per-operation timings measured with vLLM on
A100, H100, H200, B200 and L40S among others, and estimators that add them up for a model's
layers. This module asks it for the two numbers a load is built from, at the batch the load runs:
- closed load: its continuous-batching estimate (`run_agg`) at batch b with one prompt's tokens
  of prefill in each mixed step (the steady state of a closed loop: a request joins as one
  leaves), which gives TTFT and TPOT directly, and the queue past the batch added as the
  roofline does;
- burst: its static-batch estimate (`run_static`) at batch b: the batch's prefill and its decode
  step, composed into waves as the roofline composes them (whatif/roofline.py).
KV capacity and whether a request fits come from the roofline's arithmetic for both predictors.

The library's answer for a system it has no data for, or a model it cannot build, is None with
the reason: the caller falls back to the roofline and says so.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from optimizer.whatif import roofline
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
    return device.name in SYSTEMS and version() is not None


@lru_cache(maxsize=None)
def _database(system: str):
    from aiconfigurator_core.sdk.perf_database import get_database  # noqa: PLC0415

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return get_database(system, "vllm", "current")


def data_version(device: DeviceSpec) -> str:
    """The vLLM version the library's timings for this device were measured with."""
    return str(getattr(_database(SYSTEMS[device.name]), "version", "?"))


def _model_ref(source: str, config: dict | None) -> str:
    """What aiconfigurator-core builds the model from: a local directory, a Hub id it ships a
    config for, or a copy of the config we read (so that it never reaches for the network)."""
    if Path(source).expanduser().is_dir() or bundled_config(source) is not None or config is None:
        return str(Path(source).expanduser()) if Path(source).expanduser().is_dir() else source
    import json  # noqa: PLC0415

    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vllm-optimizer" / "whatif-configs"
    folder = root / source.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def estimate(source: str, arch: Architecture, device: DeviceSpec, s: roofline.Serving, load: roofline.Load,
             config: dict | None = None) -> roofline.Estimate | str:
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

        db = _database(SYSTEMS[device.name])
        model = get_model(_model_ref(source, config), ModelConfig(tp_size=s.tp), "vllm")
        backend = get_backend("vllm")  # a new one each time: its cache is not keyed by model
        runtime = RuntimeConfig(batch_size=base.batch, isl=load.isl, osl=load.osl)
        if load.burst:
            row = backend.run_static(model, db, runtime, mode="static").get_summary_df().iloc[0]
        else:
            row = backend.run_agg(model, db, runtime, ctx_tokens=load.isl).get_summary_df().iloc[0]
    except Exception as exc:  # the library refuses a model or a shape in many ways: one line, then the roofline
        return f"{NAME} could not estimate {arch.name} on {device.name}: {str(exc).splitlines()[0][:160]}"
    ttft, tpot = float(row["ttft"]) / 1e3, float(row["tpot"]) / 1e3
    b = base.batch
    if load.burst:
        waves = math.ceil(load.concurrency / b)
        wave = ttft + load.osl * tpot
        mean_ttft = (waves - 1) / 2 * wave + ttft * (b + 1) / (2 * b)  # the mean place among b prefills
        return replace(base, ttft_s=mean_ttft, tpot_s=tpot, throughput=load.concurrency * load.osl / (waves * wave))
    queue = max(0, load.concurrency / b - 1) * load.osl * tpot
    return replace(base, ttft_s=ttft + queue, tpot_s=tpot, throughput=b / tpot)
