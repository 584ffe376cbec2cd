"""The report printed at the end of a run (and by `report`): the table of trials, what the
precheck and early stop saved, the best configuration as a deployable `vllm serve` command and
`--config` YAML, and its gain over the baseline.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from rich.console import Console
from rich.table import Table

from optimizer.measure.slo import describe as describe_slos
from optimizer.report.production import CAVEAT, production_table
from optimizer.report.recommendation import attribution, gain_text
from optimizer.report.startup import startup_text, startup_totals
from optimizer.report.summary import (
    COMPLETE,
    Summary,
    feasible,
    fmt_params,
    knobs_of,
    savings_text,
    serve_command,
    summarize_study,
)


def print_report(study: optuna.Study, model: str, artifacts: Path, objective, console: Console) -> Summary:
    """Print the trials, the savings and the answer; returns the summary (best, gain, command)."""
    console.print(_trials_table(study, objective))
    s = summarize_study(study, model, artifacts)
    sv = s.savings
    console.print(savings_text(sv))
    if (boots := startup_totals(study.get_trials(deepcopy=False))) is not None:
        console.print(startup_text(boots))
    if s.front:
        _print_front(s, model, objective, console)
    elif s.best is None:
        if s.infeasible_only:
            console.print(f"[red]No trial met the SLOs[/] ({describe_slos(objective.slos)}): relax them, or widen "
                          "the space (see slo_excess on each trial for how far each missed).")
        else:
            console.print("[red]No trial completed[/]: read the failure kinds and remedies above.")
    else:
        _print_best(s, objective, console)
        _print_gain(s, objective, console)
        _print_production(study, console)
        _print_deploy(s, model, console)
    return s


def _print_production(study: optuna.Study, console: Console) -> None:
    found = production_table(study)
    if found is None:
        return
    title, rows, flags = found
    table = Table(title=title)
    for col in ("", "production", "baseline trial"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(CAVEAT + (f" {flags}" if flags else ""))


def _trials_table(study: optuna.Study, objective) -> Table:
    table = Table(title=f"Trials of study '{study.study_name}'")
    for col in ("#", "role", "state", "parameters", objective.metric, "failure"):
        table.add_column(col)
    for t in study.get_trials(deepcopy=False):
        failure = t.user_attrs.get("failure_kind", "")
        if t.user_attrs.get("precheck") == "pruned":
            failure += " (predicted)"
        role = "baseline" if t.user_attrs.get("baseline") else ""
        if "repeat_of" in t.user_attrs:
            role = f"repeat of {t.user_attrs['repeat_of']}"
        table.add_row(str(t.number), role, t.state.name,
                      fmt_params(knobs_of(t)), _value(t), failure)
    return table


def _print_front(s: Summary, model: str, objective, console: Console) -> None:
    console.print(f"[bold]Pareto front[/] ({' / '.join(objective.metric.split(','))}): {len(s.front)} trial(s), "
                  "none beats another on both")
    for t in sorted(s.front, key=lambda t: -t.values[0]):
        console.print(f"  trial {t.number}: {_value(t)} -> {serve_command(model, list(t.user_attrs.get('vllm_args', [])))}")
    console.print(f"written to {s.yaml_path}; pick the point whose latency you can live with" if s.yaml_path
                  else "[red]pareto_front.yaml not written[/]: the artifacts disk refused it")


def _print_best(s: Summary, objective, console: Console) -> None:
    rec = s.recommendation
    runs = f"mean of {len(rec.values)} runs" if len(rec.values) > 1 else "one run"
    origin = f"trial {s.best.number}" + (" with the knobs that had no effect put back" if rec.changed_from_trial else "")
    console.print(f"[bold]Recommended ({rec.source}): {origin}[/], {objective.metric} = {rec.value:.2f} "
                  f"{objective.unit} ({runs})" + (f"; SLOs {describe_slos(objective.slos)} hold" if objective.slos else ""))
    ci = (s.confirmation.get("intervals") or {}).get(str(s.best.number))
    if ci and ci.get("low") is not None:
        verdict = "a clear winner" if s.confirmation.get("clear") else \
            "[yellow]no clear winner[/]: its interval overlaps another configuration's"
        console.print(f"  trial {s.best.number} re-measured: mean {ci['mean']:.2f} {objective.unit} over {ci['n']} "
                      f"runs, 95% CI [{ci['low']:.2f}, {ci['high']:.2f}]; {verdict}")
    if rec.rows:
        table = Table(title="What mattered (each knob put back to the baseline's value, alone)")
        for col in ("knob", "baseline", "winner", "put back: x the winner, 95% CI", "verdict"):
            table.add_column(col)
        for row in attribution(rec):
            table.add_row(*row)
        console.print(table)


def _print_gain(s: Summary, objective, console: Console) -> None:
    if s.baseline is None or s.baseline.state != COMPLETE:
        if s.baseline is not None and s.baseline.state == optuna.trial.TrialState.PRUNED:
            console.print(f"Baseline could not be measured ({s.baseline.user_attrs.get('failure_kind')}): "
                          "no gain to report. That is itself a finding: your current configuration "
                          f"fails here. Remedy: {s.baseline.user_attrs.get('remedy')}")
        else:
            console.print("Baseline not measured yet (it failed for reasons outside the configuration "
                          "or did not run): no gain to report; re-run to measure it.")
    elif s.gain is None:
        console.print(f"Baseline (trial {s.baseline.number}) scored {s.baseline.value:.2f} {objective.unit}: "
                      "no ratio to report (it carried no load within the SLOs).")
    else:
        missed = "" if feasible(s.baseline) else " [red](the baseline misses the SLOs)[/]"
        g = s.recommendation.gain
        runs = g["runs"][1] if g else 1
        console.print(f"Gain over baseline (trial {s.baseline.number}, {s.baseline.value:.2f} {objective.unit}, "
                      f"{runs} run{'s' if runs != 1 else ''}): {gain_text(g)}{missed}")


def _print_deploy(s: Summary, model: str, console: Console) -> None:
    console.print(f"Deploy with:\n  {s.command}")
    if "--load-format" in s.command and "dummy" in s.command:
        console.print("  (tuned with random weights: drop --load-format dummy to serve the real ones)")
    console.print(f"or: vllm serve {model} --config {s.yaml_path}" if s.yaml_path
                  else "[red]best.yaml not written[/]: the artifacts disk refused it (free space, then re-run to print it)")


def _value(t: optuna.trial.FrozenTrial) -> str:
    if t.values is None:
        return ""
    text = " / ".join(f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}" for v in t.values)
    return text + ("" if feasible(t) else " (SLOs missed)")
