"""A trial's parameters <-> vLLM's command-line flags: {'max-num-seqs': 8} <-> ['--max-num-seqs', '8'],
in knob order, booleans as --flag / --no-flag; only knobs by their exact names become flags.
"""

from __future__ import annotations

from optimizer.config import topology
from optimizer.config.space import KNOBS, Knob
from optimizer.engine import speculative_config as speculation


def engine_args_for(params: dict, device_kind: str) -> list[str]:
    """Flags a trial needs beside its knobs' own: tensor or pipeline parallelism runs vLLM's workers
    as processes, since the default Ray backend breaks inside a Ray task (config/topology.py).
    `device_kind` is kept for the callers: the rule is the same on CPU and GPU."""
    return ["--distributed-executor-backend", "mp"] if topology.needs_processes(params) else []


def to_cli_args(params: dict) -> list[str]:
    """vLLM flags for `params`, in knob order: {'max-num-seqs': 8} -> ['--max-num-seqs', '8']. Knobs
    by their exact names only (ConfigError otherwise): vLLM would read `--max-num-seq` as --max-num-seqs."""
    for name in params:
        KNOBS.named(name, "trial parameters")
    args = []
    for name in (n for n in KNOBS if n in params):
        value = params[name]
        if name == speculation.KNOB and value == speculation.OFF:
            continue  # speculation off: vLLM's default, no flag
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, float):
            args += [f"--{name}", f"{value:.4g}"]  # 0.36, not 0.36000000000000004
        else:
            args += [f"--{name}", str(value)]
    return args


def from_cli_args(args: list[str]) -> dict:
    """The inverse of to_cli_args for the knobs this module knows (`--no-flag` is False)."""
    params = {}
    for flag, raw in split_flags(args):
        name = flag.removeprefix("no-")
        knob = KNOBS.get(name)
        if knob is not None and knob.kind == "bool" and raw is True:
            params[name] = flag == name
        elif knob is not None and flag == name and isinstance(raw, str):
            params[name] = parse_value(knob, raw)
    return params


def parse_value(knob: Knob, raw: str):
    if knob.kind == "int" or (knob.kind == "categorical" and raw.isdigit()):  # block-size, tensor-parallel-size
        return int(raw)
    return float(raw) if knob.kind == "float" else raw


PARALLEL_SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size"}


def named_flags(args: list[str]) -> dict[str, str | bool]:
    """Flags by their long dashed names: `--tensor_parallel_size 2` and `-tp 2` are both
    "tensor-parallel-size"."""
    out = {}
    for key, raw in split_flags(args):
        key = key.lstrip("-").replace("_", "-")
        out[PARALLEL_SHORT.get(key, key)] = raw
    return out


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


def pinned_model_len(args: list[str]) -> int | None:
    """The --max-model-len extra flags pin for every trial (the last one given), as a whole number of
    tokens; None when none is given or it is not one (vLLM's -1, "auto": fitted to the memory)."""
    value = named_flags([str(a) for a in args]).get("max-model-len")
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else None


def random_weights(args: list[str]) -> bool:
    """The flags load vLLM's dummy (random) weights: measured for speed only, never to deploy."""
    return named_flags([str(a) for a in args]).get("load-format") == "dummy"
