"""A capacity plan (fleet/capacity.py) as the lines `plan` prints: the demand, what one replica
carries and why, the replicas and devices, the scaling; and the measured topologies side by side."""

from __future__ import annotations

from optimizer.fleet.capacity import Plan, rounded
from optimizer.twin.peak.tails import Tails


def describe(p: Plan) -> list[str]:
    """The plan as the lines the CLI prints."""
    m, usable = p.measurement, 1 - p.headroom
    other = f"{rounded(m.tokens_per_s)} tokens/s" if m.unit == "req/s" else f"{rounded(m.requests_per_s)} req/s"
    basis = (f"the mean of {m.runs} re-measured runs" if m.remeasured else
             f"its search run; its {m.other_runs} re-measured runs measured {m.other_metric}, not the rate"
             if m.other_runs
             else "one run")
    bound = f"SLOs {m.slos} held" if m.slo_bounded else "not under SLOs"
    lines = [
        f"Demand at peak: {rounded(p.peak_qps)} req/s x {rounded(p.tokens_per_request)} tokens/request = "
        f"{rounded(p.demand_tokens_per_s)} tokens/s",
        f"Per replica: trial {m.trial}, {m.metric} = {rounded(m.value)} {m.unit} ({basis}; {bound}), i.e. {other} "
        f"at the measured {rounded(m.tokens_per_request)} tokens/request",
        f"Headroom {p.headroom:.0%}: each replica planned at {rounded(m.requests_per_s * usable)} req/s, "
        f"{rounded(m.tokens_per_s * usable)} tokens/s" + (
            f"; in a fleet x {p.scaled_by:.2f} (the scaling measured): {rounded(m.requests_per_s * usable * p.scaled_by)} "
            f"req/s, {rounded(m.tokens_per_s * usable * p.scaled_by)} tokens/s" if p.scaled_by != 1.0 else ""),
        f"Replicas: {p.replicas} (req/s needs {p.replicas_for_requests}, tokens/s needs {p.replicas_for_tokens}; "
        f"binding: {p.binding})",
        f"GPUs: {p.gpus} ({p.replicas} replica(s) x {m.gpus_per_replica} GPU(s); tensor-parallel-size "
        f"{m.tensor_parallel_size})",
        f"Scaling: {p.scaling.describe()}" if p.scaling is not None else
        "Scaling: assumed 1.0 (replicas never measured together; `python -m optimizer scale` measures it)",
    ]
    return lines + [f"warning: {w}" for w in p.warnings]


def describe_topologies(rows: list[tuple[str, Plan, str]]) -> list[str]:
    """The measured topologies as the lines `plan` prints (replicas assumed to scale perfectly)."""
    lines = ["Measured topologies (fewest devices first; replicas scale 1.0 unless measured together):"]
    for label, p, room in rows:
        m = p.measurement
        scaled = f"; scaling {p.scaling.efficiency:.2f}x measured" if p.scaling is not None else ""
        lines.append(f"  {label}: trial {m.trial}, {rounded(m.value)} {m.unit} a replica on {m.gpus_per_replica} "
                     f"device(s); {p.replicas} replica(s), {p.gpus} device(s)" + scaled + (f"; {room}" if room else ""))
    return lines


SATURATED = 0.97  # a knee this close to the saturation rate is the saturation itself


def describe_tails(t: Tails, trial: int, calibrated_on: list[int]) -> list[str]:
    """Tails at the planned rate and the knee (twin/peak/tails.py) as the lines `plan` prints."""
    def shown(metric: str) -> str:
        return _shown(t, metric, "{:,.0f}".format)

    lines = [f"Tails at peak (the twin of trial {trial}, calibrated on trial(s) {', '.join(map(str, calibrated_on))}; "
             f"predicted, nothing booted; {t.requests} requests a run): each replica at {rounded(t.rate)} req/s: "
             f"TTFT {shown('ttft_ms_p95')}, {shown('ttft_ms_p99')}; TPOT {shown('tpot_ms_p95')}, {shown('tpot_ms_p99')}"]
    if t.outside:
        lines.append(f"  OUTSIDE the twin's validated envelope ({'; '.join(t.outside)}): its bands doubled")
    if t.knee is None:
        lines.append(f"Knee: needs a TTFT SLO (--slo ttft:MS); saturation at {rounded(t.ceiling)} req/s a replica "
                     "(predicted)")
    elif t.knee <= 0:
        lines.append(f"Knee: p{t.slo.percentile} TTFT misses {t.slo.limit:g} ms at every rate the twin tried, "
                     f"down to {rounded(t.ceiling / 256)} req/s: the SLO does not hold on this configuration")
    else:
        where = (f"{t.below_knee:.0%} below it" if t.below_knee >= 0 else f"{-t.below_knee:.0%} past it: the queue "
                 "grows at peak")
        reached = (f"p{t.slo.percentile} TTFT reaches {t.slo.limit:g} ms at {rounded(t.knee)} req/s a replica "
                   f"(saturation {rounded(t.ceiling)})" if t.knee < SATURATED * t.ceiling else
                   f"saturation at {rounded(t.knee)} req/s a replica (p{t.slo.percentile} TTFT stays under "
                   f"{t.slo.limit:g} ms until the queue grows without end)")
        lines.append(f"Knee: {reached}; the plan runs each at {rounded(t.rate)}, {where} (predicted; the knee has no "
                     "band of its own yet: one measured sweep put it at 0.94x the real one, bench/knee.py)")
    return lines


