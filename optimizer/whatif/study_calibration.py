"""The calibration a stored study supports: the estimate run for each configuration it measured on
its own GPU, against what was measured (whatif/calibration.py does the arithmetic).

Each completed trial is a point: its flags (TP, max-num-seqs, memory fraction, KV dtype), the
load it measured (prompt and output tokens a request from its token rates; requests in flight by
Little's law, request rate x mean end-to-end latency), and its mean TTFT, mean TPOT and output
throughput. There is nothing to calibrate on when the study ran on CPU, when it does not say which
GPU it ran on (and `--measured-on` does not either), or when that GPU is not in the device table:
the prediction then goes out uncorrected, with the prior band, and the line says why.

`study` is a stored Optuna study, read through its methods (this package does not import Optuna).
"""

from __future__ import annotations

from optimizer.config.flags import named_flags
from optimizer.errors import ConfigError
from optimizer.record import of_study, of_trial
from optimizer.whatif import calibration, devices
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.calibration import Calibration
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.predict import kind_of, predict
from optimizer.whatif.roofline import Load, Serving

def measured_device(study, named: str | None) -> DeviceSpec | str:
    """The table's device the study ran on, or why there is none (one line)."""
    kind = of_study.device(study)
    if kind == "cpu":
        if named:
            raise ConfigError(f"--measured-on {named}: study '{study.study_name}' ran on CPU, and a CPU's timings "
                              "cannot calibrate a GPU's; drop --measured-on")
        return "the study ran on CPU: no GPU measurement to calibrate on"
    if named:
        return devices.known(named)
    reported = of_study.device_name(study)
    if not reported:
        return "the study does not say which GPU it ran on: name it with --measured-on (e.g. h100)"
    found = devices.match(reported)
    return found if found else f"the study ran on {reported}, which the device table lacks: name the nearest with " \
                               "--measured-on, or describe it in config whatif.devices"


def knobs_of(trial) -> dict:
    """A stored trial's flags (long names, short ones such as -tp spelled out), its params over them."""
    return {**named_flags(of_trial.vllm_args(trial)), **dict(trial.params)}


def serving_of(trial, default: Serving) -> Serving:
    """The replica a stored trial ran (an Optuna FrozenTrial: its params, then its vLLM flags)."""
    knobs = knobs_of(trial)

    def num(key, cast, fallback):
        try:
            return cast(knobs.get(key, fallback))
        except (TypeError, ValueError):
            return fallback
    return Serving(tp=num("tensor-parallel-size", int, 1), max_num_seqs=num("max-num-seqs", int, default.max_num_seqs),
                   utilization=num("gpu-memory-utilization", float, default.utilization),
                   kv_dtype=str(knobs.get("kv-cache-dtype", "auto")))


def load_of(metrics: dict) -> Load | None:
    rps, out, total = (metrics.get(k) for k in ("request_throughput", "output_throughput", "total_token_throughput"))
    e2el = metrics.get("e2el_ms_mean")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (rps, out, total, e2el)):
        return None
    osl = out / rps
    return Load(max(1, round((total - out) / rps)), max(1, round(osl)), max(1, round(rps * e2el / 1e3)))


def from_study(study, source: str, arch: Architecture, named: str | None = None) -> Calibration:
    device = measured_device(study, named)
    if isinstance(device, str):
        return calibration.none(device)
    pairs = {"library": [], "roofline": []}
    for t in study.get_trials(deepcopy=False):
        if t.state.name != "COMPLETE":
            continue
        metrics = of_trial.metrics(t)
        load = load_of(metrics)
        knobs = knobs_of(t)
        if load is None or str(knobs.get("pipeline-parallel-size", 1)) != "1" or \
                str(knobs.get("data-parallel-size", 1)) != "1":  # pipeline and data parallel: not modelled
            continue
        try:
            p = predict(source, arch, device, serving_of(t, Serving()), load)
        except ConfigError:
            continue
        if not p.estimate.fits:
            continue
        measured = {"ttft_s": (metrics.get("ttft_ms_mean") or 0) / 1e3, "tpot_s": (metrics.get("tpot_ms_mean") or 0) / 1e3,
                    "throughput": metrics.get("output_throughput")}
        pairs[kind_of(p.by)].append((measured, {"ttft_s": p.estimate.ttft_s, "tpot_s": p.estimate.tpot_s,
                                                "throughput": p.estimate.throughput}))
    by = max(pairs, key=lambda k: len(pairs[k]))  # one estimator answers a device; should both, the one that did more
    if not pairs[by]:
        return calibration.none(f"no completed trial of study '{study.study_name}' measured a load to compare with")
    return calibration.fit(pairs[by], f"{len(pairs[by])} trial(s) of study '{study.study_name}' on {device.name}",
                           device.name, by)
