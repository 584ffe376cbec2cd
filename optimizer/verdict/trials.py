"""Which trials a study counts: the knobs each ran with, the feasible ones best first, the budget
spent (the search's convergence is search/convergence.py's), the best value so far, the gain of one value over another, and
what the run did not have to spend.
"""

from __future__ import annotations

import optuna

from optimizer.config.flags import from_cli_args
from optimizer.record import of_trial

COMPLETE = optuna.trial.TrialState.COMPLETE
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def knobs_of(t: optuna.trial.FrozenTrial) -> dict:
    """The knobs a trial ran with: from its flags (a baseline's fixed ones included), else its params."""
    return from_cli_args(of_trial.vllm_args(t)) or t.params


def feasible(t: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in (t.constraints or {}).values())


def ranked_feasible(study: optuna.Study, maximize: bool | None = None) -> list[optuna.trial.FrozenTrial]:
    """The COMPLETE trials that met their constraints, best first (ties in trial order), each
    configuration once (not the repeats of a measured one); the direction is the study's unless
    `maximize` says it."""
    if maximize is None:
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if feasible(t) and not of_trial.is_repeat(t)]  # a repeat's value is its source's
    return sorted(done, key=lambda t: t.value, reverse=maximize)


def finished_count(study: optuna.Study) -> int:
    """Trials that count against the budget (`n_trials`): COMPLETE or PRUNED (FAIL is retried),
    except repeats of a measured configuration (told without a boot: they measure nothing new)."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if not of_trial.is_repeat(t))


def best_feasible(study, objective) -> float | None:
    """The best value among COMPLETE trials that meet their constraints (None if there is none)."""
    if getattr(objective, "multi", False):
        return None
    done = ranked_feasible(study, objective.direction == "maximize")
    return done[0].value if done else None


def gain(direction: optuna.study.StudyDirection, best: float, base: float) -> float:
    """How many times better `best` is than `base` (1.0 = same)."""
    if direction == optuna.study.StudyDirection.MAXIMIZE:
        return best / base if base else float("inf")
    return base / best if best else float("inf")


def savings(study: optuna.Study) -> dict:
    """What the run did not have to spend: boots the precheck avoided, repeats told without a boot
    (search/repeats.py), configurations the twin predicted to lose (search/prior.py), replay cut short."""
    trials = study.get_trials(deepcopy=False)
    stopped = [t for t in trials if of_trial.early_stop(t)]
    probe_saved = sum(of_trial.metrics(t).get("probe_saved_s") or 0.0 for t in trials)
    return {"boots_avoided": sum(1 for t in trials if of_trial.pruned_by_precheck(t)),
            "too_big": sum(1 for t in trials if of_trial.too_big(t)),
            "repeats": sum(1 for t in trials if of_trial.is_repeat(t)),
            "predicted": sum(1 for t in trials if of_trial.failure_kind(t) in ("predicted_to_lose", "predicted_same")
                             and not of_trial.is_repeat(t)),
            "early_stopped": len(stopped),
            "replay_saved_s": round(sum(of_trial.early_stop(t).get("saved_s", 0.0) for t in stopped)
                                    + probe_saved, 1)}
