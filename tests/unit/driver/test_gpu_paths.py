"""GPU code paths, exercised with a stand-in `nvidia-smi` on PATH (no GPU here; these paths
have not yet run on a real GPU)."""

import stat
from types import SimpleNamespace

import pytest

from optimizer.config.schema import RaySpec
from optimizer.driver.resources import ray_resources
from optimizer.engine.device import GIB, detect, gpu_name
from optimizer.whatif.devices import match

FAKE_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)"
  echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)"
elif [ "$1" = "--query-gpu=name" ]; then
  echo "NVIDIA H100 80GB HBM3"
  echo "NVIDIA H100 80GB HBM3"
else
  echo "81559"
  echo "81559"
fi
"""


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_detect_sees_gpus_and_their_memory(fake_gpus):
    dev = detect("auto")
    assert dev.kind == "gpu" and dev.count == 2
    assert dev.memory.total == pytest.approx(81559 * 1024**2)
    assert dev.memory.total > 79 * GIB


def test_the_gpus_name_is_read_and_matched_to_the_what_if_table(fake_gpus):
    assert gpu_name() == "NVIDIA H100 80GB HBM3" and match(gpu_name()).name == "h100"


def test_without_nvidia_smi_the_gpu_has_no_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_name() == ""


def test_cpu_preference_ignores_gpus(fake_gpus):
    assert detect("cpu").kind == "cpu"


def test_without_nvidia_smi_the_device_is_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect("auto").kind == "cpu"


def test_a_gpu_trial_asks_ray_for_one_gpu_and_a_cpu_trial_for_none():
    gpu = SimpleNamespace(device=SimpleNamespace(kind="gpu"), cfg=SimpleNamespace(ray=RaySpec()))
    cpu = SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=SimpleNamespace(ray=RaySpec(trial_cpus=3)))
    assert ray_resources(gpu) == {"num_cpus": 1, "num_gpus": 1}
    assert ray_resources(cpu) == {"num_cpus": 3}
