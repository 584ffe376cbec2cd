"""A configuration as Kubernetes manifests written to a file (`k8s.yaml`, `plan --manifests`): the
Deployment and Service of fleet/manifests.py, sized from the trial that measured it."""

from __future__ import annotations

from pathlib import Path

from optimizer.atomic_file import write_atomic
from optimizer.fleet.capacity import parallel_sizes
from optimizer.fleet.manifests import manifests, to_yaml
from optimizer.record import of_study, of_trial


def write_manifests(path: Path, study, model: str, args: list[str], trial, replicas: int) -> Path | None:
    """The Deployment and Service of `replicas` pods of this configuration (`args`, from `trial`), on
    the study's device, at the vLLM version the study recorded (else the one installed here)."""
    from optimizer.engine.vllm_version import installed_vllm  # noqa: PLC0415

    gpus = parallel_sizes(args, trial.params)[1]
    version = of_study.vllm_version(study) or installed_vllm() or "0.32.0"
    docs = manifests(study.study_name, model, args, replicas, of_study.device(study) or "gpu", gpus,
                     cores(of_trial.cpu_bind(trial)), vllm_version=version,
                     memory_bytes=claimed_bytes(trial, parallel_sizes(args, trial.params)[1]))
    try:
        write_atomic(path, to_yaml(docs))
    except OSError:
        return None
    return path


def claimed_bytes(trial, ranks: int) -> int | None:
    """What a trial's server claimed, from its KV estimate: the KV budget and the rest, per rank."""
    est = of_trial.kv_estimate(trial)
    per_rank = int(est.get("budget_bytes") or 0) + int(est.get("non_kv_bytes") or 0)
    return per_rank * max(1, ranks) if per_rank > 0 else None


def cores(bind: str) -> int:
    """How many cores a VLLM_CPU_OMP_THREADS_BIND value names ("0-3", "0,2", "0|1"); 1 when none."""
    from optimizer.engine.cpu_cores import parse_cpu_list  # noqa: PLC0415

    return max(1, len(parse_cpu_list(bind)))
