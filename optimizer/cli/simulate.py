"""`simulate`: what a configuration would do on the study's own workload, predicted by the twin of
the server (optimizer/twin/) in seconds, with nothing booted.

The twin is calibrated on the study's stored runs (the baseline alone is enough); the
configuration is the baseline, a trial's (`--trial N`), or the baseline with knobs changed
(`--set max-num-seqs=64`); `--rate R` replays the study's open-loop schedule at R requests/s.
When the configuration is one a trial measured, its measured figures are printed beside. With
`--what-if DEVICE` the twin runs vLLM's scheduler with that GPU's defaults and the roofline's step
costs (optimizer/twin/gpu/server.py) instead, and needs no run of the study.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from optimizer.cli.common import STUDY_FLAGS, add_flags, load
from optimizer.errors import ConfigError

NAME = "simulate"


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("simulate", help="predict a configuration on the study's workload with the twin "
                              "(vLLM's own scheduler, step costs fitted on the study's runs); nothing booted")
    p.add_argument("--trial", type=int, help="simulate this trial's configuration (default: the baseline's)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="change a knob from the baseline's (or --trial's) value; repeat for several")
    p.add_argument("--rate", type=float, help="requests/s to replay the study's open-loop schedule at")
    p.add_argument("--what-if", help="predict on this GPU instead (a device of plan --what-if's table, or the config's "
                   "whatif.devices): vLLM's GPU defaults, the roofline's step costs; no study run needed")
    p.add_argument("--json", action="store_true", help="print the prediction as one JSON object")
    add_flags(p, *STUDY_FLAGS)
    return p


def parse_sets(items: list[str]) -> dict:
    """['max-num-seqs=64'] -> {'max-num-seqs': 64}: knobs by their exact names, values by their kind."""
    from optimizer.config import flags
    from optimizer.config.space import KNOBS

    out = {}
    for item in items:
        name, eq, raw = item.partition("=")
        if not eq or not raw:
            raise ConfigError(f"--set {item}: write KNOB=VALUE, e.g. --set max-num-seqs=64")
        knob = KNOBS.named(name.strip(), "--set")
        if knob.kind == "bool":
            if raw.lower() not in ("true", "false"):
                raise ConfigError(f"--set {item}: {name} takes true or false")
            out[knob.name] = raw.lower() == "true"
            continue
        try:
            out[knob.name] = flags.parse_value(knob, raw.strip())
        except ValueError as exc:
            raise ConfigError(f"--set {item}: {name} takes a {knob.kind}, not {raw!r}") from exc
    return out


def main(ns: argparse.Namespace, console) -> int:
    from optimizer.driver.plan import prepare

    if ns.rate is not None and not (ns.rate > 0 and math.isfinite(ns.rate)):
        raise ConfigError(f"--rate {ns.rate:g}: give a positive number of requests per second")
    changes = parse_sets(ns.set)  # refused before the study is read
    cfg = load(ns)
    device = _device(ns.what_if, cfg) if ns.what_if else None
    plan = prepare(cfg)
    requests = _requests(plan, ns.rate)
    if device is not None:
        params, pred, server, note = _on_gpu(plan, ns, changes, device, requests)
        cal, measured = None, None
    else:
        params, pred, server, cal, measured = _calibrated(plan, ns, changes, requests)
        note = ""
    if ns.json:
        console.print(json.dumps({"params": params, "scheduler": server.describe(), **pred.as_dict(),
                                  "calibrated_on": [r.number for r in cal.runs] if cal else [],
                                  "step_probe_of": [r.number for r in cal.runs if r.probe] if cal else [],
                                  "what_if": device.name if device else None, "note": note,
                                  "measured": measured},
                                 default=str), markup=False)
        return 0
    for line in _describe(plan, params, server, pred, cal, measured, ns.rate, note):
        console.print(line, markup=False)
    return 0


def _device(name: str, cfg):
    from optimizer.whatif import devices

    custom = {k.lower(): v for k, v in cfg.whatif.devices.items()}
    key = name.strip().lower()
    return devices.custom(key, custom[key]) if key in custom else devices.known(name)


def _requests(plan, rate: float | None):
    from optimizer.trial.rate_search import at_rate, nominal_rate

    requests = plan.workload.requests
    if rate is None:
        return requests
    if nominal_rate(requests) is None:
        raise ConfigError(f"--rate: the workload '{plan.workload.name}' is a closed loop "
                          f"({plan.workload.concurrency} in flight), with no schedule to replay at a rate; drop --rate")
    return at_rate(requests, rate)


def _calibrated(plan, ns, changes: dict, requests):
    """The twin calibrated on the study's runs, for the baseline or --trial with --set's changes."""
    from optimizer.driver.plan import baseline_params
    from optimizer.trial.rate_search import nominal_rate
    from optimizer.twin import envelope, vllm_scheduler
    from optimizer.twin.from_study import calibrate, stored_runs
    from optimizer.twin.prediction import BAND_ONE_RUN, predict
    from optimizer.twin.peak.data_parallel import engines
    from optimizer.twin.server import TwinServer

    runs = {r.number: r for r in stored_runs(plan.artifacts)}
    if ns.trial is not None and ns.trial not in runs:
        raise ConfigError(f"--trial {ns.trial}: no complete, fully replayed trial {ns.trial} under {plan.artifacts} "
                          f"(complete ones: {', '.join(map(str, sorted(runs))) or 'none'})")
    base = dict(runs[ns.trial].params) if ns.trial is not None else baseline_params(plan)
    vllm_scheduler.engine_config(plan.model.source, plan.server_args({**base, **changes}))  # vLLM's refusal first
    cal = calibrate(plan, list(runs.values()))
    params = {**(base if ns.trial is not None else {**cal.runs[0].params, **base}), **changes}
    same = next((r for r in runs.values() if r.params == params), None)
    t = time.monotonic()
    server, dp = engines(lambda p: TwinServer.from_flags(plan.model, plan.server_args(p), plan.device,
                                                        same.log_text if same else "", cal.kv_calibration), params)
    pred = predict(server.run(requests, plan.workload.concurrency, cal.cost), plan.objective.slos,
                   time.monotonic() - t)
    pred.outside = envelope.outside(server.shape, [s.shape for s in cal.servers], params, ns.rate,
                                    nominal_rate(plan.workload.requests), batch=pred.server["running_peak"],
                                    calibrated_batch=cal.largest_batch, data_parallel=dp)
    if len(cal.runs) == 1:
        pred.bands = BAND_ONE_RUN
    measured = _measured(plan, same) if same is not None and ns.rate is None else None
    return params, pred, server, cal, measured


def _on_gpu(plan, ns, changes: dict, device, requests):
    """The twin on a GPU: vLLM's GPU defaults, the roofline's pool, the library's or the roofline's step
    cost, corrected by the study's own runs when it ran on that GPU."""
    from optimizer.driver.plan import baseline_params
    from optimizer.twin.gpu.server import gpu_twin
    from optimizer.twin.gpu.correction import CorrectedStepCost
    from optimizer.twin.prediction import gpu_bands, predict
    from optimizer.whatif import architecture

    if ns.trial is not None:
        raise ConfigError("--trial goes without --what-if: a trial's CPU flags say nothing of a GPU's; give the "
                          "knobs to predict with --set")
    params = {**baseline_params(plan), **changes}
    longest = plan.workload.longest_request()
    mml = int(params.get("max-model-len") or max(longest, 1))
    arch = architecture.load(plan.model.source)
    t = time.monotonic()
    server, cost, why_not = gpu_twin(plan.model, arch, device, params, mml)
    correction, not_corrected = _gpu_correction(plan, device, arch)
    source = cost.name if not why_not else f"the roofline fitted on published measurements ({why_not})"
    if correction is not None:
        cost = CorrectedStepCost(cost, correction)
        source += f", corrected by the study's own runs on it ({correction.describe()})"
    pred = predict(server.run(requests, plan.workload.concurrency, cost), plan.objective.slos, time.monotonic() - t)
    pred.bands = gpu_bands(library=not why_not)
    note = (f"on {device.name}: vLLM's GPU defaults, the roofline's KV pool, step costs from {source}; "
            + ("the band is the one measured on published rows (a correction has not been validated against a "
               "GPU's runs)" if correction is not None else
               f"not corrected ({not_corrected}), so the band is the one measured on published rows"))
    return params, pred, server, note


