"""The quickstart as a Ray job: `ray job submit` -> SUCCEEDED, on a real `ray start --head` here.

Starts a head on free ports with its own temp dir (token auth on, as Ray 2.60 does), submits
`python -m optimizer run --config CONFIG --ray-address auto` with this repository as
`--working-dir` (Ray uploads it minus what .gitignore lists) and an absolute storage and
artifacts dir, waits for the job (blocking `ray job submit`), prints the round trip, the job's
status and the study's outcome, then stops the head's own processes.

    .venv/bin/python bench/job_round_trip.py [--config examples/quickstart.yaml]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_processes(temp_dir: str, gcs_port: int) -> set:
    addr = re.compile(rf"^--(gcs[-_])?address=\S+:{gcs_port}$")
    roots = [p for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid()
             and any(temp_dir in a or addr.match(a) for a in (p.info["cmdline"] or []))]
    found = set(roots)
    for p in roots:
        try:
            found.update(p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/quickstart.yaml")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobrt-", dir="/tmp"))
    temp_dir = str(work / "ray")
    gcs, dashboard = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token"}
    start = [str(RAY), "start", "--head", "--port", str(gcs), "--dashboard-port", str(dashboard),
             "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--temp-dir", temp_dir,
             "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
             "--disable-usage-stats"]
    subprocess.run(start, check=True, capture_output=True, text=True, env=env, timeout=120)
    storage = f"sqlite:///{work / 'trials.db'}"
    study_name = yaml.safe_load((ROOT / args.config).read_text()).get("study_name", "vllm-tuning")
    try:
        entry = [sys.executable, "-m", "optimizer", "run", "--config", args.config, "--ray-address", "auto",
                 "--storage", storage, "--artifacts-dir", str(work / "artifacts")]
        t0 = time.monotonic()
        job = subprocess.run([str(RAY), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}",
                              "--working-dir", str(ROOT), "--", *entry], capture_output=True, text=True, env=env)
        round_trip = time.monotonic() - t0
        ended = re.search(r"Job '(\S+)' (succeeded|failed|stopped)", job.stdout + job.stderr)
        print(f"ray job submit -> {ended.group(2).upper() if ended else 'unknown: ' + job.stderr[-500:]}: "
              f"{round_trip:.0f} s round trip ({round_trip / 60:.1f} min)")
        tail = [line for line in job.stdout.splitlines() if line.startswith(("Best:", "Gain", "  re-measured", "Saved"))]
        print("\n".join(tail))
        study = optuna.load_study(study_name=study_name, storage=storage)
        counts = {}
        for t in study.trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        print(f"study '{study_name}': {counts}")
    finally:
        procs = head_processes(temp_dir, gcs)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(procs), timeout=20)


if __name__ == "__main__":
    main()
