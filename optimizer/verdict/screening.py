"""What the screening phase found: for each knob moved alone from the baseline (the moves are
search/screening.py's), how far the objective moved, and whether the search goes on to move it
(search/screening.py and driver/launch.py ask here).

A knob is searched when its move changed the objective by more than the tolerance of the
reversion rule (measure/reversion.py: 15%, about what single runs move here) either way, when
its run was stopped early (it could not come within the early-stop margin of the baseline it
moved from: driver/launch.py judges screening trials against it), or when it missed the SLOs
(the knob moves the constraint). It is held at the baseline's value when its
run measured within the tolerance, or when the moved configuration could not run at all (the
KV cache did not fit, the server refused it): the sampler is not sent where the only evidence is
a refusal. When the baseline missed the SLOs or has no value, every knob is searched: it is not
a configuration to stay near. Once the sampler has nothing new to try among the knobs it moves,
every knob is released (search/screening.py): the rest of the budget searches them all. This is a choice of which knobs
to search, not a verdict with an interval: one run each side cannot give one, and a knob held
wrongly costs only a missed gain, which the minimal-change step never claims.
"""

from __future__ import annotations

import math

import optuna

from optimizer.measure.reversion import TOLERANCE
from optimizer.record import of_study, of_trial
from optimizer.verdict.trials import COMPLETE, feasible


def shows_effect(ratio: float | None, stopped_early: bool = False, missed_slos: bool = False) -> bool:
    """The screening rule (module docstring); `ratio` is moved / baseline (None: no value)."""
    if stopped_early or missed_slos:
        return True
    return ratio is not None and abs(math.log(ratio)) > math.log(1 + TOLERANCE)


def screening(study: optuna.Study) -> dict | None:
    """knob -> {"trial", "to", "ratio", "searched", "why"}; None until every screening trial finished
    (or when the study has none)."""
    trials = study.get_trials(deepcopy=False)
    screens = [t for t in trials if of_trial.is_screen(t)]
    if not screens or any(not t.state.is_finished() for t in screens):
        return None
    base = next((t for t in trials if of_trial.is_baseline(t) and t.state == COMPLETE and feasible(t)), None)
    return {of_trial.screen(t): _row(t, base, study) for t in screens}


def _row(t: optuna.trial.FrozenTrial, base, study: optuna.Study) -> dict:
    source = study.trials[of_trial.repeat_of(t)] if of_trial.is_repeat(t) else t
    row = {"trial": t.number, "to": t.params.get(of_trial.screen(t)), "ratio": None}
    kind = of_trial.failure_kind(source)
    if base is None or not base.value:
        return {**row, "searched": True, "why": "the baseline missed the SLOs or has no value: nothing to stay near"}
    if source.state == COMPLETE and source.value:
        row["ratio"] = source.value / base.value
        if not feasible(source):
            return {**row, "searched": True, "why": "moved alone, it missed the SLOs"}
        searched = shows_effect(row["ratio"])
        return {**row, "searched": searched, "why": "beyond" if searched else "within"}
    if kind == "early_stopped":
        return {**row, "searched": True, "why": "stopped early: worse than the baseline beyond the margin"}
    if kind == "predicted_to_lose":
        return {**row, "searched": False, "why": "predicted to lose beyond the twin's band: not booted"}
    if kind == "predicted_same":
        return {**row, "searched": False, "why": "the twin schedules it as the baseline: not booted"}
    return {**row, "searched": False, "why": f"moved alone, it could not run ({kind or source.state.name})"}


def held(study: optuna.Study) -> set[str]:
    """The knobs the sampler leaves at the baseline's value (none until screening is done, and
    none once they are released)."""
    if of_study.screening_released(study) is not None:
        return set()
    found = screening(study) or {}
    return {knob for knob, row in found.items() if not row["searched"]}
