"""Early stopping, the driver's side: from a trial's partial measurement (a stage checkpoint),
the value to report to Optuna now and whether the trial can still beat the best so far.

The rules stop only a trial that provably cannot win, so no stop ever discards a winner
(against the best as measured; `early_stop.margin` widens that by the measurement noise):

- latency (a percentile of TTFT or E2E, minimized): even if every request still to come took
  0 ms, the final percentile would exceed the best trial's value (slo.best_case: the same
  bound as for a lost SLO). TPOT/ITL are not judged early (not every request has one).
- throughput (maximized): the measured window can only grow, so the final value is at
  most planned tokens (or requests) / time elapsed so far; below the best, it cannot win.
- goodput (maximized): the rate search never answers above the capacity it measured
  first (trial/rate_search.py), so a capacity below the best cannot win.

Pareto studies are not stopped early: there is no single best to lose to.
"""

from __future__ import annotations

import math

from optimizer.measure.metrics import percentile
from optimizer.measure.slo import best_case

PLANNED_KEYS = {"output_throughput": "planned_output_tokens", "request_throughput": "planned",
                "total_token_throughput": "planned_total_tokens"}
DONE_KEYS = {"output_throughput": "output_tokens", "request_throughput": "finished",
             "total_token_throughput": "total_tokens"}


def intermediate(objective, payload: dict) -> float | None:
    """The objective's value on the partial measurement (what `trial.report` records), or None."""
    if getattr(objective, "multi", False):
        return None
    if objective.name == "goodput":
        return payload.get("capacity_rps")
    if objective.name == "latency":
        base, pct = objective.metric.rsplit("_p", 1)
        values = payload.get(base, [])
        return percentile(values, float(pct)) if values else None
    if objective.name == "throughput":
        elapsed = payload.get("elapsed_s", 0.0)
        done = payload.get(DONE_KEYS[objective.metric])
        return done / elapsed if elapsed > 0 and done is not None else None
    return None


def verdict(objective, payload: dict, best: float | None, margin: float = 0.0) -> str:
    """Why this trial cannot beat `best` (the best feasible value so far), or '' to go on.
    With `margin` (e.g. 0.1), it must be that much worse than the best even at its best: single
    measurements move ~10% here, so a trial just behind the best may be its equal."""
    if best is None or getattr(objective, "multi", False) or not math.isfinite(best):
        return ""
    unit = objective.unit
    shown = f"{best:.2f} {unit}"
    if margin:
        bar = best / (1 + margin) if objective.direction == "maximize" else best * (1 + margin)
        shown = f"{best:.2f} {unit}; {bar:.2f} with {margin:.0%} allowed for noise"
        best = bar
    return _reason(objective, payload, best, shown)


def _reason(objective, payload: dict, best: float, shown: str) -> str:
    if objective.name == "goodput":
        cap = payload.get("capacity_rps")
        if cap is not None and cap < best:
            return f"capacity {cap:.2f} req/s is below the best goodput so far ({shown})"
        return ""
    if objective.name == "latency":
        base, pct = objective.metric.rsplit("_p", 1)
        if base not in ("ttft", "e2el") or base not in payload:
            return ""
        remaining = payload["planned"] - payload["finished"]
        floor = best_case(payload[base], remaining, float(pct))
        if floor > best:
            return (f"even if the other {remaining} of {payload['planned']} requests took 0 ms, its "
                    f"{objective.metric} would be {floor:.1f} ms: it cannot beat the best so far ({shown})")
        return ""
    if objective.name == "throughput":
        planned, elapsed = payload.get(PLANNED_KEYS[objective.metric]), payload.get("elapsed_s", 0.0)
        if planned is None or elapsed <= 0:
            return ""
        ceiling = planned / elapsed
        if ceiling < best:
            return (f"even if the rest finished now, {objective.metric} would be at most {ceiling:.1f}, "
                    f"below the best so far ({shown})")
    return ""


