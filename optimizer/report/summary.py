"""The end of a run: a table of trials, the recommended configuration (report/recommendation.py)
as a deployable `vllm serve` command and `vllm serve --config` YAML, and its gain over the baseline.

With SLO constraints only trials that met them are candidates (Optuna's own rule); a
multi-objective (Pareto) study has no single best: its front is listed, each member
with its command, and written to `pareto_front.yaml`. The run's savings are counted:
boots the KV precheck avoided, replay time early stopping saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml

from optimizer.config.flags import from_cli_args, split_flags
from optimizer.config.space import KNOBS
from optimizer.report import confirmed
from optimizer.report.recommendation import Recommendation, recommend

COMPLETE = optuna.trial.TrialState.COMPLETE


@dataclass(frozen=True)
class Summary:
    best: optuna.trial.FrozenTrial | None
    baseline: optuna.trial.FrozenTrial | None
    gain: float | None  # > 1 means better than the baseline, whatever the direction
    command: str | None
    yaml_path: Path | None
    front: tuple[optuna.trial.FrozenTrial, ...] = ()  # multi-objective studies
    infeasible_only: bool = False  # trials completed, none met the SLO constraints
    savings: dict = field(default_factory=dict)
    confirmation: dict = field(default_factory=dict)  # re-measurements of the top configurations (driver/confirm.py)
    recommendation: Recommendation | None = None  # what `command` and best.yaml deploy (report/recommendation.py)


def knobs_of(t: optuna.trial.FrozenTrial) -> dict:
    """The knobs a trial ran with: from its flags (a baseline's fixed ones included), else its params."""
    return from_cli_args(list(t.user_attrs.get("vllm_args", []))) or t.params


def serve_command(model: str, args: list[str]) -> str:
    """The `vllm serve` command for a trial's flags."""
    return " ".join(["vllm", "serve", model, *args])


def serve_yaml(args: list[str]) -> dict:
    """`vllm serve --config` takes long-form flag names as keys."""
    out = {}
    for key, value in split_flags(args):
        out[key] = from_cli_args([f"--{key}", value])[key] if key in KNOBS and value is not True else value
    return out


def gain(direction: optuna.study.StudyDirection, best: float, base: float) -> float:
    """How many times better `best` is than `base` (1.0 = same)."""
    if direction == optuna.study.StudyDirection.MAXIMIZE:
        return best / base if base else float("inf")
    return base / best if best else float("inf")


def savings(study: optuna.Study) -> dict:
    """What the run did not have to spend: boots the precheck avoided, repeats told without a boot
    (driver/launch.py), replay cut short."""
    trials = study.get_trials(deepcopy=False)
    stopped = [t for t in trials if t.user_attrs.get("early_stop")]
    probe_saved = sum((t.user_attrs.get("metrics") or {}).get("probe_saved_s") or 0.0 for t in trials)
    return {"boots_avoided": sum(1 for t in trials if t.user_attrs.get("precheck") == "pruned"),
            "repeats": sum(1 for t in trials if "repeat_of" in t.user_attrs),
            "early_stopped": len(stopped),
            "replay_saved_s": round(sum(t.user_attrs["early_stop"].get("saved_s", 0.0) for t in stopped)
                                    + probe_saved, 1)}


def savings_text(sv: dict) -> str:
    """The savings in one sentence (the console's and the written report's)."""
    repeats = f"{sv['repeats']} repeat(s) of a measured configuration told without a boot; " if sv.get("repeats") else ""
    return (f"Saved: {sv['boots_avoided']} boot(s) avoided by the KV precheck; {repeats}{sv['early_stopped']} "
            f"trial(s) stopped early; ~{sv['replay_saved_s']:.0f} s of replay not spent")


def feasible(t: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in (t.constraints or {}).values())


def ranked_feasible(study: optuna.Study, maximize: bool | None = None) -> list[optuna.trial.FrozenTrial]:
    """The COMPLETE trials that met their constraints, best first (ties in trial order), each
    configuration once (not the repeats of a measured one); the direction is the study's unless
    `maximize` says it."""
    if maximize is None:
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if feasible(t) and "repeat_of" not in t.user_attrs]  # a repeat's value is its source's
    return sorted(done, key=lambda t: t.value, reverse=maximize)


def summarize_study(study: optuna.Study, model: str, artifacts: Path) -> Summary:
    complete = study.get_trials(deepcopy=False, states=(COMPLETE,))
    base = confirmed.baseline_trial(study)
    saved = savings(study)
    if not complete:
        return Summary(None, base, None, None, None, savings=saved)
    if len(study.directions) > 1:
        front = tuple(t for t in study.best_trials if feasible(t))
        if not front:
            return Summary(None, base, None, None, None, infeasible_only=True, savings=saved)
        path = _write(artifacts / "pareto_front.yaml",
                      [{"trial": t.number, "values": list(t.values),
                        "config": serve_yaml(list(t.user_attrs.get("vllm_args", [])))} for t in front])
        return Summary(None, base, None, None, path, front, savings=saved)
    rec = recommend(study)
    if rec is None:
        return Summary(None, base, None, None, None, infeasible_only=True, savings=saved)
    winner = confirmed.current_winner(study)
    record = (study.user_attrs.get("confirmation") or {}) if winner is not None else {}  # a stale one says nothing
    args = list(rec.args)
    path = _write(artifacts / "best.yaml", serve_yaml(args))
    g = rec.gain["ratio"] if rec.gain else None
    return Summary(rec.trial, base, g, serve_command(model, args), path, savings=saved, confirmation=record,
                   recommendation=rec)


def _write(path: Path, data) -> Path | None:
    """Write a YAML artifact; None when the disk refuses it (the report says so, the study is fine)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    except OSError:
        return None
    return path


# The search is over when the sampler proposes this many configurations in a row that were
# already measured: it has converged (on the measured landscape, bench/search_efficiency.py,
# stopping there found what searching on found, after a median 20 of 48 boots).
CONVERGED_AFTER = 8


def finished_count(study: optuna.Study) -> int:
    """Trials that count against the budget (`n_trials`): COMPLETE or PRUNED (FAIL is retried),
    except repeats of a measured configuration (told without a boot: they measure nothing new)."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if "repeat_of" not in t.user_attrs)


def repeat_streak(study: optuna.Study, n_trials: int | None = None) -> int:
    """How many of the last finished trials, in a row, were repeats. With `n_trials`, only repeats
    told under a budget at least that large count (a repeat stored without one counts under none):
    raising `n_trials` after the search converged starts a new streak, so the search goes on."""
    streak = 0
    for t in sorted(study.get_trials(deepcopy=False, states=FINISHED), key=lambda t: -t.number):
        if "repeat_of" not in t.user_attrs or (n_trials is not None and t.user_attrs.get("budget", 0) < n_trials):
            break
        streak += 1
    return streak


def converged(study: optuna.Study, n_trials: int) -> bool:
    """The sampler has converged: CONVERGED_AFTER repeats in a row under this budget."""
    return repeat_streak(study, n_trials) >= CONVERGED_AFTER


def search_over(study: optuna.Study, n_trials: int) -> bool:
    """The budget is spent, or the sampler has converged."""
    return finished_count(study) >= n_trials or converged(study, n_trials)


def best_feasible(study, objective) -> float | None:
    """The best value among COMPLETE trials that meet their constraints (None if there is none)."""
    if getattr(objective, "multi", False):
        return None
    done = ranked_feasible(study, objective.direction == "maximize")
    return done[0].value if done else None


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "(vLLM defaults)"


FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
