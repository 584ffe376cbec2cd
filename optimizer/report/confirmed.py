"""What a stored confirmation says: the top configurations it re-measured, whether it still
describes the study, and its winner. (driver/confirm.py does the re-measuring.)
"""

from __future__ import annotations

import optuna

ATTR = "confirmation"


def candidates(study: optuna.Study, top: int) -> list[optuna.trial.FrozenTrial]:
    """The `top` best feasible COMPLETE trials, one per configuration, best first."""
    if top <= 0 or len(study.directions) > 1:
        return []
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if all(c <= 0 for c in (t.constraints or {}).values())]
    done.sort(key=lambda t: -t.value if maximize else t.value)
    out, seen = [], set()
    for t in done:
        key = tuple(t.user_attrs.get("vllm_args") or sorted(t.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:top]


def settled(study: optuna.Study, top: int, repeats: int) -> bool:
    """Confirmation is done for the study's current top configurations (new trials may have
    changed them since, or the settings may differ)."""
    record = study.user_attrs.get(ATTR) or {}
    return ("winner" in record and record.get("repeats") == repeats and record.get("top") == top
            and record.get("candidates") == [str(t.number) for t in candidates(study, top)])


def current_winner(study: optuna.Study) -> int | None:
    """The confirmed winner, if the confirmation still describes the study's top configurations."""
    record = study.user_attrs.get(ATTR) or {}
    if record.get("winner") is None or not settled(study, record.get("top", 0), record.get("repeats", 0)):
        return None
    return record["winner"]


def baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's baseline trial once it finished without an infrastructure failure (COMPLETE or PRUNED)."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("baseline") and t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL:
            return t
    return None
