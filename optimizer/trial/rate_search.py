"""The highest request rate a booted server carries with every SLO holding (goodput search).

Inside one trial, on one server, the workload's requests are replayed at a few rates:

1. all at once (rate inf): the saturation probe. Its request throughput is the server's
   capacity, the upper end of the bracket; no sustained rate above it can hold an SLO.
   If the SLOs hold even there, the capacity is the answer.
2. a fraction of the capacity (`low_share`): the lower end. If the SLOs fail there too,
   once more at a quarter of that; failing again, the answer is 0 (no rate down to
   low_share/4 of the capacity holds them: the search does not go lower).
3. between the highest pass and the lowest fail, interpolate where the worst SLO's
   log(observed / limit) crosses 0 (kept 20-80% inside the bracket; after two probes that
   moved the same end, bisect), until the bracket is within `rel_tol` of its top or the
   probe budget is spent.

This follows vLLM's SLA sweep (test max, then min, interpolate the SLO margin, stop when
the bracket is small) and GuideLLM's sweep (synchronous -> max throughput -> in between);
see docs/vllm-facts.md#sla-rate-search. The search is a pure function of a `probe(rate)` callback, so its logic is
tested against a known latency curve without a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from optimizer.workload import Request


@dataclass(frozen=True)
class Probe:
    rate: float  # requests/s asked for (inf: everything at once)
    passed: bool
    score: float  # worst log(observed / limit) over the SLOs; < 0 passes
    metrics: dict = field(default_factory=dict)
    seconds: float = 0.0  # replay time spent
    stopped_early: str = ""  # why the probe was cut short, if it was
    saved_s: float = 0.0  # schedule time the cut saved

    def summary(self) -> dict:
        m = self.metrics
        return {"rate": None if math.isinf(self.rate) else round(self.rate, 3), "passed": self.passed,
                "score": round(self.score, 3) if math.isfinite(self.score) else None,
                "request_throughput": round(m.get("request_throughput", 0.0), 3),
                "ttft_ms_p95": _r(m.get("ttft_ms_p95")), "tpot_ms_p95": _r(m.get("tpot_ms_p95")),
                "seconds": round(self.seconds, 1), "stopped_early": self.stopped_early,
                "saved_s": round(self.saved_s, 1)}


def _r(v):
    return round(v, 1) if isinstance(v, float) and math.isfinite(v) else None


@dataclass(frozen=True)
class SearchResult:
    best: Probe | None  # the highest passing rate; None: no rate tried holds the SLOs
    probes: tuple[Probe, ...]
    capacity: float  # request throughput at saturation

    @property
    def goodput_rate(self) -> float:
        """The answer: requests/s with every SLO holding (the capacity when even saturation holds)."""
        if self.best is None:
            return 0.0
        return self.capacity if math.isinf(self.best.rate) else self.best.rate


def at_rate(requests: tuple[Request, ...], rate: float) -> tuple[Request, ...]:
    """The same requests with their open-loop send times rescaled so the whole set arrives at
    `rate` requests/s (inf: all at once): the schedule spans len(requests) / rate seconds, as
    vLLM rescales its own. Requests that follow another (agent turns) keep their think time;
    they count toward the rate, so session starts are spread by the turns they bring."""
    roots = [r for r in requests if r.after is None]
    span = max((r.offset_s for r in roots), default=0.0)
    scale = 0.0 if math.isinf(rate) or span <= 0 else (len(requests) / rate) / span
    return tuple(r if r.after is not None else replace(r, offset_s=r.offset_s * scale) for r in requests)


def nominal_rate(requests: tuple[Request, ...]) -> float | None:
    """Requests/s of the schedule as written (None: no open-loop schedule to scale)."""
    span = max((r.offset_s for r in requests if r.after is None), default=0.0)
    return len(requests) / span if span > 0 else None


def search(probe: Callable[[float], Probe], max_probes: int = 6, rel_tol: float = 0.1,
           low_share: float = 0.25) -> SearchResult:
    """Bracket then interpolate (module docstring); `probe(rate)` replays at `rate` and judges it."""
    probes: list[Probe] = []

    def run(rate: float) -> Probe:
        p = probe(rate)
        probes.append(p)
        return p

    top = run(math.inf)
    capacity = top.metrics.get("request_throughput", 0.0)
    if top.passed:
        return SearchResult(top, tuple(probes), capacity)
    if capacity <= 0:
        return SearchResult(None, tuple(probes), capacity)
    fail, fail_score = capacity, top.score
    low = run(capacity * low_share)
    if not low.passed:
        fail, fail_score = low.rate, low.score
        if len(probes) >= max_probes:
            return SearchResult(None, tuple(probes), capacity)
        low = run(low.rate / 4)
        if not low.passed:
            return SearchResult(None, tuple(probes), capacity)
    best, last_side, repeat = low, "", False
    while len(probes) < max_probes and (fail - best.rate) / fail > rel_tol:
        # After two probes in a row that moved the same end of the bracket, the line misleads (a
        # hockey-stick curve): bisect instead of creeping 20% at a time (Illinois-style).
        p = run(_between(best.rate, best.score, fail, fail_score, bisect=repeat))
        side = "low" if p.passed else "high"
        repeat, last_side = side == last_side, side
        if p.passed:
            best = p
        else:
            fail, fail_score = p.rate, p.score
    return SearchResult(best, tuple(probes), capacity)


def _between(lo: float, lo_score: float, hi: float, hi_score: float, bisect: bool = False) -> float:
    """Where the score crosses 0 on the line between (lo, lo_score) and (hi, hi_score), kept
    20-80% inside the bracket; the middle when `bisect`."""
    if bisect or not (math.isfinite(lo_score) and math.isfinite(hi_score) and hi_score > lo_score):
        t = 0.5
    else:
        t = -lo_score / (hi_score - lo_score)
    t = min(0.8, max(0.2, t))
    return lo + t * (hi - lo)
