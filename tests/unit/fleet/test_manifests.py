"""fleet/manifests.py: the Deployment and Service are valid against Kubernetes' own schemas
(kubernetes-validate, strict: unknown fields refused), carry the recommended flags, ask for the GPUs a
replica's parallel sizes need, and are written beside best.yaml and by `plan --manifests`."""

from __future__ import annotations

import io

import kubernetes_validate
import optuna
import pytest
import yaml
from rich.console import Console

from optimizer.cli import plan as plan_command
from optimizer.cli.entry import parser
from optimizer.record.version import RECORD_KEY, RECORD_VERSION
from optimizer.fleet.manifests import dns_label, manifests, to_yaml

K8S = "1.32"


@pytest.mark.parametrize("device, gpus", [("gpu", 1), ("gpu", 4), ("cpu", 0)])
def test_the_manifests_are_valid_kubernetes(device, gpus):
    for doc in manifests("tune", "Qwen/Qwen2.5-7B-Instruct", ["--max-num-seqs", "64"], 3, device, gpus, cpus_per_pod=2):
        kubernetes_validate.validate(doc, K8S, strict=True)


def test_a_wrong_field_is_caught_by_the_same_check():
    deployment = manifests("tune", "m", [], 1)[0]
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S, strict=True)


def test_the_deployment_serves_the_recommended_flags_on_the_gpus_a_replica_needs():
    deployment, service = manifests("My Study_1", "Qwen/Qwen2.5-7B-Instruct",
                                    ["--max-num-seqs", "64", "--tensor-parallel-size", "2"], 5, "gpu", 2)
    pod = deployment["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert deployment["metadata"]["name"] == "vllm-my-study-1" and deployment["spec"]["replicas"] == 5
    assert c["image"] == "vllm/vllm-openai:v0.32.0" and c["command"] == ["vllm", "serve"]
    assert c["args"] == ["Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "64",
                         "--tensor-parallel-size", "2"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory" and c["volumeMounts"][0]["mountPath"] == "/dev/shm"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    one = manifests("s", "m", [], 1, "gpu", 1)[0]["spec"]["template"]["spec"]
    assert "volumes" not in one  # one GPU a pod: no shared-memory volume


def test_a_cpu_replica_asks_for_cores_on_vllms_cpu_image():
    c = manifests("s", "m", [], 1, "cpu", cpus_per_pod=4)[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].startswith("public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v")
    assert c["resources"] == {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}


def test_names_become_dns_labels():
    assert dns_label("Quick Start!") == "quick-start" and dns_label("---") == "vllm" and len(dns_label("a" * 99)) == 63


def test_plan_writes_the_planned_replicas(tmp_path):
    from tests.unit.report.test_capacity import GOODPUT, add, metrics

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.set_user_attr(RECORD_KEY, RECORD_VERSION)  # as the tool stamps its studies
    study.set_user_attr("objective", GOODPUT)
    study.set_user_attr("device", "gpu")
    add(study, 5.0, metrics(10000.0, 5.0, goodput_rate=5.0), args=("--max-num-seqs", "32", "--tensor-parallel-size", "2"))
    out = io.StringIO()
    code = plan_command.main(parser().parse_args(
        ["plan", "--storage", url, "--study-name", "s", "--model", "Qwen/Qwen2.5-7B-Instruct", "--peak-qps", "50",
         "--tokens-per-request", "2000", "--manifests", str(tmp_path / "k8s.yaml")]), Console(file=out, width=300))
    assert code == 0 and f"Manifests: {tmp_path / 'k8s.yaml'} (Deployment of 15 replica(s)" in out.getvalue()
    deployment, service = yaml.safe_load_all((tmp_path / "k8s.yaml").read_text())
    assert deployment["spec"]["replicas"] == 15 and service["kind"] == "Service"
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2 and "--tensor-parallel-size" in c["args"]
    for doc in (deployment, service):
        kubernetes_validate.validate(doc, K8S, strict=True)
    assert to_yaml([deployment, service]) == (tmp_path / "k8s.yaml").read_text()


def test_random_weights_are_left_out_and_the_tag_is_the_release():
    deployment = manifests("s", "m", ["--load-format", "dummy", "--max-num-seqs", "8", "--load-format=dummy"], 1,
                           "cpu", vllm_version="0.32.0+cpu")[0]
    pod = deployment["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"] == ["m", "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "8"]
    assert c["image"].endswith(":v0.32.0") and pod["enableServiceLinks"] is False
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "4Gi"  # vLLM's CPU image wants a /dev/shm too
    assert manifests("s", "m", ["--load-format", "safetensors"], 1)[0]["spec"]["template"]["spec"]["containers"][0][
        "args"][-2:] == ["--load-format", "safetensors"]


@pytest.mark.parametrize("bind, n", [("0-3", 4), ("0|1", 2), ("0,2,4", 3), ("", 1), ("auto", 1)])
def test_a_trials_core_binding_counts_its_cores(bind, n):
    from optimizer.deploy.k8s import cores

    assert cores(bind) == n


def test_a_tp_the_minimal_change_put_back_is_not_deployed_as_gpus():
    from optimizer.fleet.capacity import parallel_sizes

    # the winner ran TP 2; the recommendation put it back, so its flags say nothing of TP
    assert parallel_sizes(["--max-num-seqs", "64"], {"tensor-parallel-size": 2}) == (1, 1)
    assert parallel_sizes([], {"tensor-parallel-size": 2}) == (2, 2)  # no flags recorded: the parameters


def test_a_local_model_is_served_from_a_claim_the_header_names_and_an_id_stays_an_id(tmp_path):
    local = tmp_path / "tiny-llama"
    local.mkdir()
    docs = manifests("s", str(local), ["--max-num-seqs", "8"], 2, "gpu", 1)
    pod = docs[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][0] == "/models/tiny-llama"
    assert {"name": "model", "mountPath": "/models/tiny-llama", "readOnly": True} in c["volumeMounts"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "vllm-model", "readOnly": True}} in pod["volumes"]
    text = to_yaml(docs)
    assert text.startswith("# The model is a local directory: create the PersistentVolumeClaim 'vllm-model'")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    hub = manifests("s", "Qwen/Qwen2.5-7B-Instruct", [], 1, "gpu", 1)
    assert hub[0]["spec"]["template"]["spec"]["containers"][0]["args"][0] == "Qwen/Qwen2.5-7B-Instruct"
    assert "volumes" not in hub[0]["spec"]["template"]["spec"] and not to_yaml(hub).startswith("#")


def test_no_anchor_ties_the_selector_to_the_labels():
    text = to_yaml(manifests("s", "Qwen/Qwen2.5-7B-Instruct", [], 1))
    assert "&id" not in text and "*id" not in text
    deployment = yaml.safe_load(text.split("\n---\n")[0])
    deployment["metadata"]["labels"]["team"] = "ml"
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]


def test_a_cpu_pod_asks_for_the_memory_its_trial_claimed_and_its_shared_memory():
    c = manifests("s", "Qwen/Qwen2.5-7B-Instruct", [], 1, "cpu", cpus_per_pod=2,
                  memory_bytes=6 << 30)[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "10240Mi"}, "limits": {"cpu": "2", "memory": "10240Mi"}}
    kubernetes_validate.validate(manifests("s", "m", [], 1, "cpu", memory_bytes=6 << 30)[0], K8S, strict=True)
