"""ray_cluster.yaml and ray_cluster.local.yaml against Ray's own cluster-launcher schema (the
`ray-schema.json` shipped in the installed `ray` package) and the launcher's own config
preparation, which also applies the provider's defaults and its cross-field rules."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", ["ray_cluster.yaml", "ray_cluster.local.yaml"])
def test_the_launcher_accepts_it(name):
    cfg = _load(name)
    jsonschema.validate(cfg, SCHEMA)
    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_the_cloud_cluster_has_a_cpu_head_and_named_gpu_workers():
    cfg = _load("ray_cluster.yaml")
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]["resources"]
    assert head.get("GPU", 0) == 0 and head["CPU"] > 0
    gpu = [t["resources"] for name, t in types.items() if name != cfg["head_node_type"]]
    assert gpu and all(r["GPU"] > 0 and any(k.startswith("gpu_") and v == r["GPU"] for k, v in r.items()) for r in gpu)


@pytest.mark.parametrize("name", ["ray_cluster.yaml", "ray_cluster.local.yaml"])
def test_it_installs_this_project_at_a_pinned_ray_and_turns_on_child_cleanup(name):
    cfg = _load(name)
    setup = " ".join(cfg["setup_commands"])
    assert f"ray[default]=={ray.__version__}" in setup and "[gpu]" in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in cfg[key] if "ray start" in c]
        assert start and all("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true" in c for c in start)


def test_the_on_prem_provider_rejects_node_types():
    cfg = _load("ray_cluster.local.yaml")
    assert "available_node_types" not in cfg and cfg["provider"]["head_ip"] and cfg["provider"]["worker_ips"]
    bad = {**copy.deepcopy(cfg), "available_node_types": {"x": {"resources": {}, "node_config": {}}}, "head_node_type": "x"}
    with pytest.raises(Exception, match="available_node_types is not supported"):
        prepare_config(bad)


def _dashboard_hosts(command: str) -> list[str]:
    """Every --dashboard-host value on a command line (`--dashboard-host=H` or `--dashboard-host H`)."""
    words = command.split()
    hosts = [w.split("=", 1)[1] for w in words if w.startswith("--dashboard-host=")]
    return hosts + [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--dashboard-host"]


@pytest.mark.parametrize("name", ["ray_cluster.yaml", "ray_cluster.local.yaml"])
def test_the_head_binds_the_dashboard_and_its_job_api_to_loopback(name):
    """Port 8265 also takes job submissions (arbitrary code): reached through `ray dashboard
    CLUSTER.yaml` or an SSH tunnel, never from the network."""
    cfg = _load(name)
    heads = [c for c in cfg["head_start_ray_commands"] if "ray start" in c]
    assert heads and all("--head" in c and _dashboard_hosts(c) == ["127.0.0.1"] for c in heads)
    everything = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"] + cfg["setup_commands"])
    assert "0.0.0.0" not in everything and "::" not in _dashboard_hosts(everything)


def test_the_loopback_check_reads_both_spellings():
    assert _dashboard_hosts("ray start --head --dashboard-host=0.0.0.0") == ["0.0.0.0"]
    assert _dashboard_hosts("ray start --head --dashboard-host 0.0.0.0 --port=6379") == ["0.0.0.0"]
    assert _dashboard_hosts("ray start --head --port=6379") == []


@pytest.mark.parametrize("name", ["ray_cluster.yaml", "ray_cluster.local.yaml"])
def test_every_node_starts_with_token_authentication_and_the_same_token(name):
    """The GCS and raylets listen on every interface: each `ray start` runs with RAY_AUTH_MODE=token,
    after the token copied from the operator's machine (file_mounts) is made private to its owner."""
    cfg = _load(name)
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        commands = cfg[key]
        start = [i for i, c in enumerate(commands) if "ray start" in c]
        assert start and all(commands[i].lstrip('"').startswith("RAY_AUTH_MODE=token ") for i in start)
        assert all("chmod 600 ~/.ray/auth_token" in commands[:i] for i in start)
    header = (ROOT / name).read_text().split("cluster_name:")[0]
    assert "ray get-auth-token --generate" in header and "RAY_AUTH_MODE=token ray job submit" in header
