"""vLLM inside a Ray task on GPUs (trial/gpu_check.py), with a stand-in `nvidia-smi` on PATH that prints
canned CSV and a stand-in Ray module: the GPUs Ray assigned reach the server's environment, and a
GPU short of free memory fails the trial as `infra` before anything boots. No GPU here: these
paths have not yet run on a real GPU."""

import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from optimizer.config.flags import engine_args_for
from optimizer.config.schema import RaySpec
from optimizer.driver.resources import ray_resources
from optimizer.engine.failures import RETRIED, log_lines
from optimizer.engine.vllm import VllmServer
from optimizer.trial import gpu_check as gpucheck
from optimizer.trial import task as trial_mod
from optimizer.trial.spec import TrialSpec
from optimizer.trial.task import execute_trial
from optimizer.workload import Workload

# nvidia-smi: the rows of gpus.N.csv on its N-th call when that file exists, else gpus.csv;
# every call's arguments go to calls.txt; `-L` lists the GPUs as device.gpu_count reads them.
FAKE_SMI = """#!/bin/sh
d=$(dirname "$0")
echo "$@" >> "$d/calls.txt"
if [ -f "$d/exit_code" ]; then echo "NVIDIA-SMI has failed" >&2; exit $(cat "$d/exit_code"); fi
if [ "$1" = "-L" ]; then
  while IFS=, read i rest; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done < "$d/gpus.csv"; exit 0
fi
n=$(( $(grep -c -- --query-gpu "$d/calls.txt") ))
if [ -f "$d/gpus.$n.csv" ]; then cat "$d/gpus.$n.csv"; else cat "$d/gpus.csv"; fi
"""
TOTAL = 81559
IDLE = TOTAL - 500  # an idle H100 as nvidia-smi shows it (the driver keeps some)
FOUR = [(0, "GPU-aaaa-0000", TOTAL, IDLE), (1, "GPU-bbbb-1111", TOTAL, 2000),
        (2, "GPU-cccc-2222", TOTAL, IDLE), (3, "GPU-dddd-3333", TOTAL, 900)]


