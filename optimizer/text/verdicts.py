"""What a study says, in words: the confirmation (each
re-measured configuration's geometric mean and 95% range, the verdict), the screening phase (each
knob moved alone, searched or held), a reversion's measured effect, the "What mattered" rows, and
the gain with its interval. The numbers come from verdict/.
"""

from __future__ import annotations

from optimizer.measure.reversion import TOLERANCE
from optimizer.text.knobs import shown
from optimizer.verdict.recommendation import Recommendation


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


def range_text(ci: dict) -> str:
    """"95% range [280.10, 332.70]" (of the geometric mean), or why there is none."""
    if ci.get("low") is None:
        return "no range: no configuration was measured twice"
    return f"95% range [{ci['low']:.2f}, {ci['high']:.2f}]"


def _ratio(r: dict) -> str:
    return f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"


def verdict_phrase(record) -> str:
    """Why the confirmation's winner (record/remeasured.Confirmation) is (or is not) clear, in one clause."""
    if record.alone:
        return "the only configuration re-measured (nothing else to beat)"
    if record.simpler:
        s = record.simpler
        return (f"the simpler choice: within the noise of trial {s['over']}, the best geometric mean "
                f"({_ratio(s['ratio'])} of it), it changes {s['knobs']} knob(s) from the baseline against "
                f"{s['over_knobs']}")
    if record.clear:
        return "a clear winner: every other candidate measured worse beyond the noise"
    close = [f"trial {n} ({_ratio(r)} of it)" for n, r in record.ratios.items()
             if r["low"] <= 1.0 <= r["high"]] or ["another candidate"]
    return "no clear winner: " + ", ".join(close) + " is within the noise of it"


def noise_text(record) -> str:
    """Where the ranges' noise comes from."""
    noise = record.noise
    if not noise:
        return "no configuration was measured twice: no noise to judge by"
    return (f"geometric means; the noise of one run ({noise['sd']:.1%} on a log scale) pooled over every repeated run "
            f"({noise['df']} degrees of freedom), so a configuration measured once gets a range from the others' repeats")


def confirmation_lines(record, objective) -> list[str]:
    """The console's lines after a confirmation (record/remeasured.Confirmation): one per candidate,
    best first, then the verdict."""
    out = []
    for n, ci in sorted(record.intervals.items(), key=lambda kv: kv[1]["mean"],
                        reverse=objective.direction == "maximize"):
        runs = f"{ci['n']} run{'s' if ci['n'] != 1 else ''}"
        out.append(f"trial {n}: {ci['mean']:.2f} {objective.unit} over {runs}, {range_text(ci)}")
    for n in record.disqualified:
        out.append(f"trial {n}: a re-measurement failed: disqualified")
    if record.winner is None:
        return out
    out.append(f"({noise_text(record)})")
    lead = "winner" if record.clear else "recommended" if record.simpler else "the best geometric mean"
    out.append(f"{lead}: trial {record.winner}, {verdict_phrase(record)}")
    return out


def screening_lines(found: dict, baseline: dict) -> list[str]:
    """One line per screened knob, then the knobs searched from now on."""
    out = []
    for knob, row in found.items():
        moved = f"{knob} {shown(baseline.get(knob))} -> {shown(row['to'])} (trial {row['trial']})"
        out.append(f"{moved}: {_effect(row)}: " + ("searched" if row["searched"] else
                                                      f"held at {shown(baseline.get(knob))}"))
    searched = [k for k, r in found.items() if r["searched"]]
    if len(searched) == len(found):
        out.append("the sampler now moves every knob")
    else:
        out.append("the sampler now moves " + (", ".join(searched) if searched else "no screened knob")
                   + " (and any knob the baseline leaves to vLLM); the others stay at the baseline's values")
    return out


def _effect(row: dict) -> str:
    if row["ratio"] is None:
        return row["why"]
    where = {"beyond": f"beyond the {TOLERANCE:.0%} single runs move", "within": f"within {TOLERANCE:.0%}"}
    return f"{row['ratio']:.2f}x the baseline's value, " + where.get(row["why"], row["why"])
