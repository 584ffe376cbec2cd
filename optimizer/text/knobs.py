"""A configuration in words: a knob's value as tables show it, and a trial's knobs on one line."""

from __future__ import annotations


def shown(value) -> str:
    """A knob's value as a table shows it (None: vLLM's default)."""
    return "(vLLM default)" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "(vLLM defaults)"
