"""Runs a study already made, by configuration: what the minimal-change step reads before it boots.

A finished trial whose knobs equal a configuration the step would measure (say the winner with
one knob at the baseline's value) is a measurement of it, and so are its confirmation re-runs;
the baseline's repeats count the same way. Only full runs count: a COMPLETE trial that met the
SLOs gives its value, one that missed them gives None (the step reads that as "putting the knob
back misses the SLOs"); a trial stopped early, failed or told as a repeat gives nothing.
"""

from __future__ import annotations

import json

import optuna

from optimizer.record import of_trial, remeasured
from optimizer.verdict.trials import COMPLETE, feasible, knobs_of


def config_key(config: dict) -> str:
    """One text per configuration (knob order does not matter)."""
    return json.dumps(sorted(config.items()))


def evidence(study: optuna.Study) -> dict[str, list[tuple[float | None, str]]]:
    """config_key -> [(value or None, where it was measured)], in trial order."""
    conf = remeasured.read_confirmation(study)
    out: dict[str, list] = {}
    for t in study.get_trials(deepcopy=False, states=(COMPLETE,)):
        if of_trial.is_repeat(t) or t.value is None:
            continue
        found = out.setdefault(config_key(knobs_of(t)), [])
        if not feasible(t):
            found.append((None, f"trial {t.number} (SLOs missed)"))
            continue
        values = conf.values(t.number) or [t.value]
        found += [(v, f"trial {t.number}" + (f" re-measure {k}" if k else "")) for k, v in enumerate(values)]
    return out
