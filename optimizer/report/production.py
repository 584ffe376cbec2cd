"""Production beside the baseline: the latencies the watched vLLM servers measured in the window a
generation was tuned on (the daemon's `production` study attribute), next to the baseline
trial's own, with the flags the production servers expose. Different machines and different
load: a reference for the order of magnitude, not a ratio to read a gain from.
"""

from __future__ import annotations

from optimizer.verdict.confirmed import baseline_trial
from optimizer.record import of_generation, of_trial

CAVEAT = ("Production's numbers come from the watched servers' own histograms (within a bucket's width), on "
          "other machines under other load: a reference, not a measurement to compare ratios with.")
ROWS = (("TTFT p50", "ttft_p50_ms", "ttft_ms_p50"), ("TTFT p95", "ttft_p95_ms", "ttft_ms_p95"),
        ("ITL p50", "itl_p50_ms", "itl_ms_p50"), ("ITL p95", "itl_p95_ms", "itl_ms_p95"),
        ("E2E p50", "e2e_p50_ms", "e2el_ms_p50"), ("E2E p95", "e2e_p95_ms", "e2el_ms_p95"))


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


def production_table(study) -> tuple[str, list[list[str]], str] | None:
    """(a one-line title, rows [quantity, production, baseline trial], the flags line), or None
    when the study was not tuned on live traffic."""
    prod = of_generation.production(study)
    if not isinstance(prod, dict) or not prod.get("latencies"):
        return None
    base = baseline_trial(study)
    metrics = of_trial.metrics(base) if base is not None else {}
    rows = [[label, _ms(prod["latencies"].get(key)), _ms(metrics.get(mine))] for label, key, mine in ROWS
            if prod["latencies"].get(key) is not None]
    title = (f"Production ({prod.get('requests', 0):.0f} requests at {prod.get('rate', 0):.2f} req/s) beside the "
             f"baseline trial" + (f" {base.number}" if base is not None else ""))
    flags = ", ".join(f"{k} {v}" for k, v in (prod.get("flags") or {}).items())
    return title, rows, (f"Production flags seen in vllm:cache_config_info: {flags}." if flags else "")
