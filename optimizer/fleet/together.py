"""Replicas measured together: N servers of one configuration behind nginx, against one alone.

What a fleet plan assumes (N replicas carry N times one) is measured here at a scale the machine
holds: the replicas boot side by side, each on devices of its own (on CPU, each rank bound to
cores of its own through VLLM_CPU_OMP_THREADS_BIND; on GPU, its own CUDA_VISIBLE_DEVICES), then,
in turns, the goodput rate search (trial/rate_search.py) runs on replica 0 alone, straight to
its port, and on the whole fleet through the proxy (fleet/proxy.py) with the workload scaled to
the replicas (N times the requests, drawn as the study draws them), after one untimed pass of
those requests all at once through the proxy. Before every probe each
replica's prefix cache is emptied and each is idle: no probe flatters the next. A probe passes
when every request succeeded, every SLO held, and the client kept the schedule (the study's
replay.min_rate_ratio): a fleet the client could not feed is not credited with the rate asked.

Everything started here (the replicas, nginx) runs under the lifeline guard and stops with this
process, SIGKILL included.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from optimizer import shutdown
from optimizer.engine import server_metrics as servermetrics
from optimizer.engine.cpu_cores import BIND_VAR, cpu_list, rank_count, rank_cores
from optimizer.config.flags import named_flags
from optimizer.config.kv_fit import DEFAULT_UTILIZATION
from optimizer.engine.device import GIB, NodeMemory, gpu_count
from optimizer.engine.vllm import VllmServer
from optimizer.errors import ConfigError
from optimizer.fleet.proxy import Proxy
from optimizer.measure import slo as slo_mod
from optimizer.measure import validity
from optimizer.measure.metrics import summarize
from optimizer.measure.replay import run_replay
from optimizer.trial import rate_search as ratesearch
from optimizer.trial.spec import TrialSpec
from optimizer.trial.stages import reset_prefix_cache
from optimizer.workload import Workload


@dataclass(frozen=True)
class Runs:
    one: tuple[float, ...]  # goodput req/s of replica 0 alone, per run
    fleet: tuple[float, ...]  # goodput req/s of the fleet through the proxy, per run


def placements(args, replicas: int, cores: list[int] | None = None, gpus: int | None = None) -> list[dict]:
    """The environment that puts each replica on devices of its own; ConfigError when the machine
    holds fewer than replicas x ranks devices."""
    ranks = rank_count(args)
    need = replicas * ranks
    gpus = gpu_count() if gpus is None else gpus
    if gpus:
        if need > gpus:
            raise ConfigError(f"{replicas} replicas of {ranks} GPU(s) each need {need} GPUs; this machine has {gpus}: "
                              "pass fewer --replicas")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # a child's list names the same GPUs as ours
        ids = [g.strip() for g in visible.split(",")] if visible else [str(g) for g in range(gpus)]
        return [{"CUDA_VISIBLE_DEVICES": ",".join(ids[i * ranks:(i + 1) * ranks])} for i in range(replicas)]
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if need > len(cores):
        raise ConfigError(f"{replicas} replicas of {ranks} rank(s) each need {need} CPU cores, one a rank; this "
                          f"machine gives {len(cores)} ({cpu_list(cores)}): pass fewer --replicas")
    share = len(cores) // replicas
    return [{BIND_VAR: rank_cores(cores[i * share:(i + 1) * share], ranks)} for i in range(replicas)]


def memory_claims(args, replicas: int, node: NodeMemory) -> None:
    """On CPU, where the replicas share one node: ConfigError when what they claim together (each
    rank `--gpu-memory-utilization` of the node, vLLM's CPU worker) is more than the node has
    available, naming the fraction a replica may take instead. The kernel would otherwise kill
    one of them, or another server on the node (production's), for memory."""
    util = float(named_flags([str(a) for a in args]).get("gpu-memory-utilization") or DEFAULT_UTILIZATION)
    ranks = rank_count(args)
    claimed = replicas * ranks * util * node.total
    if claimed <= node.available:
        return
    fits = math.floor(node.available / (replicas * ranks * node.total) * 100) / 100
    raise ConfigError(f"{replicas} replicas x {ranks} rank(s) at gpu-memory-utilization {util:g} claim "
                      f"{claimed / GIB:.1f} GiB of this node's memory together, and {node.available / GIB:.1f} GiB of "
                      f"{node.total / GIB:.1f} is available: pass --memory-fraction {fits:.2f} (each replica's share "
                      "that fits; its KV cache is then smaller than the trial's), or fewer --replicas")


def with_fraction(args, fraction: float) -> list[str]:
    """`args` with every replica's --gpu-memory-utilization set to `fraction`."""
    out, i = [], 0
    args = [str(a) for a in args]
    while i < len(args):
        if args[i] == "--gpu-memory-utilization":
            i += 2
            continue
        if args[i].startswith("--gpu-memory-utilization="):
            i += 1
            continue
        out.append(args[i])
        i += 1
    return out + ["--gpu-memory-utilization", f"{fraction:g}"]


def measure(spec: TrialSpec, fleet_workload: Workload, replicas: int, directory: Path, repeats: int = 2,
            proxy_port: int = 0, say: Callable[[str], None] = print) -> Runs:
    """Boot `replicas` servers of `spec`, put nginx in front, and measure one alone and all of
    them together `repeats` times each, in turns. Raises RuntimeError when a replica does not start."""
    envs = placements(spec.vllm_args, replicas)
    servers = [VllmServer(spec.model, list(spec.vllm_args), directory / f"replica-{i}.log",
                          env={**spec.server_env(), **env}, startup_timeout=spec.startup_timeout,
                          shutdown_timeout=spec.shutdown_timeout) for i, env in enumerate(envs)]
    try:
        _start_all(servers, say)
        for s in servers:
            if spec.workload.warmup:
                run_replay(s.base_url, spec.model, spec.workload.warmup, len(spec.workload.warmup), spec.request_timeout)
        with Proxy(directory / "nginx", [s.base_url.removeprefix("http://") for s in servers], proxy_port) as proxy:
            say(f"  nginx on {proxy.base_url}: least_conn over {', '.join(s.base_url for s in servers)}")
            # Untimed: the fleet's requests all at once through the proxy, so every replica has run
            # the batch sizes the search will ask of it (a first search after the warm-up alone
            # measured 0.7x the second on both sides).
            run_replay(proxy.base_url, spec.model, ratesearch.at_rate(fleet_workload.requests, math.inf), None,
                       spec.request_timeout)
            shutdown.check()  # a stop asked while a replay ran is acted on here, whatever the replay did with it
            one, fleet = [], []
            for run in range(repeats):
                one.append(_goodput(servers[0].base_url, servers[:1], spec, spec.workload))
                say(f"  run {run + 1}/{repeats}: one replica alone {one[-1]:.3g} req/s at the SLOs")
                fleet.append(_goodput(proxy.base_url, servers, spec, fleet_workload))
                say(f"  run {run + 1}/{repeats}: {replicas} replicas behind nginx {fleet[-1]:.3g} req/s at the SLOs")
        return Runs(tuple(one), tuple(fleet))
    finally:
        for s in servers:
            s.stop()


def _start_all(servers: list[VllmServer], say) -> None:
    """Start every replica at once (a boot is minutes on a GPU); RuntimeError naming the first that failed."""
    threads = [threading.Thread(target=s.start, daemon=True) for s in servers]
    for i, s in enumerate(servers):
        where = (f"{BIND_VAR}={s.env[BIND_VAR]}" if s.env.get(BIND_VAR) else
                 f"CUDA_VISIBLE_DEVICES={s.env.get('CUDA_VISIBLE_DEVICES')}")
        say(f"  replica {i} ({where}): starting, log {s.log_path}")
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, s in enumerate(servers):
        if s.state != "ready":
            f = s.failure
            raise RuntimeError(f"replica {i} did not start: {f.kind}: {f.evidence}" if f else f"replica {i} did not start")
    say(f"  {len(servers)} replicas ready in {time.monotonic() - t0:.0f} s, started side by side")


def _goodput(url: str, servers: list[VllmServer], spec: TrialSpec, workload: Workload) -> float:
    """The highest rate at which every SLO held, sent to `url` (rate_search.search)."""
    def probe(rate: float) -> ratesearch.Probe:
        shutdown.check()  # between probes: a stop asked meanwhile ends the measurement, nothing stored
        for s in servers:  # a fresh cache and idle replicas for every probe
            reset_prefix_cache(s.base_url)
            servermetrics.wait_idle(s.base_url)
        sized = Workload(workload.name, ratesearch.at_rate(workload.requests, rate), (), None)
        result = run_replay(url, spec.model, sized.requests, None, spec.request_timeout)
        metrics = summarize(result)
        kept = math.isinf(rate) or (validity.send_rate_ratio(sized, result.records) or 1.0) >= spec.min_rate_ratio
        passed = kept and all(r.ok for r in result.records) and slo_mod.holds(spec.slos, metrics)
        return ratesearch.Probe(rate, passed, slo_mod.worst_log_ratio(spec.slos, metrics), metrics)

    return ratesearch.search(probe, spec.max_probes, spec.rel_tol, spec.low_share).goodput_rate

