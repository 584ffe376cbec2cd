"""What the study's boots cost: the start-up steps of its trials (engine/startup_log.py, stored
on each trial as `startup`) summed over the trials, and how often torch.compile found its cache.
Re-measurements and minimal-change runs keep theirs in their own result.json, not here.
"""

from __future__ import annotations

from collections import Counter

from optimizer.engine.startup_log import STEPS
from optimizer.record import of_trial

CACHE_WORDS = {"hit": "hit", "miss": "missed", "reload_failed": "failed to load"}


def booted(trials) -> list:
    """The trials whose start-up was read from their server's log."""
    return [t for t in trials if of_trial.startup(t).get("steps")]


def startup_totals(trials) -> dict | None:
    """{"boots", "seconds", "steps": step -> seconds, "cache": state -> boots} over the trials whose
    start-up was read; None when none was."""
    read = [of_trial.startup(t) for t in booted(trials)]
    if not read:
        return None
    steps = {step: round(sum(s["steps"].get(step, 0.0) for s in read), 1) for step in STEPS}
    return {"boots": len(read), "seconds": round(sum(steps.values()), 1),
            "steps": {k: v for k, v in steps.items() if v > 0},
            "cache": dict(Counter(s["compile_cache"] for s in read if s.get("compile_cache")))}


def startup_text(totals: dict) -> str:
    """One line: the boots, their seconds, the steps largest first, the compile cache."""
    parts = ", ".join(f"{step.replace('_', ' ')} {sec:.0f} s"
                      for step, sec in sorted(totals["steps"].items(), key=lambda kv: -kv[1]))
    line = f"Start-up: {totals['boots']} boot(s), {totals['seconds']:.0f} s in all ({parts})"
    if totals["cache"]:
        line += "; the compile cache " + ", ".join(f"{CACHE_WORDS.get(k, k)} {n}x" for k, n in sorted(totals["cache"].items()))
    return line