def _gpu_correction(plan, device, arch):
    """The correction of `device`'s step cost by the study's runs, when the study ran on that device;
    else None and why not."""
    from optimizer.driver.store.finished_study import open_finished
    from optimizer.twin.from_study import correct_gpu, stored_runs
    from optimizer.whatif.study_calibration import measured_device

    try:
        ran_on = measured_device(open_finished(plan.cfg, check_objective=False).study, None)
    except ConfigError:
        return None, "no stored study to correct it with"
    if isinstance(ran_on, str):
        return None, ran_on
    if ran_on.name != device.name:
        return None, f"the study ran on {ran_on.name}"
    try:
        correction, _ = correct_gpu(plan, device, arch, stored_runs(plan.artifacts))
    except ConfigError as exc:  # it ran there, but no trial with request records yet: answered uncorrected
        return None, str(exc).removeprefix("simulate: ")
    return correction, ""


def _measured(plan, run) -> dict:
    """The stored run's own figures, scored as the prediction is."""
    from optimizer.measure.replay import ReplayResult, RequestRecord
    from optimizer.twin.prediction import scored

    recs = tuple(RequestRecord(**{**r, "chunk_s": tuple(r.get("chunk_s") or ())}) for r in run.records)
    first = min(r.sent_s for r in recs)
    last = max((r.end_s or r.sent_s) for r in recs)
    metrics, goodput = scored(ReplayResult(recs, max(last - first, 1e-9)), plan.objective.slos)
    return metrics if goodput is None else {**metrics, "goodput": goodput}


