"""A capacity plan (fleet/capacity.py) as the lines `plan` prints: the demand, what one replica
carries and why, the replicas and devices, the scaling; and the measured topologies side by side."""

from __future__ import annotations

from optimizer.fleet.capacity import Plan, rounded


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
