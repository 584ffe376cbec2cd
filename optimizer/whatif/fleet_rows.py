"""The predicted rows `plan --what-if` prints: per device and TP size, what one replica would
carry under the SLOs, and the replicas, devices and cost a peak load needs.

A replica's capacity: the estimate (whatif/predict.py, corrected by the calibration) at closed
loads of 1, 2, 4, ... requests in flight up to max-num-seqs (and the whole requests its KV cache
holds); the highest output throughput whose predicted TTFT and TPOT keep the SLOs, or the one at
the largest load without SLOs. The estimate gives means, the SLOs are percentiles (p95 by
default): a prediction that keeps a p95 SLO at its mean keeps it only as far as the tail is short,
which the measured rows, not these, show. Requests/s = output tokens/s / output tokens a request.
Replicas = ceil(peak / (requests/s x (1 - headroom))), devices = replicas x TP; cost per hour =
devices x the price given for the device. Rows are sorted by cost (or devices), cheapest first;
a configuration that does not fit, or keeps no SLO at any load, is listed last with why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.measure.slo import Slo
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.calibration import Calibration
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.predict import kind_of, predict
from optimizer.whatif.roofline import Load, Serving


@dataclass(frozen=True)
class Row:
    device: DeviceSpec
    tp: int
    by: str
    fits: bool
    why: str = ""  # when it cannot serve: why
    kv_tokens: int = 0
    concurrency: int = 0  # requests in flight at the capacity chosen
    ttft_s: float = math.inf
    tpot_s: float = math.inf
    throughput: float = 0.0  # output tokens/s of one replica
    requests_per_s: float = 0.0
    replicas: int = 0
    devices: int = 0
    cost_per_h: float | None = None
    note: str = ""  # why the library did not answer, when the roofline did
    band: float = 0.0  # the throughput's band as +-x (0.35: 35%), as the calibration applies to this row
    tails: object = None  # a twin row's tails at the planned rate and its knee (twin/peak/tails.py Tails)

    @property
    def usable(self) -> bool:
        return self.fits and self.requests_per_s > 0


def _loads(limit: int) -> list[int]:
    out, c = [], 1
    while c < limit:
        out.append(c)
        c *= 2
    return out + [limit]


def _keeps(slos: tuple[Slo, ...], ttft_ms: float, tpot_ms: float, osl: int) -> bool:
    """Every latency SLO holds at the predicted means (an error-rate SLO is not predicted)."""
    e2el = ttft_ms + (osl - 1) * tpot_ms
    for s in slos:
        value = {"ttft": ttft_ms, "tpot": tpot_ms, "itl": tpot_ms, "e2el": e2el}.get(s.metric)
        if value is not None and value > s.limit:
            return False
    return True


def row(source: str, arch: Architecture, device: DeviceSpec, tp: int, serving: Serving, isl: int, osl: int,
        cal: Calibration, slos: tuple[Slo, ...], peak_qps: float, headroom: float,
        price: float | None) -> Row:
    s = Serving(tp, serving.max_num_seqs, serving.utilization, serving.kv_dtype)
    first = predict(source, arch, device, s, Load(isl, osl, 1))
    if not first.estimate.fits:
        return Row(device, tp, first.by, False, first.estimate.why, first.estimate.kv_tokens, note=first.note)
    best = None
    for c in _loads(min(s.max_num_seqs, first.estimate.kv_requests)):
        p = first if c == 1 else predict(source, arch, device, s, Load(isl, osl, c))
        here = cal.for_row(device.name, kind_of(p.by))  # the correction for the estimator that answered
        ttft, tpot, tput = (here.apply(m, v) for m, v in (("ttft_s", p.estimate.ttft_s), ("tpot_s", p.estimate.tpot_s),
                                                           ("throughput", p.estimate.throughput)))
        if slos and not _keeps(slos, ttft * 1e3, tpot * 1e3, osl):
            continue
        if best is None or tput > best[3]:
            best = (c, ttft, tpot, tput, p.by, here.percent("throughput"))
    if best is None:
        return Row(device, tp, first.by, True, "keeps the SLOs at no load, not even one request alone",
                   first.estimate.kv_tokens, note=first.note)
    c, ttft, tpot, tput, by, band = best
    rps = tput / osl
    replicas = max(1, math.ceil(round(peak_qps / (rps * (1 - headroom)), 9)))
    return Row(device, tp, by, True, "", first.estimate.kv_tokens, c, ttft, tpot, tput, rps, replicas,
               replicas * tp, None if price is None else replicas * tp * price, first.note, band)


def rows(source: str, arch: Architecture, devices: list[DeviceSpec], tps: list[int], serving: Serving, isl: int,
         osl: int, cal: Calibration, slos: tuple[Slo, ...], peak_qps: float, headroom: float,
         prices: dict[str, float]) -> list[Row]:
    out = [row(source, arch, d, tp, serving, isl, osl, cal, slos, peak_qps, headroom, prices.get(d.name))
           for d in devices for tp in tps]
    return sorted(out, key=lambda r: (not r.usable, r.cost_per_h if r.cost_per_h is not None else math.inf,
                                      r.devices, r.ttft_s))
