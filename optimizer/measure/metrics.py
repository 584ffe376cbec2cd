"""Summary metrics of one replay: what a user of the server would feel.

Latencies are in milliseconds; throughputs divide by the measured window (first send ->
last completion), warm-up excluded. TPOT = (E2E - TTFT) / (output - 1). ITL is the gap
between chunks, split evenly when a chunk carries several tokens (usage says how many).
"""

from __future__ import annotations

import math
from statistics import fmean

from optimizer.measure.replay import ReplayResult

PERCENTILES = (50, 90, 95, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _dist(name: str, values: list[float]) -> dict[str, float]:
    out = {f"{name}_mean": fmean(values) if values else math.nan}
    out.update({f"{name}_p{q}": percentile(values, q) for q in PERCENTILES})
    return out


def _itl(chunk_s: tuple[float, ...], output_tokens: int) -> list[float]:
    """Per-token gaps in ms: a gap that delivered k tokens counts as k gaps of 1/k its length."""
    gaps = [b - a for a, b in zip(chunk_s, chunk_s[1:])]
    tokens = max(output_tokens - 1, len(gaps))
    out = []
    for i, gap in enumerate(gaps):
        k = tokens // len(gaps) + (1 if i < tokens % len(gaps) else 0)
        out += [gap * 1000 / k] * k
    return out


def summarize(result: ReplayResult) -> dict[str, float]:
    """The trial's headline metrics from its request records."""
    ok = [r for r in result.records if r.ok]
    ttft = [(r.first_chunk_s - r.sent_s) * 1000 for r in ok]
    e2el = [(r.end_s - r.sent_s) * 1000 for r in ok]
    tpot, itl = [], []
    for r in ok:
        if r.output_tokens > 1:
            tpot.append((r.end_s - r.first_chunk_s) * 1000 / (r.output_tokens - 1))
        itl += _itl(r.chunk_s, r.output_tokens)
    window = result.window_s
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    lag = [max(0.0, r.sent_s - r.intended_s) * 1000 for r in result.records]
    n = len(result.records)
    metrics = {
        "requests": float(n),
        "completed": float(len(ok)),
        "error_rate": (n - len(ok)) / n if n else 0.0,
        "duration_s": window,
        "request_throughput": len(ok) / window,
        "output_throughput": out_tokens / window,
        "total_token_throughput": (out_tokens + in_tokens) / window,
        "output_tokens": float(out_tokens),
        "short_outputs": float(sum(1 for r in ok if r.output_tokens < r.expected_output_tokens)),
        "schedule_lag_p50_ms": percentile(lag, 50),
        "schedule_lag_p99_ms": percentile(lag, 99),
    }
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2el_ms", e2el)):
        metrics.update(_dist(name, values))
    return metrics