def rows(gpus) -> str:
    return "".join(f"{i}, {uuid}, {total}, {free}\n" for i, uuid, total, free in gpus)


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """A fake nvidia-smi; write its answer with smi.write(rows)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(FAKE_SMI)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # outside a Ray worker unless a test says so
    monkeypatch.setattr(gpucheck, "POLL_S", 0.05)

    def write(text: str, call: int | None = None) -> None:
        (bin_dir / ("gpus.csv" if call is None else f"gpus.{call}.csv")).write_text(text)

    def calls() -> list[str]:
        path = bin_dir / "calls.txt"
        return path.read_text().splitlines() if path.exists() else []

    return SimpleNamespace(dir=bin_dir, write=write, calls=calls)


def fake_ray(ids, mode=1):
    """Ray as a task worker sees it: initialised, in worker mode, with `ids` assigned."""
    return SimpleNamespace(is_initialized=lambda: True, WORKER_MODE=1, get_gpu_ids=lambda: list(ids),
                           get_runtime_context=lambda: SimpleNamespace(worker=SimpleNamespace(mode=mode)))


def server(tmp_path, env=None, python=sys.executable) -> VllmServer:
    return VllmServer("m", [], tmp_path / "server.log", env=env, python=python)


def test_enough_free_memory_passes_and_the_readings_are_recorded(smi, tmp_path):
    smi.write(rows(FOUR[:1]))
    s = server(tmp_path)
    assert gpucheck.before_start(s, {"gpu-memory-utilization": 0.95}, [], wait_s=0) is None
    assert "--query-gpu=index,uuid,memory.total,memory.free" in smi.calls()[0]
    assert "nounits" in smi.calls()[0]
    [note] = s.notes
    assert f"GPU 0 (GPU-aaaa-0000) {IDLE} MiB free of {TOTAL}, needs 77482 MiB" in note  # ceil(0.95 x 81559)
    assert "CUDA_VISIBLE_DEVICES" not in s.env  # nothing assigned: left as it is


def test_one_of_two_gpus_short_of_memory_fails_as_infra_naming_it(smi, tmp_path):
    smi.write(rows(FOUR[:2]))
    s = server(tmp_path)
    failure = gpucheck.before_start(s, {"gpu-memory-utilization": 0.9, "tensor-parallel-size": 2},
                                    ["--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "2"], wait_s=0)
    assert failure is not None and failure.kind == "infra" and failure.kind in RETRIED
    assert "GPU 1 (GPU-bbbb-1111) 2000 MiB free of 81559, needs 73404 MiB" in failure.evidence
    assert "GPU 0" not in failure.evidence  # the idle one is not blamed
    assert "GPU 1" in failure.remedy and "nvidia-smi" in failure.remedy
    assert "another process" in failure.remedy and "previous trial" in failure.remedy


def test_tensor_parallel_one_checks_only_the_gpu_vllm_uses(smi, tmp_path):
    smi.write(rows(FOUR[:2]))  # GPU 1 is busy, but a TP-1 server runs on GPU 0 alone
    s = server(tmp_path)
    assert gpucheck.before_start(s, {"gpu-memory-utilization": 0.9}, [], wait_s=0) is None
    assert "GPU 0" in s.notes[0] and "GPU 1" not in s.notes[0]


def test_the_last_flag_vllm_reads_decides_the_fraction_and_vllms_default_applies(smi, tmp_path):
    smi.write(rows([(0, "GPU-aaaa", 1000, 915)]))
    # extra_args come after the knobs: vLLM reads the last --gpu-memory-utilization (0.95 needs 950)
    args = ["--gpu-memory-utilization", "0.5", "--gpu-memory-utilization", "0.95"]
    assert gpucheck.before_start(server(tmp_path), {"gpu-memory-utilization": 0.5}, args, wait_s=0) is not None
    # not given at all: vLLM's default, 0.92 (needs 920 > 915)
    failure = gpucheck.before_start(server(tmp_path), {}, [], wait_s=0)
    assert failure is not None and "needs 920 MiB" in failure.evidence
    assert gpucheck.before_start(server(tmp_path), {"gpu-memory-utilization": 0.9}, [], wait_s=0) is None


@pytest.mark.parametrize("visible, checked, fails", [
    ("2", ["GPU 2"], False),  # the busy GPUs 1 and 3 are not this trial's
    ("3", ["GPU 3"], True),
    ("GPU-cccc-2222", ["GPU 2"], False),  # a UUID maps to nvidia-smi's index
    ("GPU-dddd", ["GPU 3"], True),  # a UUID prefix, as CUDA accepts
])
def test_only_the_visible_gpus_are_checked(smi, tmp_path, monkeypatch, visible, checked, fails):
    smi.write(rows(FOUR))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    s = server(tmp_path)
    failure = gpucheck.before_start(s, {"gpu-memory-utilization": 0.9}, [], wait_s=0)
    assert (failure is not None) is fails
    named = {f"GPU {i}" for i in range(4) if f"GPU {i} (" in s.notes[0]}
    assert named == set(checked)
    assert s.env["CUDA_VISIBLE_DEVICES"] == visible  # made explicit for the server


def test_visible_indices_keep_cuda_order_for_tensor_parallel_ranks(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0,1")  # TP 2 uses the first two: GPUs 2 and 0
    assert gpucheck.before_start(server(tmp_path), {"tensor-parallel-size": 2, "gpu-memory-utilization": 0.9},
                                 [], wait_s=0) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1,0")
    failure = gpucheck.before_start(server(tmp_path), {"tensor-parallel-size": 2}, [], wait_s=0)
    assert failure is not None and "GPU 1 (" in failure.evidence


def test_a_mig_instance_nvidia_smi_does_not_list_is_noted_not_failed(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert "not checked: MIG-1234" in s.notes[0]


def test_without_nvidia_smi_the_check_is_skipped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert s.notes == ["GPUs 1 from CUDA_VISIBLE_DEVICES; nvidia-smi not found: free-memory check skipped"]
    assert s.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_on_cpu_the_check_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert s.notes == [] and "CUDA_VISIBLE_DEVICES" not in s.env


def test_a_failing_nvidia_smi_skips_the_check_and_says_why(smi, tmp_path):
    smi.write(rows(FOUR))
    (smi.dir / "exit_code").write_text("9")
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert "free-memory check skipped: nvidia-smi exited 9: NVIDIA-SMI has failed" in s.notes[0]


def test_output_nvidia_smi_did_not_mean_is_not_read_as_memory(smi, tmp_path):
    smi.write("0, GPU-aaaa, [N/A], [N/A]\n")
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert "GPU 0: memory not reported, not checked" in s.notes[0]
    smi.write("Failed to initialize NVML: Driver/library version mismatch\n")
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert "skipped: nvidia-smi output not understood" in s.notes[0]


def test_memory_released_within_the_grace_period_passes(smi, tmp_path):
    smi.write(rows([(0, "GPU-aaaa", TOTAL, 3000)]), call=1)  # the last server is still exiting
    smi.write(rows([(0, "GPU-aaaa", TOTAL, IDLE)]))  # then it is gone
    assert gpucheck.before_start(server(tmp_path), {"gpu-memory-utilization": 0.9}, [], wait_s=0) is not None
    (smi.dir / "calls.txt").unlink()
    assert gpucheck.before_start(server(tmp_path), {"gpu-memory-utilization": 0.9}, [], wait_s=5) is None
    assert len([c for c in smi.calls() if "--query-gpu" in c]) == 2


def test_memory_still_held_after_the_grace_period_fails(smi, tmp_path):
    smi.write(rows([(0, "GPU-aaaa", TOTAL, 3000)]))
    failure = gpucheck.before_start(server(tmp_path), {"gpu-memory-utilization": 0.9}, [], wait_s=0.2)
    assert failure is not None and "still short after 0.2 s" in failure.evidence
    assert len([c for c in smi.calls() if "--query-gpu" in c]) >= 2


def test_the_gpus_ray_assigned_go_into_the_server_env(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setitem(sys.modules, "ray", fake_ray([2, 0]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # e.g. RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    s = server(tmp_path)
    assert gpucheck.before_start(s, {"tensor-parallel-size": 2, "gpu-memory-utilization": 0.9}, [], wait_s=0) is None
    assert s.env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert s.notes[0].startswith("GPUs 0,2 from Ray (replacing CUDA_VISIBLE_DEVICES=0,1,2,3)")


def test_a_ray_task_given_no_gpu_is_a_cpu_trial_and_checks_nothing(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))  # GPUs 1 and 3 are busy, but this trial asked Ray for none
    monkeypatch.setitem(sys.modules, "ray", fake_ray([]))
    s = server(tmp_path)
    assert gpucheck.before_start(s, {}, [], wait_s=0) is None
    assert s.notes == [] and "CUDA_VISIBLE_DEVICES" not in s.env and smi.calls() == []


def test_in_the_driver_ray_assigns_nothing_so_cuda_visible_devices_counts(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setitem(sys.modules, "ray", fake_ray([0, 1, 2, 3], mode=0))  # SCRIPT_MODE, not a worker
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    failure = gpucheck.before_start(server(tmp_path), {}, [], wait_s=0)
    assert failure is not None and "GPU 3 (" in failure.evidence


def fake_python(tmp_path: Path) -> Path:
    """Stands in for `python -m vllm...`: prints the CUDA_VISIBLE_DEVICES it inherited, then exits."""
    exe = tmp_path / "fake-python"
    exe.write_text('#!/bin/sh\necho "child sees CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"\nexit 3\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def spec(tmp_path, params: dict, args=()) -> TrialSpec:
    return TrialSpec(number=7, model="m", params=params, vllm_args=tuple(args),
                     workload=Workload(name="t", requests=(), warmup=(), concurrency=1),
                     log_path=str(tmp_path / "trial-7" / "server.log"), startup_timeout=20, shutdown_timeout=2)


def test_a_trial_on_a_gpu_short_of_memory_fails_before_booting_vllm(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setattr(gpucheck, "GRACE_S", 0)
    monkeypatch.setitem(sys.modules, "ray", fake_ray([1]))
    started = []
    monkeypatch.setattr(VllmServer, "start", lambda self: started.append(self) or True)
    result = execute_trial(spec(tmp_path, {"gpu-memory-utilization": 0.9}))
    assert started == [] and result.port is None  # vLLM never launched
    assert result.failure.kind == "infra" and "GPU 1 (GPU-bbbb-1111) 2000 MiB free" in result.failure.evidence
    assert result.stop is not None and result.stop.leftover_pids == ()


def test_a_trial_server_inherits_rays_gpus_and_its_log_records_them(smi, tmp_path, monkeypatch):
    smi.write(rows(FOUR))
    monkeypatch.setitem(sys.modules, "ray", fake_ray([2]))
    python = fake_python(tmp_path)

    class Server(VllmServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, python=str(python), **kwargs)

    monkeypatch.setattr(trial_mod, "VllmServer", Server)
    result = execute_trial(spec(tmp_path, {"gpu-memory-utilization": 0.9}, ["--gpu-memory-utilization", "0.9"]))
    text = (tmp_path / "trial-7" / "server.log").read_text()
    log = text.splitlines()
    assert log[1].startswith("# note: GPUs 2 from Ray; free memory before start")
    assert "GPU 2 (GPU-cccc-2222)" in log[1]
    assert log[2:] == ["child sees CUDA_VISIBLE_DEVICES=2"]  # it ended whole: its guard had nothing to add
    # the stand-in exits: a crash, whose evidence is the server's own line; the note (it names
    # memory) is never read as vLLM's output
    assert result.failure.kind == "crash" and result.failure.evidence == "child sees CUDA_VISIBLE_DEVICES=2"
    assert log_lines(text) == ["child sees CUDA_VISIBLE_DEVICES=2"]


def test_tensor_parallel_two_uses_the_mp_backend_and_asks_ray_for_two_gpus():
    assert engine_args_for({"tensor-parallel-size": 2}, "gpu") == ["--distributed-executor-backend", "mp"]
    assert engine_args_for({"tensor-parallel-size": 1}, "gpu") == []
    assert engine_args_for({"tensor-parallel-size": 2}, "cpu") == ["--distributed-executor-backend", "mp"]  # ranks inside a Ray task
    assert engine_args_for({"data-parallel-size": 2}, "gpu") == []  # engines, not split workers
    plan = SimpleNamespace(device=SimpleNamespace(kind="gpu"), cfg=SimpleNamespace(ray=RaySpec()))
    assert ray_resources(plan, {"tensor-parallel-size": 2})["num_gpus"] == 2
    assert ray_resources(plan, {"tensor-parallel-size": 1})["num_gpus"] == 1
    assert ray_resources(plan, {"tensor-parallel-size": 2, "data-parallel-size": 2})["num_gpus"] == 4
