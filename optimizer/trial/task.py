"""One trial: boot vLLM with the chosen flags, warm up, replay the workload, stop, report.

`execute_trial` is a plain function (tests call it directly); `run_trial` is the same
function as a Ray task. A trial gets a frozen `TrialSpec` and returns a frozen
`TrialResult`: never an Optuna trial, a study or a database session. Whatever happens,
the server's whole process group is stopped before the task returns.

Two modes: `replay` measures the workload once (in `stages`: after each, the partial
measurement goes to the driver, which may answer "stop, this trial cannot win");
`goodput` searches for the highest request rate at which the SLOs hold (trial/rate_search.py).
With early stop on, a replay (or a goodput probe below saturation) whose SLOs are already
lost beyond repair is cut short on the spot.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from optimizer.engine import server_metrics as servermetrics
from optimizer.engine.compile_cache import cache_entries, cache_state, node_scratch
from optimizer.engine.cpu_cores import bind_free_cores
from optimizer.engine.failures import Failure
from optimizer.engine.starvation import CpuWatch
from optimizer.engine.startup_log import startup_breakdown
from optimizer.engine.vllm import VllmServer
from optimizer.errors import first_line
from optimizer.measure import validity
from optimizer.measure.replay import run_replay
from optimizer.outputs import compare as regression
from optimizer.trial import gpu_check as gpucheck
from optimizer.trial.driver_link import Driver
from optimizer.trial.spec import TrialResult, TrialSpec
from optimizer.trial import step_probe
from optimizer.trial.stages import (
    measure_window,
    reset_prefix_cache,
    runtime_failure,
    search_rates,
    stopper,
)

LOG_TAIL_LINES = 120
LOG_LIMIT_BYTES = 4 * 1024 * 1024  # the most of a server log one result carries back through Ray
_KV_LINE = re.compile(r"KV cache size|non-kv usages|estimated maximum model length|requested memory for kv")


def execute_trial(spec: TrialSpec, report: Callable[[str], None] | None = None,
                  on_spawn: Callable[[int], None] | None = None, driver: Driver | None = None) -> TrialResult:
    """Run one trial end to end; failures come back in the result, never as exceptions.
    `on_spawn` gets the server's process group id as soon as it exists."""
    driver = driver or Driver()
    report = report or driver.phase
    phases: dict[str, float] = {}
    log_path = node_log_path(spec)
    env = spec.server_env()
    cache_before = cache_entries(env)
    server = VllmServer(spec.model, list(spec.vllm_args), log_path, env=env,
                        startup_timeout=spec.startup_timeout, shutdown_timeout=spec.shutdown_timeout,
                        on_spawn=on_spawn or driver.spawned)
    try:
        got = _boot_and_measure(server, spec, driver, report, phases)
    finally:
        driver.close()
        report("stopping")
        t = time.monotonic()
        stop = server.stop()
        phases["shutdown_s"] = time.monotonic() - t
    text = server.log_text()
    startup = startup_breakdown(text, phases.get("startup_s")).as_dict()
    startup["compile_cache"] = cache_state(startup["compile_cache"], "compile" in startup["steps"], cache_before,
                                           cache_entries(env))
    if server.cpu is not None:
        startup["cpu"] = server.cpu.as_dict()  # what the start-up got of the CPU (engine/starvation.py)
    if log_path != Path(spec.log_path):  # a node-local copy: its content travels back in the result
        shutil.rmtree(log_path.parent, ignore_errors=True)
    lines = text.splitlines()
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    kv_lines = "\n".join(line for line in lines if _KV_LINE.search(line))
    return TrialResult(spec.number, got.failure, got.metrics, phases, got.records, stop, tail,
                       socket.gethostname(), os.environ.get("OMP_NUM_THREADS", ""), server.port, got.server_view,
                       got.probes, got.early, kv_lines, driver.health(), capped_log(text), got.outputs,
                       got.outputs_error, startup, got.cpu, got.step_probe)


@dataclass
class _Measured:
    """What one trial measured on its server (all empty when the server never started)."""

    failure: Failure | None = None
    metrics: dict = field(default_factory=dict)
    records: tuple = ()
    server_view: dict = field(default_factory=dict)
    probes: tuple = ()
    early: dict = field(default_factory=dict)
    outputs: tuple = ()
    outputs_error: str = ""
    cpu: dict = field(default_factory=dict)  # what the server got of the CPU while measured (CpuShare.as_dict)
    step_probe: tuple = ()  # the step probe's timings (twin/probe.py)


