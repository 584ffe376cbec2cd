"""The analytic estimate beside the twin in bench/twin_validation.py: `plan --what-if`'s roofline
(optimizer/whatif/roofline.py), with this CPU described as a device whose bandwidth, compute and
per-layer and per-request overheads are fitted (Nelder-Mead on log errors) to the same calibration
runs the twin is fitted on.

The roofline sees means: a request of the set's mean prompt and output lengths, `concurrency` in
flight. A closed loop gives it its concurrency; an open loop gets min(max-num-seqs, the requests the
rate keeps in flight by Little's law at the calibration run's latency), and its throughput is capped
at the offered rate. Its KV capacity is the run's pool. It has no prefix cache, no chunked-prefill
budget and no preemption: that is what it is compared for.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from optimizer.whatif import architecture
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.roofline import Efficiency, Load, Serving, estimate


class AnalyticFit:
    def __init__(self, ctx, chosen: list[dict], tv):
        """`tv`: the caller's helpers (bench/twin_validation.py's `measured`, `twin_server`, `METRICS`),
        passed in so that neither file imports the other."""
        self.tv, self.ctx = tv, ctx
        cfg, _ = architecture.read(ctx.plan.model.source)
        self.arch = architecture.from_config("model", cfg)
        reqs = ctx.plan.workload.requests
        self.isl = max(1, round(statistics.fmean(len(r.prompt_token_ids) for r in reqs)))
        self.osl = max(1, round(statistics.fmean(r.max_tokens for r in reqs)))
        self.rate = _rate(reqs)
        self.chosen = chosen
        self.meas = [tv.measured(ctx, r) for r in chosen]
        self.x = self._fit()

    def _load(self, row: dict, server) -> Load:
        c = self.ctx.plan.workload.concurrency
        if c is None:  # open loop: Little's law at the first calibration run's mean latency
            e2e = self.meas[0]["e2el_ms_mean"] / 1000
            c = max(1, min(server.shape.max_num_seqs, math.ceil(self.rate * e2e)))
        return Load(self.isl, self.osl, int(c))

    def _one(self, x, row: dict) -> dict:
        bw, tf, layer, req = np.exp(x)
        server = self.tv.twin_server(self.ctx, row)
        pool = server.pool.usable_tokens * server.model.kv_bytes_per_token(server.shape.kv_cache_dtype)
        memory = pool + self.arch.weight_bytes + (1 << 30)
        device = DeviceSpec("this CPU", memory / 1e9, bw, tf, tf, 1.0, "none", "fitted")
        s = Serving(1, server.shape.max_num_seqs, 1.0, server.shape.kv_cache_dtype)
        e = estimate(self.arch, device, s, self._load(row, server), Efficiency(1.0, 1.0, layer, 0.0, 1.0, req))
        if not e.fits:
            return {}
        rps = e.throughput / self.osl
        if self.rate:
            rps = min(rps, self.rate)
        ttft, tpot = e.ttft_s * 1000, e.tpot_s * 1000
        e2e = ttft + tpot * (self.osl - 1)
        good = rps if all(_holds(s_, ttft, tpot, e2e) for s_ in self.ctx.slos) else 0.0
        return {"request_throughput": rps, "output_throughput": rps * self.osl, "ttft_ms_p50": ttft,
                "ttft_ms_p95": ttft, "tpot_ms_p50": tpot, "tpot_ms_p95": tpot, "e2el_ms_p95": e2e, "goodput": good}

    def _loss(self, x) -> float:
        total = 0.0
        for row, m in zip(self.chosen, self.meas):
            p = self._one(x, row)
            if not p:
                return 1e6
            for k in ("request_throughput", "ttft_ms_p50", "tpot_ms_p50"):
                total += math.log(max(p[k], 1e-9) / m[k]) ** 2
        return total

    def _fit(self):
        from scipy.optimize import minimize

        start = np.log([20.0, 0.5, 1e-4, 0.01])  # GB/s, TFLOPs, s a layer, s a request
        return minimize(self._loss, start, method="Nelder-Mead", options={"maxiter": 400, "xatol": 1e-3}).x

    def predict_all(self, rows: list[dict]) -> list[dict]:
        nan = {k: math.nan for k in self.tv.METRICS}
        return [self._one(self.x, r) or nan for r in rows]


def _rate(reqs) -> float | None:
    span = max((r.offset_s for r in reqs), default=0.0)
    return len(reqs) / span if span > 0 else None


def _holds(slo, ttft: float, tpot: float, e2e: float) -> bool:
    value = {"ttft": ttft, "tpot": tpot, "e2el": e2e}.get(slo.metric)
    return value is None or value <= slo.limit
