"""A configuration as vLLM serves it: the `vllm serve` command for its flags and the long-form YAML
that `vllm serve --config` takes."""

from __future__ import annotations

import shlex

from optimizer.config.flags import from_cli_args, split_flags
from optimizer.config.space import KNOBS


def serve_command(model: str, args: list[str]) -> str:
    """The `vllm serve` command for a trial's flags."""
    return shlex.join(["vllm", "serve", model, *args])  # pasted into a shell: a --speculative-config's JSON quoted


def serve_yaml(args: list[str]) -> dict:
    """`vllm serve --config` takes long-form flag names as keys."""
    out = {}
    for key, value in split_flags(args):
        out[key] = from_cli_args([f"--{key}", value])[key] if key in KNOBS and value is not True else value
    return out
