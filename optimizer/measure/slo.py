"""Service-level objectives: what "good enough" means to the operator, written like vLLM's
`--goodput` (`ttft:500 tpot:50 e2el:2000`, milliseconds).

Each latency SLO holds at a percentile (p95 unless the key names one: `ttft_p99:300`);
`error:1` bounds the share of failed requests (in percent). A set of SLOs judges a
replay's metrics three ways:

- `excess(metrics)`: per SLO, (observed - limit) / limit; <= 0 holds. These are the
  Optuna constraint values (`trial.set_constraint`), so the sampler learns the feasible
  region instead of losing the point.
- `good_requests(records)`: requests that met every latency SLO on their own (vLLM's
  per-request goodput definition, DistServe).
- `broken_beyond_repair(...)`: the planned run can no longer meet it: even if every request
  still to come took 0 ms, the percentile would be over the limit (early stop).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from optimizer.errors import ConfigError
from optimizer.measure.metrics import percentile

LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 95, 99)  # the ones metrics.summarize reports
_KEY = re.compile(r"^(ttft|tpot|itl|e2el|error)(?:_p(\d+))?$")


@dataclass(frozen=True)
class Slo:
    metric: str  # ttft | tpot | itl | e2el (ms) | error (percent of requests)
    limit: float
    percentile: int = 95

    @property
    def key(self) -> str:
        return "error_pct" if self.metric == "error" else f"{self.metric}_p{self.percentile}"

    def observed(self, metrics: dict) -> float:
        if self.metric == "error":
            n = metrics.get("requests")
            if n:  # from the counts: 7 of 100 is exactly 7.0, not 7.000000000000001
                return 100.0 * (n - metrics.get("completed", n)) / n
            return 100.0 * metrics.get("error_rate", 0.0)
        return metrics.get(f"{self.metric}_ms_p{self.percentile}", math.nan)

    def excess(self, metrics: dict) -> float:
        """(observed - limit) / limit: <= 0 holds; a missing measurement counts as broken (+inf)."""
        value = self.observed(metrics)
        if value is None or not math.isfinite(value):
            return math.inf
        if self.limit == 0:
            return value  # error:0 -> any failure breaks it
        return (value - self.limit) / self.limit

    def __str__(self) -> str:
        if self.metric == "error":
            return f"error <= {self.limit:g}%"
        return f"p{self.percentile} {self.metric.upper()} <= {self.limit:g} ms"


def parse_slos(text: str | None) -> tuple[Slo, ...]:
    """'ttft:500 tpot:50 error:1' -> SLOs; raises ConfigError naming the bad part."""
    if not text:
        return ()
    out: dict[str, Slo] = {}
    for part in text.replace(",", " ").split():
        key, sep, raw = part.partition(":")
        m = _KEY.match(key.strip().lower())
        if not sep or not m:
            raise ConfigError(f"slo '{part}': write it as name:limit with name one of ttft, tpot, itl, e2el "
                              "(optionally _p50/_p90/_p95/_p99) or error, e.g. 'ttft:500 tpot:50'")
        metric, pct = m.group(1), int(m.group(2) or 95)
        if metric == "error" and m.group(2):
            raise ConfigError(f"slo '{part}': error takes no percentile; write error:1 (percent of requests)")
        if metric != "error" and pct not in PERCENTILES:
            raise ConfigError(f"slo '{part}': percentile p{pct} is not measured; use one of "
                              f"{', '.join(f'p{q}' for q in PERCENTILES)}")
        try:
            limit = float(raw)
        except ValueError:
            raise ConfigError(f"slo '{part}': limit '{raw}' is not a number (milliseconds; percent for error)") from None
        if not math.isfinite(limit) or limit < 0 or (metric != "error" and limit == 0):
            raise ConfigError(f"slo '{part}': the limit must be a positive number")
        if metric == "error" and limit > 100:
            raise ConfigError(f"slo '{part}': error is a percentage of requests (0-100)")
        slo = Slo(metric, limit, pct)
        if slo.key in out:
            raise ConfigError(f"slo '{part}': {slo.key} is given twice; keep one")
        out[slo.key] = slo
    return tuple(out.values())


def describe(slos: tuple[Slo, ...]) -> str:
    return ", ".join(map(str, slos)) or "none"


def excess(slos: tuple[Slo, ...], metrics: dict) -> dict[str, float]:
    """Constraint values by SLO key (<= 0 holds)."""
    return {s.key: s.excess(metrics) for s in slos}


def holds(slos: tuple[Slo, ...], metrics: dict) -> bool:
    return all(v <= 0 for v in excess(slos, metrics).values())


def worst_log_ratio(slos: tuple[Slo, ...], metrics: dict) -> float:
    """max over SLOs of log(observed / limit): < 0 holds. Latency rises like a hockey stick near
    saturation; on this scale the rate search interpolates between a pass and a fail sensibly."""
    worst = -math.inf
    for s in slos:
        value, limit = s.observed(metrics), s.limit
        if value is None or not math.isfinite(value):
            return math.inf
        if s.metric == "error":
            value, limit = value + 0.1, limit + 0.1  # error 0% is finite on a log scale
        worst = max(worst, math.log(max(value, 1e-9) / limit))
    return worst


def request_values(record) -> dict[str, float]:
    """One request's ttft / tpot / e2el in ms (tpot only with more than one output token)."""
    out = {}
    if record.ok and record.first_chunk_s is not None:
        out["ttft"] = (record.first_chunk_s - record.sent_s) * 1000
        out["e2el"] = (record.end_s - record.sent_s) * 1000
        if record.output_tokens > 1:
            out["tpot"] = (record.end_s - record.first_chunk_s) * 1000 / (record.output_tokens - 1)
    return out


def good_requests(slos: tuple[Slo, ...], records) -> int:
    """Requests that met every per-request latency SLO (vLLM's goodput counts these)."""
    limits: dict[str, float] = {}
    for s in slos:
        if s.metric in ("ttft", "tpot", "e2el"):
            limits[s.metric] = min(limits.get(s.metric, math.inf), s.limit)  # the strictest, in any order
    good = 0
    for r in records:
        values = request_values(r)
        if r.ok and all(values.get(k, 0.0) <= v for k, v in limits.items()):
            good += 1
    return good


def best_case(values: list[float], remaining: int, q: float) -> float:
    """The lowest the final percentile can still be: every request still to come takes 0 ms.
    (A percentile cannot fall when values rise, so this bound is exact.)"""
    return percentile(list(values) + [0.0] * max(0, remaining), q)


def broken_beyond_repair(slos: tuple[Slo, ...], records, planned: int) -> str | None:
    """The first SLO that `planned` requests can no longer meet given the finished `records`
    (None if all can still hold): even if every remaining request took 0 ms, the percentile
    would be over the limit. Judged for ttft and e2el (every request has one) and error;
    tpot and itl are left to the end of the run (not every request has one)."""
    failed = sum(1 for r in records if not r.ok)
    remaining = planned - len(records)
    for s in slos:
        if s.metric == "error":
            if failed * 100 > s.limit * planned:  # integers on the left: no rounding at the limit
                return f"{failed} of {planned} planned requests failed already ({str(s)})"
            continue
        if s.metric not in ("ttft", "e2el"):
            continue
        values = [v[s.metric] for v in map(request_values, records) if s.metric in v]
        floor = best_case(values, remaining, s.percentile)
        if floor > s.limit:
            over = sum(1 for v in values if v > s.limit)
            return (f"{over} of {planned} planned requests already missed {str(s)}: even if the other "
                    f"{remaining} took 0 ms the p{s.percentile} would be {floor:.0f} ms")
    return None
