"""A trial's measured window in stages: the replay (or the goodput rate search) with each stage's
checkpoint posted to the driver channel and early stop judged on it.
"""

from __future__ import annotations

import math
import time
import urllib.request
from dataclasses import replace

from optimizer.http_open import urlopen
from optimizer.engine import server_metrics as servermetrics
from optimizer.engine.cpu_cores import rank_count
from optimizer.engine.failures import Failure, classify_runtime
from optimizer.engine.vllm import VllmServer
from optimizer.measure import slo as slo_mod
from optimizer.measure import validity
from optimizer.measure.metrics import summarize
from optimizer.measure.replay import RequestRecord, run_replay
from optimizer.trial import early_stop as earlystop
from optimizer.trial import rate_search as ratesearch
from optimizer.trial.driver_link import Driver
from optimizer.trial.spec import TrialSpec
from optimizer.workload import Workload


def measure_window(base_url: str, spec: TrialSpec, requests, stop_when=None,
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


def stopper(spec: TrialSpec, driver: Driver, stages: int | None = None):
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
            payload = partial_metrics(finished, spec.workload.requests)
            driver.checkpoint(state["step"], payload)
            if spec.judge is not None:
                local = earlystop.verdict(spec.judge, payload, spec.best, spec.margin)
                if local:
                    return f"trial: {local}"
        reason = driver.stop_reason()
        return f"driver: {reason}" if reason else ""

    return stop_when


def partial_metrics(finished, planned) -> dict:
    """A stage's partial measurement of the `planned` requests, as the driver's early-stop rules
    need it (trial/early_stop.py): counts, tokens, elapsed time and per-request latencies so far."""
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


def search_rates(server: VllmServer, spec: TrialSpec, driver: Driver):
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
        stop = None if saturating else stopper(replace(spec, workload=sized), Driver(), stages=0)
        t = time.monotonic()
        records, metrics, view, early = measure_window(base_url, spec, sized.requests, stop, sized)
        metrics["goodput_rps"] = slo_mod.good_requests(spec.slos, records) / metrics["duration_s"]
        failure = runtime_failure(server, records)
        if failure is None and not early and not saturating:  # everything-at-once has no schedule to keep
            failure = validity.check(sized, records, metrics, view, spec.max_lag_p50_ms, spec.min_rate_ratio)
        errors_ok = any(x.metric == "error" for x in spec.slos) or all(r.ok for r in records)
        passed = failure is None and not early and errors_ok and slo_mod.holds(spec.slos, metrics)
        p = ratesearch.Probe(rate, passed, slo_mod.worst_log_ratio(spec.slos, metrics), metrics,
                             time.monotonic() - t, early.get("reason", ""), early.get("saved_s", 0.0))
        runs.append({"records": records, "metrics": metrics, "view": view, "probe": p})
        if failure is not None:
            raise SearchAborted(failure)
        if saturating and spec.stop_on_slo:  # early stop on: this capacity may already lose
            payload = {"capacity_rps": metrics["request_throughput"]}
            driver.checkpoint(0, payload)
            local = earlystop.verdict(spec.judge, payload, spec.best, spec.margin) if spec.judge is not None else ""
            if local:
                stopped_by.update(by="trial", reason=local)
                raise SearchAborted(None)
            if driver.verdict(0, wait_s=5.0):
                stopped_by.update(by="driver", reason=driver.stop_reason())
                raise SearchAborted(None)
        return p

    try:
        result = ratesearch.search(probe, spec.max_probes, spec.rel_tol, spec.low_share)
    except SearchAborted as stopped:
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
        "devices": float(rank_count(spec.vllm_args)),  # one replica's ranks: GPUs, or core groups on CPU
        "search_s": sum(r["probe"].seconds for r in runs), "probe_saved_s": sum(r["probe"].saved_s for r in runs),
        # tokens/s at the goodput rate: what the SLO-bounded server delivers
        "goodput_output_throughput": chosen["metrics"]["output_throughput"] if result.best is not None else 0.0,
    })
    return (chosen["records"], metrics, chosen["view"], tuple(r["probe"].summary() for r in runs), {}, None)


class SearchAborted(Exception):
    def __init__(self, failure: Failure | None):
        super().__init__(failure.kind if failure else "stopped by the driver")
        self.failure = failure


def reset_prefix_cache(base_url: str) -> bool:
    """Empty the prefix cache after warm-up (a warm cache inflates results: docs/vllm-facts.md#prefix-cache-reset). Needs the
    server's dev endpoints (VLLM_SERVER_DEV_MODE=1, set for trial servers); False when refused."""
    req = urllib.request.Request(base_url.rstrip("/") + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urlopen(req, timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False


def runtime_failure(server: VllmServer, records) -> Failure | None:
    if not server.alive():
        found = classify_runtime(server.log_text(), server.proc.poll())
        if found.kind in ("crash", "oom_runtime") and (kill := server.oom_kill()) is not None:
            return Failure("oom_runtime", kill.describe(server.started_wall), "lower max-num-seqs or max-model-len, "
                           "or gpu-memory-utilization: the kernel killed it for memory")
        return found
    if records and not any(r.ok for r in records):
        first = next(r for r in records if not r.ok)
        return Failure("crash", f"every request failed; first: HTTP {first.status} {first.error}",
                       "the server answers but serves nothing: read the server log")
    return None