ROWS = (("request_throughput", "requests/s", 1), ("output_throughput", "output tok/s", 0),
        ("ttft_ms_p50", "TTFT p50 (ms)", 0), ("ttft_ms_p95", "TTFT p95 (ms)", 0), ("tpot_ms_p50", "TPOT p50 (ms)", 1),
        ("tpot_ms_p95", "TPOT p95 (ms)", 1), ("itl_ms_p95", "ITL p95 (ms)", 1), ("e2el_ms_p95", "E2E p95 (ms)", 0))


def _describe(plan, params, server, pred, cal, measured, rate, note: str = "") -> list[str]:
    from optimizer.twin.prediction import NOT_MODELLED

    knobs = " ".join(f"{k}={v}" for k, v in params.items())
    load_text = f"{rate:g} req/s" if rate else plan.workload.description
    lines = [f"Twin of {knobs} on {load_text}: nothing booted, {pred.seconds:.2f} s, {pred.steps:,} engine steps",
             f"  scheduler: vLLM's own ({server.describe()})"]
    if cal is not None:
        probed = ", ".join(str(r.number) for r in cal.runs if r.probe)
        lines.append(f"  step costs: fitted on trial(s) {', '.join(str(r.number) for r in cal.runs)} of this study"
                     f"{f' and the step probe of trial(s) {probed}' if probed else ''} "
                     f"(median error on them {math.expm1(cal.error):.1%}): {cal.cost.describe()}")
        if len(cal.runs) == 1:
            lines.append("  bands: a twin calibrated on one run (a run of the other KV dtype, or one more run, "
                         "narrows them)")
    if note:
        lines.append(f"  {note}")
    if pred.outside:
        lines.append("  OUTSIDE the validated envelope (the band is doubled): " + "; ".join(pred.outside))
    head = f"  {'':<16}{'predicted':>12}  {'band':>21}"
    lines.append(head + (f"  {'measured':>10}" if measured else ""))
    rows = list(ROWS) + ([("goodput", "goodput (req/s)", 2)] if pred.goodput is not None else [])
    for key, label, digits in rows:
        value = pred.goodput if key == "goodput" else pred.metrics.get(key)
        lo, hi = pred.band(key)
        line = f"  {label:<16}{value:>12,.{digits}f}  {lo:>9,.{digits}f} - {hi:<9,.{digits}f}"
        if measured and key in measured:
            line += f"  {measured[key]:>10,.{digits}f}"
        lines.append(line)
    s = pred.server
    lines.append(f"  server: running peak {s['running_peak']}, waiting peak {s['waiting_peak']}, KV usage peak "
                 f"{s['kv_cache_usage_peak']:.0%}, preemptions {s['preemptions']:.0f}, prefix-cache hits "
                 f"{s['prefix_cache_hit_rate']:.1%}, mean queue {s['queue_time_mean_ms']:.0f} ms")
    if measured:
        lines.append("  measured: the stored run of the trial with these flags (its own replay, not re-run)")
    lines.append("Not modelled: " + "; ".join(NOT_MODELLED) + ".")
    return lines
