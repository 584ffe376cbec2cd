"""`plan --what-if`'s flags, checked before anything is read or estimated: the devices (the table's,
or the config's `whatif.devices`), TP sizes, prices, the model's shape, and how a request's tokens
split into prompt and output.

The replica predicted runs the recommended configuration's max-num-seqs, memory fraction and KV
dtype when the study ran on a GPU; vLLM's GPU defaults (256, 0.9, auto) otherwise: a CPU study's
values say nothing of a GPU's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.errors import ConfigError
from optimizer.record import of_study, of_trial
from optimizer.whatif import architecture, devices
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.predict import DEFAULT_TPS, check_fits_somewhere, check_tp, tp_allowed
from optimizer.whatif.roofline import Load, Serving



@dataclass(frozen=True)
class WhatIfArgs:
    source: str
    arch: Architecture
    devices: list[DeviceSpec]
    tps: list[int]
    prices: dict[str, float]

    def lengths(self, tokens_per_request: float, output_tokens: int | None, study, measured) -> tuple[int, int]:
        """(prompt, output) tokens a request at peak."""
        total = round(tokens_per_request)
        if output_tokens is not None:
            if not 1 <= output_tokens < total:
                raise ConfigError(f"--output-tokens {output_tokens}: give a number from 1 to {total - 1} (below "
                                  "--tokens-per-request, which counts prompt and output)")
            return total - output_tokens, output_tokens
        share = _output_share(study, measured)
        if share is None:
            raise ConfigError("--what-if: no measured run says how --tokens-per-request splits into prompt and "
                              "output; give --output-tokens (the mean output tokens a request)")
        osl = min(total - 1, max(1, round(total * share)))
        return total - osl, osl

    def serving(self, study, measured) -> Serving:
        if study is None or measured is None or of_study.device(study) != "gpu":
            return Serving()
        t = study.trials[measured.measurement.trial]
        from optimizer.whatif.study_calibration import serving_of  # noqa: PLC0415
        s = serving_of(t, Serving())
        return Serving(1, s.max_num_seqs, s.utilization, s.kv_dtype)


def _output_share(study, measured) -> float | None:
    if study is None or measured is None:
        return None
    metrics = of_trial.metrics(study.trials[measured.measurement.trial])
    out, total = metrics.get("output_throughput"), metrics.get("total_token_throughput")
    return out / total if out and total else None


def _devices(text: str, custom: dict) -> list[DeviceSpec]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--what-if: name at least one device, e.g. h100,l4")
    out = []
    for name in names:
        key = name.lower()
        out.append(devices.custom(key, custom[key]) if key in custom else devices.known(name))
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give whole numbers, comma-separated, e.g. 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{flag} {text!r}: give sizes of at least 1, comma-separated, e.g. 1,2,4")
    return sorted(set(values))


def _prices(text: str | None, names: set[str]) -> dict[str, float]:
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, eq, value = part.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not eq or not math.isfinite(price) or price <= 0:
            raise ConfigError(f"--price {part.strip()!r}: give device=cost per hour above 0, e.g. h100=2.5")
        if name.strip().lower() not in names:
            raise ConfigError(f"--price {name.strip()}: not among the --what-if devices ({', '.join(sorted(names))})")
        out[name.strip().lower()] = price
    return out


def _model(ns, cfg) -> tuple[str, Architecture]:
    source = ns.model or cfg.model.path
    if not source:
        raise ConfigError("--what-if: no model to predict; give --model (a directory or Hugging Face id)")
    return source, architecture.load(source)


def parse_whatif(ns, cfg) -> WhatIfArgs:
    """Every --what-if flag checked, or ConfigError naming the first bad one and its fix."""
    chosen = _devices(ns.what_if, {k.lower(): v for k, v in cfg.whatif.devices.items()})
    source, arch = _model(ns, cfg)
    tps = _ints(ns.tp, "--tp") if ns.tp else [t for t in DEFAULT_TPS if tp_allowed(arch, t)]
    for tp in tps:
        check_tp(arch, tp)
    probe = Load(max(1, round(ns.tokens_per_request) - 1), 1, 1)  # fits at all: the smallest request of this size
    for device in chosen:
        check_fits_somewhere(arch, device, tps, Serving(), probe)
    return WhatIfArgs(source, arch, chosen, tps, _prices(ns.price, {d.name for d in chosen}))
