"""The confirmation in words: each re-measured configuration's geometric mean and 95% range, the
ones not booted again and why, and the verdict (the numbers: verdict/confirmed.py).
"""

from __future__ import annotations


def range_text(ci: dict) -> str:
    """"95% range [280.10, 332.70]" (of the geometric mean), or why there is none."""
    if ci.get("low") is None:
        return "no range: no configuration was measured twice"
    return f"95% range [{ci['low']:.2f}, {ci['high']:.2f}]"


def _ratio(r: dict) -> str:
    return f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"


def verdict_phrase(record: dict) -> str:
    """Why the winner is (or is not) clear, in one clause."""
    if record.get("alone"):
        return "the only configuration re-measured (nothing else to beat)"
    if record.get("clear"):
        return "a clear winner: every other candidate measured worse beyond the noise"
    close = [f"trial {n} ({_ratio(r)} of it)" for n, r in (record.get("ratios") or {}).items()
             if r["low"] <= 1.0 <= r["high"]] or ["another candidate"]
    return "no clear winner: " + ", ".join(close) + " is within the noise of it"


def noise_text(record: dict) -> str:
    """Where the ranges' noise comes from."""
    noise = record.get("noise")
    if not noise:
        return "no configuration was measured twice: no noise to judge by"
    return (f"geometric means; the noise of one run ({noise['sd']:.1%} on a log scale) pooled over every repeated run "
            f"({noise['df']} degrees of freedom), so a configuration measured once gets a range from the others' repeats")


def confirmation_lines(record: dict, objective) -> list[str]:
    """The console's lines after a confirmation: one per candidate, best first, then the verdict."""
    out = []
    for n, ci in sorted((record.get("intervals") or {}).items(), key=lambda kv: kv[1]["mean"],
                        reverse=objective.direction == "maximize"):
        runs = f"{ci['n']} run{'s' if ci['n'] != 1 else ''}"
        out.append(f"trial {n}: {ci['mean']:.2f} {objective.unit} over {runs}, {range_text(ci)}")
    for n in record.get("disqualified") or []:
        out.append(f"trial {n}: a re-measurement failed: disqualified")
    if record.get("winner") is None:
        return out
    out.append(f"({noise_text(record)})")
    out.append(f"winner: trial {record['winner']}, {verdict_phrase(record)}")
    return out
