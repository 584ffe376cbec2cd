"""Before a trial boots vLLM on GPUs: hand the server the GPUs Ray assigned, and refuse a GPU
whose memory another process holds.

vLLM refuses to start when a GPU's free memory is below gpu-memory-utilization x its total
(`request_memory` in vllm/v1/worker/utils.py); a trial measured next to a leftover process
would be worse. Checked first with nvidia-smi, such a GPU fails the trial as `infra` (retried,
never held against the configuration) before anything boots. Untested on a GPU.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from optimizer.config.flags import split_flags
from optimizer.engine.failures import Failure

ENV = "CUDA_VISIBLE_DEVICES"
QUERY = ("--query-gpu=index,uuid,memory.total,memory.free", "--format=csv,noheader,nounits")
VLLM_DEFAULT_UTILIZATION = 0.92  # CacheConfig.gpu_memory_utilization (vLLM 0.32)
GRACE_S = 10.0  # a GPU short of memory is read again for this long: the last server may still be exiting
POLL_S = 1.0


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it; memory in MiB (None: not reported, e.g. "[N/A]")."""

    index: str
    uuid: str
    total_mib: float | None
    free_mib: float | None


@dataclass(frozen=True)
class Check:
    gpus: tuple[str, ...] = ()  # the server's CUDA_VISIBLE_DEVICES (empty: left as it is)
    note: str = ""  # one line for the server log's head (empty on CPU: nothing to say)
    failure: Failure | None = None  # set: do not boot vLLM


def before_start(server, params: dict, vllm_args, wait_s: float | None = None) -> Failure | None:
    """Call just before `server.start()`: the assigned GPUs go into the server's environment and
    what was checked into its log; a Failure (infra) means the server must not be started."""
    result = check(params, vllm_args, server.env, GRACE_S if wait_s is None else wait_s)
    if result.gpus:
        server.env[ENV] = ",".join(result.gpus)
    if result.note:
        server.notes.append(result.note)
    return result.failure


