"""One prediction: which estimate answers for a device, and the checks before any of them runs.

aiconfigurator-core answers for the devices it has vLLM timings for (whatif/library.py); the
roofline (whatif/roofline.py, efficiencies fitted on published measurements) for the others, and
wherever the library cannot build the model. Each prediction says which one answered.

Refused in one line before anything is estimated: a TP that does not divide the attention heads
and the KV heads (vLLM refuses it too), and a model that fits the device at none of the TP sizes asked (the line
names the smallest that fits).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ConfigError
from optimizer.whatif import library, roofline
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec

TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_TPS = (1, 2, 4, 8)  # predicted when no TP sizes are asked, those vLLM accepts for the model


@dataclass(frozen=True)
class Prediction:
    estimate: roofline.Estimate
    by: str  # which estimate answered, in words
    note: str = ""  # why the library did not, when it did not


def tp_allowed(arch: Architecture, tp: int) -> bool:
    """vLLM's rule: TP divides the attention heads, and the KV heads split evenly over the ranks or
    are replicated whole on each."""
    return tp >= 1 and arch.heads % tp == 0 and (arch.kv_heads % tp == 0 or tp % arch.kv_heads == 0)


def kind_of(by: str) -> str:
    """"library" or "roofline": which estimator a Prediction's `by` names."""
    return "library" if by.startswith(library.NAME) else "roofline"


def check_tp(arch: Architecture, tp: int) -> None:
    if not tp_allowed(arch, tp):
        fits = [t for t in TP_SIZES if tp_allowed(arch, t)]
        raise ConfigError(f"what-if: TP {tp} does not divide {arch.name}'s {arch.heads} attention heads and "
                          f"{arch.kv_heads} KV heads (vLLM refuses it); use one of {', '.join(map(str, fits))}")


def check_fits_somewhere(arch: Architecture, device: DeviceSpec, tps, s: roofline.Serving, load: roofline.Load) -> None:
    """ConfigError when the model fits `device` at none of `tps`, naming the smallest TP that fits."""
    def fits(tp: int) -> bool:
        return roofline.estimate(arch, device, _at(s, tp), load).fits
    if any(fits(tp) for tp in tps):
        return
    smallest = next((t for t in TP_SIZES if tp_allowed(arch, t) and fits(t)), None)
    asked = ", ".join(map(str, tps))
    fix = f"the smallest TP that fits is {smallest}: add it to --tp" if smallest else "no TP up to 64 fits it"
    raise ConfigError(f"what-if: {arch.name} ({arch.weight_bytes / 1e9:.0f} GB of weights) does not fit "
                      f"{device.name} ({device.memory_gb:g} GB) at TP {asked} with a {load.isl + load.osl}-token "
                      f"request; {fix}")


def _at(s: roofline.Serving, tp: int) -> roofline.Serving:
    return roofline.Serving(tp, s.max_num_seqs, s.utilization, s.kv_dtype)


def predict(source: str, arch: Architecture, device: DeviceSpec, s: roofline.Serving, load: roofline.Load,
            use_library: bool = True) -> Prediction:
    """The estimate for this replica and load, from the library where it answers, else the roofline."""
    check_tp(arch, s.tp)
    note = ""
    if use_library:
        got = library.estimate(source, arch, device, s, load)
        if isinstance(got, roofline.Estimate):
            return Prediction(got, f"{library.NAME} {library.version()} (vLLM {library.data_version(device)} "
                                   "timings)")
        note = got
    return Prediction(roofline.estimate(arch, device, s, load), "roofline", note)