def describe_row_tails(rows) -> list[str]:
    """One line per what-if row the twin answered (whatif/fleet_rows.py Row with `tails`): each replica's
    tails at its share of the peak and the knee, predicted for a device and TP size never measured."""
    return [f"  tails at peak, {r.device.name} TP{r.tp}: each of {r.replicas} replica(s) at {rounded(r.tails.rate)} "
            f"req/s: {_tails_and_knee(r.tails)} (predicted)" for r in rows if r.tails is not None and r.usable]


def describe_predicted_topologies(rows, trial: int, tp_line: str, caveat: str = "") -> list[str]:
    """Data-parallel sizes the study did not measure (twin/peak/topologies.py PredictedDp, each with its plan, or
    None where no rate keeps the SLOs), a caveat where there is one, and the line on tensor-parallel sizes, as
    `plan` prints them."""
    if not rows:
        return [f"Predicted topologies: {tp_line}"]
    lines = [f"Predicted topologies (not measured; nothing booted): trial {trial}'s rate a replica times what the "
             "twin says N engines behind vLLM's balancer carry against one"]
    for row, p in rows:
        if p is None:
            lines.append(f"  DP {row.size}: keeps the SLOs at no rate on the study's workload (predicted)"
                         if row.one_carries else f"  DP {row.size}: no ratio to one engine, which the twin says "
                         "keeps the SLOs at no rate here, though it was measured to (predicted)")
            continue
        m, k = p.measurement, 1 + row.band
        lines.append(f"  DP {row.size}: x{row.ratio:.2f} [{row.ratio / k:.2f}-{row.ratio * k:.2f}] one engine, "
                     f"{rounded(m.value)} [{rounded(m.value / k)}-{rounded(m.value * k)}] {m.unit} a replica on "
                     f"{m.gpus_per_replica} device(s); {p.replicas} replica(s), {p.gpus} device(s); each at "
                     f"{rounded(row.tails.rate)} req/s: {_tails_and_knee(row.tails)} (predicted)")
    lines.append(f"  (bands: one engine's, doubled, the ratio's its throughput band; the knee has none of its own "
                 f"yet: {rows[0][0].tails.outside[0]})")
    if caveat:
        lines.append(f"  OPTIMISTIC here: {caveat}")
    return lines + [f"  {tp_line}"]


def _tails_and_knee(t: Tails) -> str:
    """'TTFT p95 47 ms [32-69], p99 ...; TPOT ...; knee 30 req/s, 33% below it'."""
    def shown(metric: str) -> str:
        return _shown(t, metric, _ms)

    if t.knee is None:
        knee = f"no TTFT SLO to take a knee against (saturation {rounded(t.ceiling)} req/s)"
    elif t.knee <= 0:
        knee = f"p{t.slo.percentile} TTFT misses {t.slo.limit:g} ms at every rate tried"
    else:
        where = f"{t.below_knee:.0%} below it" if t.below_knee >= 0 else f"{-t.below_knee:.0%} past it"
        knee = f"knee {rounded(t.knee)} req/s, {where}"
    return (f"TTFT {shown('ttft_ms_p95')}, {shown('ttft_ms_p99')}; TPOT {shown('tpot_ms_p95')}, "
            f"{shown('tpot_ms_p99')}; {knee}")


def _shown(t: Tails, metric: str, number) -> str:
    """'p95 47 ms [32-69]': one tail with its band, each value written by `number`."""
    low, high = t.bands.get(metric, (None, None))
    band = f" [{number(low)}-{number(high)}]" if low is not None else ""
    return f"{metric.split('_')[-1]} {number(t.metrics[metric])} ms{band}"


def _ms(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
