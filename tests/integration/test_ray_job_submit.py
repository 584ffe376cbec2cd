"""A study sent to a real Ray head with a real `ray job submit`, its trials stored in PostgreSQL.

The head is started with `ray start --head` on free ports and its own `--temp-dir`. Ray 2.60's
`ray start` turns token auth on, so every `ray` client here runs with RAY_AUTH_MODE=token (the
token is ~/.ray/auth_token, generated if missing). The job's entrypoint is this venv's python by
absolute path: a bare `python` in an entrypoint is whatever the raylet's PATH finds first
(measured: the system python, without this project). Its trials run as Ray tasks on the head,
joined with `--ray-address auto` (RAY_ADDRESS is set in a job's environment).

The study is two trials: trial 0, the baseline, boots vLLM for real (the tiny model, dummy
weights); trial 1 asks for max-model-len 65536 with a memory fraction that leaves ~0.3 GiB of KV
cache, which the KV precheck prunes without a boot. The study is then read back with
`optuna.load_study` on the PostgreSQL URL. A second job with a relative SQLite path must fail at
once with its one line (docs/troubleshooting.md).

The head is stopped by killing its own processes (those naming its temp dir or its GCS port,
and their children), not by `ray stop --force`: that kills every Ray process on the machine,
including another study's embedded Ray running next to this test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from sqlalchemy.engine import make_url

from optimizer.engine.device import read_node_memory
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.testing import ray_head as rayhead
from optimizer.testing.memory import memory_fraction
from optimizer.testing.one_process import ONE_PROCESS_ENV

pytestmark = pytest.mark.integration

RAY = rayhead.RAY
JOB_TIMEOUT_S = 600

# Polls the job SDK in its own process (the auth mode is read once per process, so it stays out of
# pytest's) and prints each status change as a JSON line, the last with Ray's own timestamps.
WAITER = r"""
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient
address, job, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
client, deadline, last = JobSubmissionClient(address), time.monotonic() + timeout, None
while True:
    info = client.get_job_info(job)
    if info.status != last:
        last = info.status
        print(json.dumps({"status": str(info.status.value), "at": time.time(), "start_ms": info.start_time,
                          "end_ms": info.end_time, "message": (info.message or "")[-2000:]}), flush=True)
    if info.status.is_terminal() or time.monotonic() > deadline:
        break
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def ray_head():
    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")  # short: Ray's socket paths live under it
    head = None
    try:
        head = rayhead.start(temp_dir)
        yield {"address": head.address, "env": head.env, "temp_dir": temp_dir, "head": head}
    finally:
        left = rayhead.stop(head) if head is not None else set()
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray head processes survived: {sorted(p.pid for p in left)}"


def _submit(head: dict, workdir: Path, job_id: str) -> float:
    """`ray job submit --no-wait` the study in `workdir`; returns the time just before submitting."""
    entry = [sys.executable, "-m", "optimizer", "run", "--config", "study.yaml", "--ray-address", "auto"]
    t0 = time.monotonic()
    run = rayhead.submit(head["head"], ["--working-dir", str(workdir), "--submission-id", job_id, "--no-wait", "--",
                                        *entry], timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return t0


def _wait(head: dict, job_id: str) -> tuple[dict, float]:
    """Poll the job until it ends; its last status record and when it was seen (monotonic)."""
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, head["address"], job_id, str(JOB_TIMEOUT_S)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=head["env"])
    last, seen = None, None
    for line in waiter.stdout:
        last, seen = json.loads(line), time.monotonic()
    err = waiter.stderr.read()
    waiter.wait(timeout=30)
    assert last is not None, f"no job status from Ray: {err[-2000:]}"
    if last["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
        subprocess.run([str(RAY), "job", "stop", "--address", head["address"], job_id], capture_output=True,
                       timeout=60, env=head["env"])
        pytest.fail(f"job {job_id} still {last['status']} after {JOB_TIMEOUT_S} s")
    return last, seen


def _ray_job(head: dict, *args: str) -> str:
    run = subprocess.run([str(RAY), "job", *args, "--address", head["address"]], capture_output=True, text=True,
                         timeout=60, env=head["env"])
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout + run.stderr


def _model_processes(model: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(str(model) in a for a in (p.info["cmdline"] or []))]


@pytest.fixture(scope="module")
def job_study(ray_head, postgres_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("job")
    model = write_tiny_model(root / "tiny")
    workdir = root / "submit"  # what `--working-dir` uploads: the study config only
    workdir.mkdir()
    total = read_node_memory().total
    fits, starved = memory_fraction(0.8, total), memory_fraction(0.3, total)
    name = f"job-{uuid.uuid4().hex[:12]}"
    cfg = {
        "study_name": name, "storage": postgres_url, "n_trials": 2, "artifacts_dir": str(root / "artifacts"),
        "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 16, "gpu-memory-utilization": fits, "max-model-len": 2048,
                     "kv-cache-dtype": "auto"},
        "enqueue": [{"max-num-seqs": 16, "gpu-memory-utilization": starved, "max-model-len": 65536,
                     "kv-cache-dtype": "auto"}],
        "space": {"max-num-seqs": {"low": 1, "high": 32}, "gpu-memory-utilization": {"low": 0.01, "high": 0.9},
                  "max-model-len": {"low": 1024, "high": 65536}, "kv-cache-dtype": {"choices": ["auto", "fp8"]}},
        "workload": {"requests": 16, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 64],
                     "output": [16, 32], "arrival": {"process": "closed", "concurrency": 8}},
        "objective": {"name": "latency", "metric": "ttft_p95"},
        "confirm": {"top": 0},
        "engine": {"extra_args": ["--enforce-eager"], "env": ONE_PROCESS_ENV},  # no torch.compile: ~20 s less for its one boot
    }
    (workdir / "study.yaml").write_text(yaml.safe_dump(cfg))
    job_id = f"study-{name}"
    try:
        t0 = _submit(ray_head, workdir, job_id)
        last, seen = _wait(ray_head, job_id)
        round_trip = seen - t0
        logs = _ray_job(ray_head, "logs", job_id)
        print(f"\nray job submit -> {last['status']}: {round_trip:.1f} s round trip "
              f"(Ray's own start -> end: {(last['end_ms'] - last['start_ms']) / 1000:.1f} s)")
        yield {"job": job_id, "status": last, "logs": logs, "name": name, "model": model, "url": postgres_url,
               "head": ray_head, "round_trip": round_trip, "artifacts": root / "artifacts" / name}
    finally:
        if name in optuna.get_all_study_names(postgres_url):
            optuna.delete_study(study_name=name, storage=postgres_url)