def check(params: dict, vllm_args, server_env: dict, wait_s: float = 0.0) -> Check:
    """The GPUs this trial was given and whether each one vLLM will use has the free memory it
    will ask for. In a Ray worker the GPUs are Ray's (`ray.get_gpu_ids()`; none: a CPU trial,
    nothing to do); elsewhere CUDA_VISIBLE_DEVICES (the server's, else this process's). A GPU
    short of memory is read again every POLL_S for `wait_s` before the trial fails."""
    ray_ids = ray_gpu_ids()
    if ray_ids is not None and not ray_ids:
        return Check()  # Ray gave this task no GPU: driver/resources.ray_resources asked for none (a CPU trial)
    given = server_env.get(ENV, os.environ.get(ENV))
    if ray_ids:
        visible: list[str] | None = ray_ids
        head = f"GPUs {','.join(ray_ids)} from Ray"
        if given is not None and parse_visible(given) != ray_ids:
            head += f" (replacing {ENV}={given})"
    else:
        visible = parse_visible(given)
        head = f"GPUs {','.join(visible)} from {ENV}" if visible else f"{ENV} unset: every GPU visible"
    assigned = tuple(visible or ())
    exe = shutil.which("nvidia-smi")
    if exe is None:  # a CPU machine, unless GPUs were assigned (a container without the tool)
        return Check(assigned, f"{head}; nvidia-smi not found: free-memory check skipped" if assigned else "")
    gpus, why = query(exe)
    if why:
        return Check(assigned, f"{head}; free-memory check skipped: {why}")
    if not gpus or visible == []:
        return Check(assigned, f"{head}; nvidia-smi lists no GPU: free-memory check skipped" if assigned else "")
    utilization = _flag(params, vllm_args, ("gpu-memory-utilization",), VLLM_DEFAULT_UTILIZATION)
    world = int(_flag(params, vllm_args, ("tensor-parallel-size", "-tp"), 1)) * int(
        _flag(params, vllm_args, ("pipeline-parallel-size", "-pp"), 1))
    deadline = time.monotonic() + wait_s
    used, unlisted = pick(gpus, visible, world)
    while (short := _short(used, utilization)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        again, why = query(exe)
        if not why and again:
            used, unlisted = pick(again, visible, world)
    readings = "; ".join(_reading(g, utilization) for g in used) or "none readable"
    tail = f"; not checked: {', '.join(unlisted)} (not listed by nvidia-smi --query-gpu, e.g. MIG)" if unlisted else ""
    if not short:
        return Check(assigned, f"{head}; free memory before start (gpu-memory-utilization {utilization:g}): "
                     f"{readings}{tail}")
    names = ", ".join(f"GPU {g.index}" for g in short)
    waited = f"; still short after {wait_s:g} s" if wait_s > 0 else ""
    failure = Failure("infra", f"before start, free memory below gpu-memory-utilization {utilization:g} x total: "
                      f"{'; '.join(_reading(g, utilization) for g in short)}{waited}",
                      f"another process holds the memory of {names} (a previous trial's vLLM server not yet "
                      "gone, or another job): check with `nvidia-smi` and stop it; the trial is queued again")
    return Check(assigned, f"{head}; {failure.evidence}", failure)


def ray_gpu_ids() -> list[str] | None:
    """The GPU ids Ray assigned to this task (as CUDA_VISIBLE_DEVICES lists them), or None outside
    a Ray worker. Never starts Ray: it is only asked when already imported and initialised here."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        if ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
            return None  # the driver: nothing is assigned to it
        ids = ray.get_gpu_ids()
    except Exception:  # a Ray that cannot say is no reason to fail the trial: read CUDA_VISIBLE_DEVICES
        return None
    return sorted((str(i) for i in ids), key=lambda i: (0, int(i), "") if i.isdigit() else (1, 0, i))


def parse_visible(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU visible), else its entries
    up to the first empty or negative one (CUDA ignores the rest; "-1" or "" hide every GPU)."""
    if value is None:
        return None
    entries = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def query(exe: str = "nvidia-smi", timeout: float = 10.0) -> tuple[list[Gpu], str]:
    """Every GPU nvidia-smi lists, or ([], why it could not tell)."""
    try:
        out = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi did not answer ({type(exc).__name__})"
    if out.returncode != 0:
        text = (out.stderr or out.stdout).strip()
        return [], f"nvidia-smi exited {out.returncode}" + (f": {text.splitlines()[0][:200]}" if text else "")
    gpus, lines = [], [line for line in out.stdout.splitlines() if line.strip()]
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            gpus.append(Gpu(parts[0], parts[1], _mib(parts[2]), _mib(parts[3])))
    if lines and not gpus:
        return [], f"nvidia-smi output not understood: {lines[0][:200]!r}"
    return gpus, ""


def pick(gpus: list[Gpu], visible: list[str] | None, world: int) -> tuple[list[Gpu], list[str]]:
    """The GPUs vLLM will use (the first `world` visible ones: tensor x pipeline parallel ranks),
    and the visible entries nvidia-smi does not list. An entry is an index or a UUID (or a unique
    prefix of one, as CUDA accepts). nvidia-smi numbers GPUs in PCI bus order, CUDA fastest first
    unless CUDA_DEVICE_ORDER=PCI_BUS_ID: the indices agree on a machine of identical GPUs."""
    if visible is None:
        chosen = [(g.index, g) for g in gpus]
    else:
        chosen = [(e, next((g for g in gpus if (g.index == str(int(e)) if e.isdigit() else g.uuid.startswith(e))),
                           None)) for e in visible]
    chosen = chosen[:max(world, 1)]
    return [g for _, g in chosen if g is not None], [e for e, g in chosen if g is None]


def needed_mib(gpu: Gpu, utilization: float) -> float:
    """What vLLM asks of this GPU at start: utilization x total. nvidia-smi's total counts the
    driver's reserve (a few hundred MiB), torch's does not: slightly more than vLLM asks."""
    return (gpu.total_mib or 0.0) * utilization


def _short(gpus: list[Gpu], utilization: float) -> list[Gpu]:
    return [g for g in gpus if g.free_mib is not None and g.total_mib is not None
            and g.free_mib < needed_mib(g, utilization)]


def _reading(gpu: Gpu, utilization: float) -> str:
    if gpu.free_mib is None or gpu.total_mib is None:
        return f"GPU {gpu.index}: memory not reported, not checked"
    return (f"GPU {gpu.index} ({gpu.uuid}) {gpu.free_mib:.0f} MiB free of {gpu.total_mib:.0f}, "
            f"needs {math.ceil(needed_mib(gpu, utilization))} MiB")


def _mib(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _flag(params: dict, vllm_args, names: tuple[str, ...], default: float) -> float:
    """The value vLLM will read for a flag: its last occurrence in the arguments (underscores read
    as dashes), else the knob in `params`, else vLLM's default."""
    value = params.get(names[0], default)
    for key, raw in split_flags(list(vllm_args)):
        if key.replace("_", "-") in names and isinstance(raw, str):
            value = raw
    try:
        return float(value)
    except (TypeError, ValueError):
        return default
