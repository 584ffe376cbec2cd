"""The what-if rows as `plan` prints them: predicted, with the band.

Every row ends `predicted (+-x%)`: x is the band of its throughput as the calibration applies to
that row (whatif/calibration.py: on the calibrated device and estimator, elsewhere widened or
not corrected), so the capacity lies in [v / (1 + x), v x (1 + x)]. Replicas are counted from the
central value. The header gives the bands of every metric on the calibrated device.
"""

from __future__ import annotations

from optimizer.whatif.calibration import Calibration
from optimizer.whatif.fleet_rows import Row


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.3g}"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def describe(rows: list[Row], cal: Calibration, header: str, slos_text: str) -> list[str]:
    band = {m: f"{cal.percent(m):.0%}" for m in ("ttft_s", "tpot_s", "throughput")}
    lines = [header,
             f"  calibration: {cal.basis}" + ("" if any(cal.points.values()) else
                                               " (uncorrected: the bands are the estimate's own error on "
                                               "published measurements)"),
             f"  bands{' on ' + cal.device + ' by the ' + cal.by if cal.device else ''}: TTFT +-{band['ttft_s']}, "
             f"TPOT +-{band['tpot_s']}, throughput +-{band['throughput']} (a value v of band x lies in "
             "[v / (1 + x), v x (1 + x)]; each row's throughput band ends it)",
             "  capacity: " + (f"the highest predicted throughput whose mean TTFT and TPOT keep {slos_text} "
                               "(means against percentile SLOs: check the tail by measuring)" if slos_text else
                               "at the largest load (no SLOs given: latency is not promised)")]
    any_price = any(r.cost_per_h is not None for r in rows)
    head = (f"  {'device':<9} {'TP':>3} {'replicas':>8} {'devices':>7} " + (f"{'$/h':>8} " if any_price else "")
            + f"{'req/s each':>10} {'in flight':>9} {'TTFT ms':>8} {'TPOT ms':>8} {'KV tokens':>10}  by, band")
    lines.append(head)
    for r in rows:
        if not r.usable:
            lines.append(f"  {r.device.name:<9} {r.tp:>3} {'-':>8} {'-':>7} " + (f"{'-':>8} " if any_price else "")
                         + f"{r.why}")
            continue
        cost = (f"{r.cost_per_h:>8,.2f} " if r.cost_per_h is not None else f"{'-':>8} ") if any_price else ""
        lines.append(f"  {r.device.name:<9} {r.tp:>3} {r.replicas:>8} {r.devices:>7} {cost}"
                     f"{_rate(r.requests_per_s):>10} {r.concurrency:>9} {_ms(r.ttft_s):>8} {_ms(r.tpot_s):>8} "
                     f"{r.kv_tokens:>10,}  {r.by}, predicted (+-{r.band:.0%})")
    for note in dict.fromkeys(r.note for r in rows if r.note):
        lines.append(f"  roofline, because {note}")
    lines.append("  every row above is predicted, not measured")
    return lines
