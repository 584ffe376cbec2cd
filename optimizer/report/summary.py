"""The end of a run: a table of trials, the recommended configuration (verdict/recommendation.py)
as a deployable `vllm serve` command, `vllm serve --config` YAML and Kubernetes manifests of one
replica (`k8s.yaml`; all three made by deploy/, `plan --manifests` sizes them), and its gain over the baseline.

With SLO constraints only trials that met them are candidates (Optuna's own rule); a
multi-objective (Pareto) study has no single best: its front is listed, each member
with its command, and written to `pareto_front.yaml`. The run's savings are counted:
boots the KV precheck avoided, replay time early stopping saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import optuna

from optimizer.deploy.files import write_best, write_front
from optimizer.deploy.k8s import write_manifests
from optimizer.deploy.serve import serve_command
from optimizer.record.remeasured import Confirmation
from optimizer.verdict import confirmed
from optimizer.verdict.recommendation import Recommendation, recommend
from optimizer.verdict.trials import COMPLETE, feasible, knobs_of, savings  # noqa: F401 - rep.feasible etc. for the report



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
    confirmation: Confirmation = field(default_factory=Confirmation)  # re-measurements of the top configurations (driver/confirm.py)
    recommendation: Recommendation | None = None  # what `command` and best.yaml deploy (verdict/recommendation.py)


def savings_text(sv: dict) -> str:
    """The savings in one sentence (the console's and the written report's)."""
    repeats = f"{sv['repeats']} repeat(s) of a measured configuration told without a boot; " if sv.get("repeats") else ""
    too_big = f"{sv['too_big']} by a topology no node holds; " if sv.get("too_big") else ""
    repeats += (f"{sv['predicted']} configuration(s) the twin predicted to lose or to match a measured trial, not booted; "
                if sv.get("predicted") else "")
    return (f"Saved: {sv['boots_avoided']} boot(s) avoided by the KV precheck; {too_big}{repeats}{sv['early_stopped']} "
            f"trial(s) stopped early; ~{sv['replay_saved_s']:.0f} s of replay not spent")


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
        path = write_front(artifacts, front)
        return Summary(None, base, None, None, path, front, savings=saved)
    conf = confirmed.read(study)  # one snapshot for the recommendation and the verdict shown beside it
    rec = recommend(study, conf)
    if rec is None:
        return Summary(None, base, None, None, None, infeasible_only=True, savings=saved)
    record = conf if conf.current_winner is not None else Confirmation()  # a stale one says nothing
    args = list(rec.args)
    path = write_best(artifacts, args)
    write_manifests(artifacts / "k8s.yaml", study, model, args, rec.trial, replicas=1)
    g = rec.gain["ratio"] if rec.gain else None
    return Summary(rec.trial, base, g, serve_command(model, args), path, savings=saved, confirmation=record,
                   recommendation=rec)
