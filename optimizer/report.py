"""The end of a run: a table of trials, the best configuration as a deployable `vllm serve`
command and `vllm serve --config` YAML, and its gain over the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna
import yaml
from rich.console import Console
from rich.table import Table

from .progress import fmt_params
from .space import KNOBS, from_cli_args, split_flags


@dataclass(frozen=True)
class Summary:
    best: optuna.trial.FrozenTrial | None
    baseline: optuna.trial.FrozenTrial | None
    gain: float | None  # > 1 means better than the baseline, whatever the direction
    command: str | None
    yaml_path: Path | None


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


def _baseline(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("baseline") and t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL:
            return t
    return None


def summarize_study(study: optuna.Study, model: str, artifacts: Path) -> Summary:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    base = _baseline(study)
    if not complete:
        return Summary(None, base, None, None, None)
    best = study.best_trial
    args = list(best.user_attrs.get("vllm_args", []))
    g = gain(study.direction, best.value, base.value) if base and base.state == optuna.trial.TrialState.COMPLETE else None
    artifacts.mkdir(parents=True, exist_ok=True)
    path = artifacts / "best.yaml"
    path.write_text(yaml.safe_dump(serve_yaml(args), sort_keys=False))
    return Summary(best, base, g, serve_command(model, args), path)


def print_report(study: optuna.Study, model: str, artifacts: Path, objective, console: Console) -> Summary:
    table = Table(title=f"Trials of study '{study.study_name}'")
    for col in ("#", "role", "state", "parameters", objective.metric, "failure"):
        table.add_column(col)
    for t in study.get_trials(deepcopy=False):
        value = f"{t.value:.1f}" if t.value is not None else ""
        failure = t.user_attrs.get("failure_kind", "")
        params = fmt_params(from_cli_args(t.user_attrs.get("vllm_args", [])) or t.params)
        table.add_row(str(t.number), "baseline" if t.user_attrs.get("baseline") else "", t.state.name, params,
                      value, failure)
    console.print(table)
    s = summarize_study(study, model, artifacts)
    if s.best is None:
        console.print("[red]No trial completed[/]: read the failure kinds and remedies above.")
        return s
    console.print(f"[bold]Best: trial {s.best.number}[/], {objective.metric} = {s.best.value:.1f} {objective.unit}")
    if s.baseline is None or s.baseline.state != optuna.trial.TrialState.COMPLETE:
        if s.baseline is not None and s.baseline.state == optuna.trial.TrialState.PRUNED:
            console.print(f"Baseline could not be measured ({s.baseline.user_attrs.get('failure_kind')}): "
                          "no gain to report. That is itself a finding: your current configuration "
                          f"fails here. Remedy: {s.baseline.user_attrs.get('remedy')}")
        else:
            console.print("Baseline not measured yet (it failed for reasons outside the configuration "
                          "or did not run): no gain to report; re-run to measure it.")
    else:
        console.print(f"Gain over baseline (trial {s.baseline.number}, {s.baseline.value:.1f} {objective.unit}): "
                      f"{s.gain:.2f}x")
    console.print(f"Deploy with:\n  {s.command}")
    if "--load-format" in s.command and "dummy" in s.command:
        console.print("  (tuned with random weights: drop --load-format dummy to serve the real ones)")
    console.print(f"or: vllm serve {model} --config {s.yaml_path}")
    return s
