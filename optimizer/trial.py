"""One trial: boot vLLM with the chosen flags, warm up, replay the workload, stop, report.

`execute_trial` is a plain function (tests call it directly); `run_trial` is the same
function as a Ray task. A trial gets a frozen `TrialSpec` and returns a frozen
`TrialResult`: never an Optuna trial, a study or a database session. Whatever happens,
the server's whole process group is stopped before the task returns.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import servermetrics, validity
from .engine.failures import Failure, classify_runtime
from .errors import first_line
from .engine.vllm import StopReport, VllmServer
from .metrics import summarize
from .replay import RequestRecord, run_replay
from .workload import Workload

LOG_TAIL_LINES = 120


@dataclass(frozen=True)
class TrialSpec:
    number: int
    model: str
    params: dict  # the knobs Optuna chose, by vLLM flag name
    vllm_args: tuple[str, ...]  # every flag after --model (knobs + fixed flags)
    workload: Workload
    log_path: str
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout: float = 300.0
    shutdown_timeout: float = 30.0
    request_timeout: float = 600.0
    max_lag_p50_ms: float = 10.0  # replay validity thresholds (ReplaySpec)
    min_rate_ratio: float = 0.95
    metrics_poll_s: float = 1.0


@dataclass(frozen=True)
class TrialResult:
    number: int
    failure: Failure | None  # None: the trial ran and was measured
    metrics: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)  # seconds: startup, warmup, replay, shutdown
    records: tuple[RequestRecord, ...] = ()
    stop: StopReport | None = None
    log_tail: str = ""
    host: str = ""
    omp_threads: str = ""
    port: int | None = None
    server: dict = field(default_factory=dict)  # /metrics deltas over the measured window (servermetrics)

    @property
    def ok(self) -> bool:
        return self.failure is None


def execute_trial(spec: TrialSpec, report: Callable[[str], None] = lambda phase: None,
                  on_spawn: Callable[[int], None] | None = None) -> TrialResult:
    """Run one trial end to end; failures come back in the result, never as exceptions.
    `on_spawn` gets the server's process group id as soon as it exists."""
    phases: dict[str, float] = {}
    server = VllmServer(spec.model, list(spec.vllm_args), Path(spec.log_path), env=dict(spec.env),
                        startup_timeout=spec.startup_timeout, shutdown_timeout=spec.shutdown_timeout,
                        on_spawn=on_spawn)
    failure, metrics, records, server_view = None, {}, (), {}
    try:
        report("starting")
        t = time.monotonic()
        started = server.start()
        phases["startup_s"] = time.monotonic() - t
        if not started:
            failure = server.failure
        else:
            report("warming up")
            t = time.monotonic()
            if spec.workload.warmup:
                run_replay(server.base_url, spec.model, spec.workload.warmup, len(spec.workload.warmup),
                           spec.request_timeout)
            reset = reset_prefix_cache(server.base_url)
            phases["warmup_s"] = time.monotonic() - t
            report("replaying")
            t = time.monotonic()
            records, metrics, server_view = _measure(server.base_url, spec)
            metrics["prefix_cache_reset"] = float(reset)
            phases["replay_s"] = time.monotonic() - t
            failure = _runtime_failure(server, records) or validity.check(
                spec.workload, records, metrics, server_view, spec.max_lag_p50_ms, spec.min_rate_ratio)
    finally:
        report("stopping")
        t = time.monotonic()
        stop = server.stop()
        phases["shutdown_s"] = time.monotonic() - t
    tail = "\n".join(server.log_text().splitlines()[-LOG_TAIL_LINES:])
    return TrialResult(spec.number, failure, metrics, phases, records, stop, tail,
                       socket.gethostname(), os.environ.get("OMP_NUM_THREADS", ""), server.port, server_view)


def _measure(base_url: str, spec: TrialSpec) -> tuple[tuple[RequestRecord, ...], dict, dict]:
    """Replay the measured set between two /metrics snapshots, sampling gauges during it."""
    before, peaks = servermetrics.scrape(base_url), servermetrics.Peaks()
    result = run_replay(base_url, spec.model, spec.workload.requests, spec.workload.concurrency,
                        spec.request_timeout, servermetrics.sampler(base_url, spec.metrics_poll_s, peaks))
    output = sum(r.output_tokens for r in result.records)
    after = servermetrics.settled_after(base_url, output, before)
    metrics = summarize(result)
    ratio = validity.send_rate_ratio(spec.workload, result.records)
    if ratio is not None:
        metrics["send_rate_ratio"] = ratio
    view = servermetrics.deltas(before, after, peaks)
    metrics["server_metrics_read"] = float(bool(view))  # 0: the token cross-check could not run
    return result.records, metrics, view


def reset_prefix_cache(base_url: str) -> bool:
    """Empty the prefix cache after warm-up (FACTS.md: a warm cache inflates results). Needs the
    server's dev endpoints (VLLM_SERVER_DEV_MODE=1, set for trial servers); False when refused."""
    req = urllib.request.Request(base_url.rstrip("/") + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def _runtime_failure(server: VllmServer, records) -> Failure | None:
    if not server.alive():
        return classify_runtime(server.log_text(), server.proc.poll())
    if records and not any(r.ok for r in records):
        first = next(r for r in records if not r.ok)
        return Failure("crash", f"every request failed; first: HTTP {first.status} {first.error}",
                       "the server answers but serves nothing: read the server log")
    return None


def remote_trial(spec: TrialSpec, board=None) -> TrialResult:
    """The body of the Ray task: phases, and the server's host and process group (so the
    driver can reap it if this worker dies first), go to the driver through `board`."""
    if board is None:
        return execute_trial(spec)
    host = socket.gethostname()
    return execute_trial(spec, lambda phase: board.set.remote(spec.number, phase),
                         lambda pgid: board.server.remote(spec.number, host, pgid))


def lost_trial_result(number: int, exc: BaseException, phase: str) -> TrialResult:
    """The result of a trial whose Ray worker died. Ray's memory monitor killing it means the
    configuration took the machine's memory (a property of the configuration: pruned); any
    other loss is an infrastructure fault."""
    text = f"{type(exc).__name__}: {first_line(exc, 300)}"
    if type(exc).__name__ == "OutOfMemoryError":
        kind = "oom_startup" if phase == "starting" else "oom_runtime"
        remedy = ("lower gpu-memory-utilization: the machine ran out of memory and Ray's memory monitor killed the trial"
                  if kind == "oom_startup" else "lower max-num-seqs or gpu-memory-utilization: the machine ran out of memory")
        return TrialResult(number, Failure(kind, text, remedy))
    return TrialResult(number, Failure("infra", text, "Ray lost the trial: check the worker node, then re-run"))
