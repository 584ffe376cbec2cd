"""The Ray head as `ray_cluster.local.yaml` starts it refuses whoever lacks the cluster's token.

The head's own command, read from the file (`head_start_ray_commands`: its `RAY_AUTH_MODE=token`
and Ray's settings, its flags), run on this machine with free ports and a temp dir of its own, and
the token the file's header says to make once (`ray get-auth-token --generate`, in the
operator's ~/.ray/auth_token; here a HOME of the test's own). Then, real Ray 2.60 clients:

- a driver with no token: the GCS answers `Unauthenticated` (InvalidAuthToken);
- a driver with the token file but without RAY_AUTH_MODE=token: refused the same way (the docs
  say every client needs both);
- the job API without the bearer token: HTTP 401; with another token: 403;
- with the token and RAY_AUTH_MODE=token: the driver joins and sees the head's CPUs, and the
  job API answers.

No vLLM. The refused drivers are stopped at the GCS's first refusal (Ray itself retries for 20 s
before it gives up).
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from optimizer.testing import ray_head

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[2] / "ray_cluster.local.yaml"
JOIN = ("import ray, sys\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "print('joined, CPUs:', ray.cluster_resources().get('CPU'))\n")
REFUSED = "Unauthenticated"


def _head_command() -> tuple[dict[str, str], list[str]]:
    """The file's `ray start --head` line: its leading VAR=value settings, and its argv."""
    commands = yaml.safe_load(CLUSTER_FILE.read_text())["head_start_ray_commands"]
    line = next((c for c in commands if "ray start --head" in c), None)
    assert line, f"{CLUSTER_FILE.name} has no `ray start --head` in head_start_ray_commands"
    words = shlex.split(line)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def _without(argv: list[str], flag: str) -> list[str]:
    """argv less `flag`, written `--flag=value` or `--flag value`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def _local(argv: list[str], temp_dir: str) -> tuple[list[str], int, int]:
    """The head's argv on this machine: free ports for GCS, dashboard and agents (never the file's
    6379, where a real cluster may listen), its own temp dir; the autoscaler's config (written by the
    cluster launcher) left out."""
    gcs, dashboard = ray_head.free_port(), ray_head.free_port()
    out = [str(ray_head.RAY) if a == "ray" else a for a in _without(_without(argv, "--port"), "--autoscaling-config")]
    return out + [f"--port={gcs}", "--temp-dir", temp_dir, "--dashboard-port", str(dashboard),
                  "--dashboard-agent-listen-port", str(ray_head.free_port()),
                  "--ray-client-server-port", str(ray_head.free_port()), "--disable-usage-stats"], gcs, dashboard


def _join(address: str, env: dict[str, str], timeout: float = 60.0) -> tuple[str, str]:
    """('joined' | 'refused' | 'failed', what it said): a driver joining at `address`, stopped at the
    GCS's first refusal, or at `timeout` whatever it is doing."""
    proc = subprocess.Popen([sys.executable, "-c", JOIN, address], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    said, deadline = [], time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            said.append(line)
            if REFUSED in line:
                return "refused", line.strip()
            if line.startswith("joined"):
                return "joined", line.strip()
        return "failed", "".join(said[-5:]) or "nothing said"
    finally:
        proc.kill()
        proc.wait()


def _jobs(port: int, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/api/jobs/", headers=headers),
                                    timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    root = tmp_path_factory.mktemp("token")
    operator, stranger = root / "operator", root / "stranger"
    operator.mkdir()
    stranger.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    made = subprocess.run([str(ray_head.RAY), "get-auth-token", "--generate"], env={**clean, "HOME": str(operator)},
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    settings, argv = _head_command()
    assert settings.get("RAY_AUTH_MODE") == "token", f"{CLUSTER_FILE.name} starts its head without token auth"
    temp_dir = tempfile.mkdtemp(prefix="rtok", dir="/tmp")  # Ray's socket paths must stay short
    argv, gcs, dashboard = _local(argv, temp_dir)
    env = {**clean, **settings, "HOME": str(operator)}
    running = ray_head.Head(temp_dir, gcs, dashboard, env)
    try:
        started = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        token = (operator / ".ray" / "auth_token").read_text().strip()
        yield {"gcs": f"127.0.0.1:{gcs}", "dashboard": dashboard, "token": token, "clean": clean,
               "operator": str(operator), "stranger": str(stranger)}
    finally:
        left = ray_head.stop(running)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, "the head's processes outlived it"


def test_a_driver_without_the_token_is_refused(head):
    outcome, said = _join(head["gcs"], {**head["clean"], "HOME": head["stranger"]})
    assert outcome == "refused", said
    assert "InvalidAuthToken" in said


def test_the_token_file_without_token_mode_is_refused_too(head):
    outcome, said = _join(head["gcs"], {**head["clean"], "HOME": head["operator"]})
    assert outcome == "refused", said


def test_the_job_api_refuses_a_request_without_the_bearer_token_or_with_another(head):
    assert _jobs(head["dashboard"], None) == 401
    assert _jobs(head["dashboard"], "0" * 64) == 403


def test_the_operator_with_the_token_joins_and_submits(head):
    outcome, said = _join(head["gcs"], {**head["clean"], "HOME": head["operator"], "RAY_AUTH_MODE": "token"})
    assert outcome == "joined", said
    assert _jobs(head["dashboard"], head["token"]) == 200