def _boot_and_measure(server: VllmServer, spec: TrialSpec, driver: Driver, report, phases: dict) -> _Measured:
    """Start the server (after the GPU check), warm up, measure, check outputs; each phase timed."""
    report("starting")
    t = time.monotonic()
    failure = gpucheck.before_start(server, spec.params, spec.vllm_args)  # Ray's GPUs, their free memory
    if failure is None:
        bind_free_cores(server)  # on CPU: cores no other vLLM server (production?) is bound to
    started = failure is None and server.start()
    phases["startup_s"] = time.monotonic() - t
    if not started:
        return _Measured(failure or server.failure)
    report("warming up")
    t = time.monotonic()
    if spec.workload.warmup:
        run_replay(server.base_url, spec.model, spec.workload.warmup, len(spec.workload.warmup), spec.request_timeout)
    reset = reset_prefix_cache(server.base_url)
    phases["warmup_s"] = time.monotonic() - t
    t = time.monotonic()
    got = _measure(server, spec, driver, report)
    got.metrics["prefix_cache_reset"] = float(reset)
    phases["replay_s"] = time.monotonic() - t
    if spec.step_probe and got.failure is None and not got.early:
        report("probing step costs")
        t = time.monotonic()
        got.step_probe = tuple(step_probe.send(server.base_url, spec.model, spec.step_probe, spec.request_timeout))
        phases["probe_s"] = time.monotonic() - t
    if spec.regression and got.failure is None and not got.early:
        report("checking outputs")
        t = time.monotonic()
        got.outputs, got.outputs_error = _outputs(server.base_url, spec)
        phases["outputs_s"] = time.monotonic() - t
    return got


def _measure(server: VllmServer, spec: TrialSpec, driver: Driver, report) -> _Measured:
    """Replay the workload once, or search the goodput rate; and what the server got of the CPU
    meanwhile (engine/starvation.py: recorded, not judged here)."""
    watch = CpuWatch(server.proc.pid)
    watch.sample()
    got = _Measured()
    if spec.mode == "goodput":
        report("searching rate")
        got.records, got.metrics, got.server_view, got.probes, got.early, got.failure = search_rates(server, spec, driver)
    else:
        report("replaying")
        got.records, got.metrics, got.server_view, got.early = measure_window(
            server.base_url, spec, spec.workload.requests, stopper(spec, driver))
        got.failure = runtime_failure(server, got.records) or (None if got.early else validity.check(
            spec.workload, got.records, got.metrics, got.server_view, spec.max_lag_p50_ms, spec.min_rate_ratio))
    got.cpu = watch.judge().as_dict()
    return got


def _outputs(base_url: str, spec: TrialSpec) -> tuple[tuple[dict, ...], str]:
    """The regression prompts' greedy outputs, or why not (an error never fails the measurement)."""
    prompts, max_tokens, top_k, batch = spec.regression
    servermetrics.wait_idle(base_url)  # alone on the server: batching can change the numerics
    try:
        got = regression.collect_both(base_url, spec.model, prompts, max_tokens, top_k, batch)
    except (RuntimeError, OSError, ValueError) as exc:
        return (), first_line(exc, 500)
    return tuple(o.to_dict() for o in got), ""


def node_log_path(spec: TrialSpec, host: str | None = None) -> Path:
    """Where the server logs on the node running the trial: the driver's artifacts path when the
    trial runs on the driver's machine (a full disk then fails the trial before vLLM starts), else
    a node-local scratch file (the artifacts path may not exist there: no shared filesystem); the
    driver stores the text that comes back in the result either way."""
    host = host or socket.gethostname()
    if not spec.driver_host or spec.driver_host == host:
        return Path(spec.log_path)
    digest = hashlib.sha256(spec.log_path.encode()).hexdigest()[:16]
    return node_scratch() / "logs" / digest / "server.log"


def capped_log(text: str, limit: int = LOG_LIMIT_BYTES) -> str:
    """The log as it travels back through Ray: whole unless huge, then its start (the launch line
    and vLLM's config) and its end (where it failed), with what was left out said in between."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit // 8], text[-(limit - limit // 8):]
    return f"{head}\n# ... {len(text) - len(head) - len(tail)} characters left out ...\n{tail}"


def remote_trial(spec: TrialSpec, board=None) -> TrialResult:
    """The body of the Ray task: phases, the server's host and process group (so the driver can
    reap it if this worker dies first) and stage checkpoints go to the driver through `board`."""
    if board is None:
        return execute_trial(spec)
    from optimizer.trial.channel import BoardDriver

    return execute_trial(spec, driver=BoardDriver(board, spec.number, listen=spec.hears_driver))


