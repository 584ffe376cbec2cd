"""Kubernetes manifests for the recommended configuration: a Deployment and a Service.

- Deployment (apps/v1): `replicas` pods, each one `vllm serve MODEL --host 0.0.0.0 --port 8000`
  with the recommended flags (a pod's port is reached through the Service, so it binds every
  interface of the pod, not 127.0.0.1), less `--load-format dummy` (random weights measure speed
  in a study; a deployment loads the real ones). On GPU each pod asks `nvidia.com/gpu` = tensor x
  pipeline x data parallel sizes; with more than one GPU a pod gets a memory-backed /dev/shm
  (vLLM's workers share tensors through it; a container's default is 64 MB). On CPU a pod asks
  for the cores its trial ran on and gets a 4 GiB /dev/shm, as vLLM's CPU image is run. A startup
  probe gives the model time to load (up to 30 min), then readiness and liveness probes read
  `/health` (5 s to answer, a minute of failures before a restart). `HF_TOKEN` comes from the
  Secret `hf-token` when there is one (optional). Service links are off: Kubernetes would
  otherwise put `<SERVICE>_PORT=tcp://...` variables in the pod, and a `VLLM_`-named one is read
  by vLLM as its own setting.
- Service (v1): ClusterIP, port 8000 to the pods' 8000, selecting the Deployment's pods.
- A model given as a local directory is not in the image: the pod mounts the PersistentVolumeClaim
  `MODEL_PVC` (read-only) at `/models/<directory name>` and serves that path; the file's first
  lines say to create and fill that claim (or rename it). A Hugging Face id stays an id.
- On CPU a pod also asks for the memory its trial claimed (the KV budget and the rest of the
  server, per rank, from the trial's KV estimate) plus its /dev/shm, as request and limit.
- No YAML anchors: the Deployment's selector and labels are written out, each editable alone.

Images: vLLM's own, `vllm/vllm-openai:v<version>` on GPU and
`public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v<version>` on CPU, at the release part of the
vLLM version the study measured with (0.32.0 of 0.32.0+cpu: a tag cannot hold '+'); `image`
overrides. Names are made DNS-1123 labels (lowercase letters, digits and '-',
at most 63). Validated in the tests against Kubernetes' own schemas (kubernetes-validate).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

PORT = 8000
GPU_IMAGE = "vllm/vllm-openai:v{version}"
CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}"
SHM = {"gpu": "16Gi", "cpu": "4Gi"}  # a memory-backed /dev/shm; counted against the pod's memory
SHM_BYTES = {"gpu": 16 << 30, "cpu": 4 << 30}
MODEL_PVC = "vllm-model"  # the placeholder claim a local model directory is mounted from
MI = 1 << 20


class _NoAliases(yaml.SafeDumper):
    """Every mapping written out in full: an anchor would tie the selector to the labels."""

    def ignore_aliases(self, data):
        return True


def is_local(model: str) -> bool:
    """A directory path (absolute, relative, or one that exists here), not a Hugging Face id (`org/name`)."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir()


def dns_label(text: str) -> str:
    """`text` as a DNS-1123 label: what Kubernetes accepts as a name."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return label or "vllm"


def manifests(study_name: str, model: str, args: list[str], replicas: int, device: str = "gpu",
              gpus_per_pod: int = 1, cpus_per_pod: int = 1, vllm_version: str = "0.32.0",
              image: str | None = None, memory_bytes: int | None = None) -> list[dict]:
    """The Deployment and the Service, as dicts in the order to apply them. `memory_bytes`: what a
    CPU pod's server claims (its shared memory is added)."""
    name = dns_label(f"vllm-{study_name}")
    release = re.match(r"\d+(\.\d+)*", vllm_version)
    version = release.group(0) if release else vllm_version
    args = _deployed(args)
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    gpu = device == "gpu"
    container = {
        "name": "vllm",
        "image": image or (GPU_IMAGE if gpu else CPU_IMAGE).format(version=version),
        "command": ["vllm", "serve"],
        "args": [served_path(model), "--host", "0.0.0.0", "--port", str(PORT), *[str(a) for a in args]],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                    "optional": True}}}],
        "resources": _resources(gpu, gpus_per_pod, cpus_per_pod, memory_bytes),
        "startupProbe": _probe(period=10, failures=180),  # 30 min to load the weights and compile
        "readinessProbe": _probe(period=5, failures=3),
        "livenessProbe": _probe(period=10, failures=6),
    }
    pod: dict = {"containers": [container], "enableServiceLinks": False}
    if not gpu or gpus_per_pod > 1:
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM["gpu" if gpu else "cpu"]}}]
    if is_local(model):
        container.setdefault("volumeMounts", []).append({"name": "model", "mountPath": served_path(model),
                                                         "readOnly": True})
        pod.setdefault("volumes", []).append({"name": "model", "persistentVolumeClaim": {"claimName": MODEL_PVC,
                                                                                          "readOnly": True}})
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": int(replicas), "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": labels,
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]


def served_path(model: str) -> str:
    """Where the pod finds the model: a local directory at /models/<its name>, an id as it is."""
    return f"/models/{model.rstrip('/').rsplit('/', 1)[-1]}" if is_local(model) else model


def _resources(gpu: bool, gpus: int, cpus: int, memory_bytes: int | None) -> dict:
    if gpu:
        return {"limits": {"nvidia.com/gpu": int(gpus)}}
    amount = {"cpu": str(int(cpus))}
    if memory_bytes:
        amount["memory"] = f"{-(-(memory_bytes + SHM_BYTES['cpu']) // MI)}Mi"
    return {"requests": dict(amount), "limits": dict(amount)}


def _probe(period: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _deployed(args: list[str]) -> list[str]:
    """The flags a deployment runs: a study's `--load-format dummy` (random weights) left out."""
    out, i = [], 0
    while i < len(args):
        a = str(args[i])
        if a == "--load-format" and i + 1 < len(args) and str(args[i + 1]) == "dummy":
            i += 2
            continue
        if a == "--load-format=dummy":
            i += 1
            continue
        out.append(a)
        i += 1
    return out


def to_yaml(docs: list[dict]) -> str:
    """The documents, with a header saying how to fill a local model's claim when one is mounted."""
    header = ""
    for doc in docs:
        for v in doc.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "persistentVolumeClaim" in v:
                header = (f"# The model is a local directory: create the PersistentVolumeClaim '{MODEL_PVC}' (or rename\n"
                          "# it below) and copy the model directory into it before applying.\n")
    return header + yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False)
