"""The recommendation in words: a knob's value as tables show it, a reversion's measured effect, the
"What mattered" rows, and the gain with its interval (the numbers: verdict/recommendation.py).
"""

from __future__ import annotations

from optimizer.verdict.recommendation import Recommendation


def shown(value) -> str:
    """A knob's value as a table shows it (None: vLLM's default)."""
    return "(vLLM default)" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def effect_text(row: dict) -> str:
    """"1.03x [0.80, 1.32] over 1 run" (reverted / winner), or why there is no figure."""
    e = row.get("effect")
    runs = len(row.get("values") or [])
    if row.get("failed"):
        return "the run failed" + (f" after {runs} good run(s)" if runs else "")
    if not e:
        return "not measured"
    return f"{e['ratio']:.2f}x [{e['low']:.2f}, {e['high']:.2f}] over {runs} run{'s' if runs != 1 else ''}"


def rests_on(row: dict) -> str:
    """The runs a row's verdict rests on: "trial 3, minimal/config-1/run-0" ("" when not recorded)."""
    return ", ".join(row.get("runs_from") or [])


def attribution(rec: Recommendation) -> list[tuple[str, str, str, str, str, str]]:
    """What mattered, one row per knob the winner changed: knob, baseline, winner, the effect of putting
    it back (reverted / winner, 95% CI), verdict (and why, when it needs saying), and the runs it rests
    on (search trials and re-measurements that already had those flags, or the step's own runs)."""
    out = []
    for row in rec.rows:
        verdict = row["verdict"] + (f" ({row['note']})" if row.get("note") and row["verdict"] != "reverted" else "")
        back = row["reverted_to"]
        baseline = shown(row["baseline"]) + ("" if back == row["baseline"] else f" (fits: {shown(back)})")
        out.append((row["knob"], baseline, shown(row["winner"]), effect_text(row), verdict, rests_on(row)))
    if rec.combined:
        c = rec.combined
        out.append(("all reverted together", "", "", effect_text(c), c["verdict"] + (f" ({c['note']})" if c.get("note") else ""),
                    rests_on(c)))
    return out


def gain_text(gain: dict | None) -> str:
    """"4.29x (95% CI 3.10-5.94x)", "no measurable gain: 1.05x (95% CI 0.88-1.25x)", or the point alone."""
    if not gain:
        return "no gain to report"
    if gain.get("low") is None:
        return f"{gain['ratio']:.2f}x (one run each side: no interval)"
    ci = f"{gain['ratio']:.2f}x (95% CI {gain['low']:.2f}-{gain['high']:.2f}x)"
    return ci if gain["low"] > 1 else f"no measurable gain: {ci}"
