"""engine/failures.py, the kernel's OOM kills: the kernel's log names an OOM kill, and a server whose worker the kernel
killed is `oom_startup` with the kernel's line as evidence, not `crash` with the warning Python
printed on the way out. The kill is real: a memory cgroup of 64 MiB (root, cgroup v1 or v2) and a
worker that outgrows it."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from optimizer.engine import failures as oom_kills
from optimizer.engine.vllm import VllmServer

RECORDS = (
    "6,416,26037829261,-;[  11622]     0 11622    22069    19705    18048     1657         0   208896        0     "
    "        0 python3\n"
    "6,417,26037829271,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=python3,"
    "pid=11622,uid=0\n"
    " SUBSYSTEM=memory\n"
    "3,418,26037829292,-;Memory cgroup out of memory: Killed process 11622 (python3) total-vm:88276kB, "
    "anon-rss:72192kB, file-rss:6628kB, shmem-rss:0kB, UID:0 pgtables:204kB oom_score_adj:0\n"
    "3,419,26040000000,-;Out of memory: Killed process 12000 (VLLM::EngineCor) total-vm:1kB\n")


def test_the_kernels_records_are_read_as_kills_with_their_time():
    kills = oom_kills.parse(RECORDS, boot=1_000.0)
    assert [(k.pid, k.name) for k in kills] == [(11622, "python3"), (12000, "VLLM::EngineCor")]
    assert kills[0].at == pytest.approx(1_000.0 + 26037.829292)
    assert kills[0].line.startswith("Memory cgroup out of memory: Killed process 11622 (python3)")


def _memory_cgroup() -> Path:
    """A fresh 64 MiB memory cgroup under this process's own (v1 or v2), or a skip saying why not."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a memory cgroup (the kernel's OOM killer is what is tested)")
    own = {line.split(":")[1]: line.split(":")[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()}
    name = f"oomtest-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory") / own.get("memory", "/").lstrip("/")
    if v1.is_dir():
        group = v1 / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
        return group
    v2 = Path("/sys/fs/cgroup") / own.get("", "/").lstrip("/")
    if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
        group = v2 / name
        group.mkdir()
        (group / "memory.max").write_text(str(64 << 20))
        return group
    pytest.skip("no writable memory cgroup here (cgroup v1 memory or v2 with memory delegated)")


def test_a_server_whose_worker_the_kernel_killed_is_oom_startup_with_the_kernels_line(tmp_path):
    """A stand-in "python" for VllmServer: its worker joins the small cgroup and allocates until the
    kernel kills it; the parent then exits 1 with a resource_tracker warning last, as vLLM's API
    server did when `scale` ran a node out of memory."""
    group = _memory_cgroup()
    try:
        worker = (f"import os, time\nopen({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                  "time.sleep(1.5)\n"  # loading, as a worker does before its KV cache: the server's polls see it
                  "x = []\nwhile True: x.append(bytearray(8 << 20))\n")
        fake = tmp_path / "fake-python"
        fake.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                        f"w = subprocess.Popen([{sys.executable!r}, '-c', {worker!r}])\n"
                        "w.wait()\n"
                        "print(\"warnings.warn('resource_tracker: There appear to be %d '\", flush=True)\n"
                        "sys.exit(1)\n")
        fake.chmod(0o755)
        server = VllmServer("m", [], tmp_path / "server.log", python=str(fake), startup_timeout=60)
        assert server.start() is False
        server.stop()
        assert server.failure.kind == "oom_startup", server.failure
        assert server.failure.evidence.startswith("the kernel's OOM killer killed python")
        assert "Killed process" in server.failure.evidence and "resource_tracker" not in server.failure.evidence
        # the same kernel line names no other process: a pid the server never held is never blamed
        assert oom_kills.killed({1}, server.started_wall) is None
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)
