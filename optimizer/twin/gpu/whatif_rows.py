"""`plan --what-if` rows answered by the twin: per device and TP size, the rate one replica carries
on the study's own workload (its length distributions, prefixes and arrival process, not a mean
request) with the SLOs holding at their percentiles, from vLLM's scheduler with the device's
defaults and the roofline's step cost (twin/gpu/server.py, twin/peak/capacity.py). Replicas, devices and cost
follow as for the mean estimate's rows (whatif/fleet_rows.py), whose Row they fill.

Each twin row also carries its tails at the planned rate (each replica's share of the peak) and its
knee (twin/peak/tails.py), with the GPU twin's band: the same figures `plan` gives the measured
configuration, for a device and TP size never measured.

Refused (the mean estimate answers that row, and says why): a closed-loop workload (no rate to
search), a device the model does not fit at that TP, a TP the heads do not divide.
"""

from __future__ import annotations

import math
from dataclasses import replace

from optimizer.twin.peak.capacity import capacity
from optimizer.twin.gpu.server import gpu_twin
from optimizer.twin.prediction import gpu_bands
from optimizer.twin.peak.tails import tails
from optimizer.whatif.fleet_rows import Row
from optimizer.whatif.predict import tp_allowed
from optimizer.whatif.roofline import Serving, kv_capacity_tokens

BY = "twin (vLLM's scheduler, {} step cost)"


def twin_row(model, arch, analytic: Row, params: dict, requests, concurrency, slos, peak_qps: float,
             headroom: float, price: float | None, max_model_len: int) -> tuple[Row, str]:
    """The twin's answer for `analytic`'s device and TP; or `analytic` itself and why the twin did not answer."""
    if concurrency is not None:
        return analytic, "the study's workload is a closed loop, with no rate to search"
    if not analytic.fits or not tp_allowed(arch, analytic.tp):
        return analytic, ""
    p = {**params, "tensor-parallel-size": analytic.tp}
    util = float(p.get("gpu-memory-utilization") or 0.9)
    if kv_capacity_tokens(arch, analytic.device, Serving(analytic.tp, 256, util)) < max_model_len:
        return analytic, f"a KV cache that holds less than one {max_model_len:,}-token request"
    server, cost, why_not = gpu_twin(model, arch, analytic.device, p, max_model_len)
    by = BY.format("roofline" if why_not else "aiconfigurator-core")
    cap = capacity(server, cost, requests, slos)
    if cap.rate <= 0:
        return replace(analytic, by=by, requests_per_s=0.0, why="keeps the SLOs at no rate on the study's workload"), ""
    replicas = max(1, math.ceil(round(peak_qps / (cap.rate * (1 - headroom)), 9)))
    m = cap.metrics
    in_flight = max(1, round(cap.rate * m["e2el_ms_mean"] / 1e3))  # Little's law at the capacity
    bands = gpu_bands(library=not why_not)
    widest = max(bands.values())

    def band(metric: str, v: float) -> tuple[float, float]:
        e = bands.get(metric, widest)
        return v / (1 + e), v * (1 + e)

    at_peak = tails(server, cost, requests, peak_qps / replicas, slos, band=band)
    return replace(analytic, by=by, why="", kv_tokens=server.pool.usable_tokens, concurrency=in_flight,
                   ttft_s=m["ttft_ms_p95"] / 1e3, tpot_s=m["tpot_ms_p95"] / 1e3, throughput=m["output_throughput"],
                   requests_per_s=cap.rate, replicas=replicas, devices=replicas * analytic.tp,
                   cost_per_h=None if price is None else replicas * analytic.tp * price, note="", tails=at_peak), ""
