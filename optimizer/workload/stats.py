"""The shape of a workload in numbers: lengths, rate, burstiness, shared prefixes.

Used by `python -m optimizer workload` (look before you tune) and by the tests that check
each scenario and arrival process produces what its spec says.
"""

from __future__ import annotations

import statistics

from optimizer.workload.base import Workload

PREFIX_PROBE = 128  # tokens: requests starting with the same 128 ids share a cacheable prefix


def gaps(offsets: list[float]) -> list[float]:
    s = sorted(offsets)
    return [b - a for a, b in zip(s, s[1:])]


def mean_rate(offsets: list[float]) -> float:
    """Requests per second over the schedule (n - 1 gaps over the span)."""
    g = gaps(offsets)
    span = sum(g)
    return len(g) / span if span > 0 else float("inf")


def burstiness_cv(offsets: list[float]) -> float:
    """Coefficient of variation of the gaps: 0 constant, 1 Poisson, above 1 bursty.
    For gamma gaps with shape k, CV = 1/sqrt(k) (vLLM's burstiness factor is k)."""
    g = gaps(offsets)
    m = statistics.fmean(g) if g else 0.0
    return statistics.pstdev(g) / m if m > 0 else 0.0


def shared_prefix_share(workload: Workload) -> float:
    """Share of measured requests whose first PREFIX_PROBE tokens another request also starts with."""
    heads = [r.prompt_token_ids[:PREFIX_PROBE] for r in workload.requests if len(r.prompt_token_ids) >= PREFIX_PROBE]
    if not workload.requests:
        return 0.0
    counts: dict[tuple, int] = {}
    for h in heads:
        counts[h] = counts.get(h, 0) + 1
    return sum(1 for h in heads if counts[h] > 1) / len(workload.requests)


def _spread(values: list[int]) -> str:
    q = statistics.quantiles(values, n=20, method="inclusive") if len(values) > 1 else values * 19
    return f"min {min(values)}, p50 {statistics.median(values):.0f}, p95 {q[18]:.0f}, max {max(values)}"


def describe(workload: Workload) -> list[str]:
    """Lines a person reads before tuning against this workload."""
    reqs = workload.requests
    prompts = [len(r.prompt_token_ids) for r in reqs]
    outputs = [r.max_tokens for r in reqs]
    lines = [f"workload {workload.description}",
             f"  hash {workload.content_hash()[:12]}: {len(reqs)} measured requests, {len(workload.warmup)} warm-up",
             f"  prompt tokens: {_spread(prompts)}", f"  output tokens: {_spread(outputs)}",
             f"  requests sharing a {PREFIX_PROBE}-token prefix: {shared_prefix_share(workload):.0%}"]
    roots = [r.offset_s for r in reqs if r.after is None]
    if workload.concurrency is not None:
        lines.append(f"  closed loop: {workload.concurrency} in flight")
    elif len(roots) > 1:
        lines.append(f"  schedule: {max(roots) - min(roots):.1f} s, mean {mean_rate(roots):.2f} req/s, "
                     f"gap CV {burstiness_cv(roots):.2f} (1 = Poisson)")
    follow = sum(1 for r in reqs if r.after is not None)
    if follow:
        lines.append(f"  {follow} requests wait for an earlier reply (agent turns)")
    lines += [f"  note: {n}" for n in workload.notes]
    return lines
