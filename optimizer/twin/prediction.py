"""What the twin predicts for one configuration, in the replayer's own names, with its band.

The metrics are `measure/metrics.summarize` of the simulated records (TTFT, TPOT, ITL and E2E
percentiles, throughputs), goodput is the simulated requests that met every SLO per second of the
window (vLLM's per-request definition, `measure/slo.good_requests`), and the server's view holds
what `/metrics` shows (running and waiting peaks, KV usage peak, preemptions, prefix-cache hits).

The band of a metric is a factor: the twin's 90th-percentile |error| on that metric, measured
against real runs the twin was not calibrated on (bench/twin_validation.py; docs/twin.md has the
table and its date). An interval is the prediction divided and multiplied by 1 + that error, so
it never leaves the metric's possible range (a latency or a rate stays above 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optimizer.measure.metrics import summarize
from optimizer.measure.slo import good_requests

# 90th-percentile |error| of a calibrated twin on runs it was not calibrated on, per metric, pooled
# over the 4 validation sets, 105 predictions (bench/twin_validation.py, 2026-12-07; docs/twin.md
# "How far to trust it"). ITL, TTFT p99 and TPOT p99 were not validated: they get the widest latency band.
BAND = {"request_throughput": 0.097, "output_throughput": 0.097, "total_token_throughput": 0.097,
        "ttft_ms_p50": 0.402, "ttft_ms_p90": 0.402, "ttft_ms_p95": 0.282, "ttft_ms_p99": 0.402,
        "tpot_ms_p50": 0.238, "tpot_ms_p90": 0.238, "tpot_ms_p95": 0.206, "tpot_ms_p99": 0.402, "itl_ms_p95": 0.402,
        "e2el_ms_p50": 0.252, "e2el_ms_p95": 0.252, "goodput": 0.631}
# The same, calibrated on one run (the baseline alone: what a study has after one boot), predicting the
# runs of the same KV dtype, 56 predictions (bench/twin_validation.py --one-run, 2026-12-07): one run
# at a steady batch leaves a step's fixed and per-sequence costs hard to tell apart.
BAND_ONE_RUN = {"request_throughput": 0.139, "output_throughput": 0.139, "total_token_throughput": 0.139,
                "ttft_ms_p50": 0.633, "ttft_ms_p90": 0.633, "ttft_ms_p95": 0.361, "ttft_ms_p99": 0.633,
                "tpot_ms_p50": 0.302, "tpot_ms_p90": 0.302, "tpot_ms_p95": 0.227, "tpot_ms_p99": 0.633, "itl_ms_p95": 0.633,
                "e2el_ms_p50": 0.316, "e2el_ms_p95": 0.316, "goodput": 1.950}


# 90th percentile of |log(predicted / measured)| of the twin with aiconfigurator-core's step cost on
# the 30 published rows the library answered (bench/twin_published.py, 2026-12-07, each burst replayed on
# the prefix cache its server had; docs/twin.md), as factors - 1: TTFT x2.21 and TPOT x2.08 (the library
# prices an fp8 8B model's decode on an H200 2x too high). Throughput was published on 8 of those rows
# only (within 30%): it takes TPOT's band.
LIBRARY_PRIOR = {"ttft_s": 1.214, "tpot_s": 1.075, "throughput": 1.075}


def gpu_bands(library: bool) -> dict:
    """A GPU twin's band per twin metric: measured on published rows for its step cost (the library's,
    or the roofline's own prior, whatif/calibration.py), before any run on that GPU narrows it."""
    from optimizer.whatif.calibration import PRIOR

    e = LIBRARY_PRIOR if library else {k: math.expm1(v) for k, v in PRIOR.items()}
    out = {m: e["throughput"] for m in ("request_throughput", "output_throughput", "total_token_throughput",
                                         "goodput")}
    out.update({m: e["ttft_s"] for m in ("ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99")})
    out.update({m: e["tpot_s"] for m in ("tpot_ms_p50", "tpot_ms_p95", "itl_ms_p95")})
    out["e2el_ms_p95"] = max(e.values())
    return out


# Said with every prediction: what the twin does not model.
NOT_MODELLED = ("speculative decoding without a measured acceptance rate", "LoRA adapters",
                "multimodal encoders", "tensor and pipeline parallel ranks",
                "host-side stalls (the real server pauses 1-3 s at random on a busy CPU)",
                "the front end taking a burst in one request at a time (each request's intake is a constant)")

HEADLINE = ("request_throughput", "output_throughput", "ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50",
            "tpot_ms_p95", "itl_ms_p95", "e2el_ms_p95")


@dataclass
class Prediction:
    metrics: dict
    server: dict
    goodput: float | None  # requests/s that met every SLO; None without SLOs
    steps: int
    seconds: float  # wall time the simulation took
    outside: list[str] = field(default_factory=list)  # why the configuration is outside the validated envelope
    bands: dict | None = None  # per metric, replacing BAND (a step cost with a band of its own: the roofline's)

    def band(self, metric: str) -> tuple[float, float]:
        value = self.goodput if metric == "goodput" else self.metrics.get(metric, math.nan)
        table = self.bands or BAND
        e = table.get(metric, max(table.values())) * (2 if self.outside else 1)
        if value is None or not math.isfinite(value):
            return math.nan, math.nan
        return value / (1 + e), value * (1 + e)

    def as_dict(self) -> dict:
        return {"metrics": self.metrics, "server": self.server, "goodput": self.goodput, "steps": self.steps,
                "seconds": self.seconds, "outside_envelope": self.outside,
                "bands": {m: self.band(m) for m in HEADLINE + (("goodput",) if self.goodput is not None else ())}}


def scored(result, slos: tuple = ()) -> tuple[dict, float | None]:
    """A replay's metrics, and its goodput (requests/s meeting every latency SLO; None without one):
    the same for a simulated replay and a stored real one."""
    goodput = None
    if any(s.metric in ("ttft", "tpot", "e2el") for s in slos):
        goodput = good_requests(slos, result.records) / result.window_s
    return summarize(result), goodput


def predict(simulated, slos: tuple = (), seconds: float = 0.0) -> Prediction:
    metrics, goodput = scored(simulated.result, slos)
    return Prediction(metrics, simulated.server, goodput, simulated.steps, seconds)