def test_the_job_succeeds(job_study):
    assert job_study["status"]["status"] == "SUCCEEDED", job_study["status"]["message"] + job_study["logs"][-4000:]
    assert 0 < job_study["round_trip"] < JOB_TIMEOUT_S
    # The CLI a user polls with says so too.
    assert f"Job '{job_study['job']}' succeeded" in _ray_job(job_study["head"], "status", job_study["job"])
    # The entrypoint ran the study to its end and printed the report.
    assert "Running entrypoint for job" in job_study["logs"] and "): trial 0, " in job_study["logs"]  # "Recommended (<source>): trial 0, ..."


def test_the_trials_are_in_postgresql(job_study):
    study = optuna.load_study(study_name=job_study["name"], storage=job_study["url"])
    assert [t.number for t in study.trials] == [0, 1]
    base, starved = study.trials
    assert base.state == optuna.trial.TrialState.COMPLETE and base.user_attrs["baseline"] is True
    assert base.value is not None and base.value > 0
    assert base.value == pytest.approx(base.user_attrs["metrics"]["ttft_ms_p95"], rel=1e-3)
    assert base.user_attrs["metrics"]["completed"] == 16 and base.user_attrs["metrics"]["error_rate"] == 0
    phases = base.user_attrs["phases_s"]
    assert phases["startup_s"] > 0 and base.user_attrs["stop"]["leftover_pids"] == []  # a real boot, stopped clean
    assert (job_study["artifacts"] / "trial-0" / "server.log").stat().st_size > 0
    print("\n  baseline in the job: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    assert starved.state == optuna.trial.TrialState.PRUNED
    assert starved.user_attrs["failure_kind"] == "kv_too_small" and starved.user_attrs["precheck"] == "pruned"
    assert starved.user_attrs["evidence"].startswith("predicted, not booted")
    assert starved.params["max-model-len"] == 65536
    assert not (job_study["artifacts"] / "trial-1").exists()  # no server was started for it
    assert "1 boot(s) avoided" in job_study["logs"]


def test_the_password_is_not_in_the_job_logs(job_study):
    logs, url = job_study["logs"], make_url(job_study["url"])
    assert f"in {url.render_as_string(hide_password=True)}:" in logs  # the study's first line, URL masked
    assert f":{url.password}@" not in logs


def test_no_vllm_process_of_the_model_remains(job_study):
    deadline = time.monotonic() + 30
    while (left := _model_processes(job_study["model"])) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == []


def test_a_relative_sqlite_path_in_a_job_fails_at_once_with_its_line(ray_head, tmp_path):
    """A relative SQLite path in a Ray job (docs/troubleshooting.md), through a real `ray job submit --working-dir`."""
    model = write_tiny_model(tmp_path / "tiny")
    workdir = tmp_path / "submit"
    workdir.mkdir()
    (workdir / "study.yaml").write_text(yaml.safe_dump({
        "study_name": f"rel-{uuid.uuid4().hex[:12]}", "storage": "sqlite:///trials.db",
        "model": {"path": str(model), "load_format": "dummy"}, "space": {"max-num-seqs": {"low": 4, "high": 8}}}))
    job_id = f"relative-sqlite-{uuid.uuid4().hex[:12]}"
    t0 = _submit(ray_head, workdir, job_id)
    last, seen = _wait(ray_head, job_id)
    assert last["status"] == "FAILED", last
    assert "exit code 2" in last["message"]
    assert seen - t0 < 60  # refused before any Ray or vLLM work (measured: the entrypoint ran ~3 s)
    logs = _ray_job(ray_head, "logs", job_id)
    expected = ("error: storage 'sqlite:///trials.db' is a relative SQLite path, and this runs as a Ray job whose "
                "working directory is a temporary copy deleted with the job; pass an absolute path "
                "(--storage sqlite:////data/trials.db) or a database URL (postgresql://...)")
    assert [line for line in logs.splitlines() if line.startswith("error:")] == [expected]
    assert not list(Path(ray_head["temp_dir"]).rglob("trials.db*"))  # not even in the job's working-dir copy
