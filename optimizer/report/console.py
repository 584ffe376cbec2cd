"""The report printed at the end of a run (and by `report`): the table of trials, what the
precheck and early stop saved, the best configuration as a deployable `vllm serve` command and
`--config` YAML, and its gain over the baseline.

Its tables wrap and never cut a cell to an ellipsis; knob names and values are never broken,
at 80 columns (output that is not a terminal) too: rich narrows the other columns instead.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from rich.console import Console
from rich.table import Table

from optimizer.fleet import topologies
from optimizer.measure.slo import describe as describe_slos
from optimizer.record import of_trial
from optimizer.report.production import CAVEAT, production_table
from optimizer.text.verdicts import attribution, gain_text, range_text, verdict_phrase
from optimizer.report.startup import startup_text, startup_totals
from optimizer.deploy.serve import serve_command
from optimizer.report.summary import Summary, savings_text, summarize_study
from optimizer.text.knobs import fmt_params
from optimizer.verdict.trials import COMPLETE, feasible, knobs_of


def print_report(study: optuna.Study, model: str, artifacts: Path, objective, console: Console) -> Summary:
    """Print the trials, the savings and the answer; returns the summary (best, gain, command)."""
    console.print(_trials_table(study, objective))
    s = summarize_study(study, model, artifacts)
    sv = s.savings
    console.print(savings_text(sv))
    if (boots := startup_totals(study.get_trials(deepcopy=False))) is not None:
        console.print(startup_text(boots))
    if fleet := topologies.rows(study.get_trials(deepcopy=False), objective):
        console.print(_table(f"{topologies.TITLE} ({objective.terms.strip() or 'no peak'})", topologies.HEADERS, fleet,
                             whole=(0,)))
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
    console.print(_table(title, ("", "production", "baseline trial"), rows))
    console.print(CAVEAT + (f" {flags}" if flags else ""))


def _trials_table(study: optuna.Study, objective) -> Table:
    """One row per trial, one knob per line; the value, or the failure kind of a trial that has none."""
    rows = [_trial_row(t) for t in study.get_trials(deepcopy=False)]
    headers = ("#", "role", "state", "parameters", f"{objective.metric.replace(',', ', ')} or failure")
    return _table(f"Trials of study '{study.study_name}'", headers, rows, whole=(3,))


def _trial_row(t: optuna.trial.FrozenTrial) -> list[str]:
    failure = of_trial.failure_kind(t) + (" (predicted)" if of_trial.pruned_by_precheck(t) else "")
    role = f"repeat of {of_trial.repeat_of(t)}" if of_trial.is_repeat(t) else "baseline" if of_trial.is_baseline(t) else ""
    knobs = "\n".join(fmt_params({k: v}) for k, v in knobs_of(t).items()) or fmt_params({})
    return [str(t.number), role, t.state.name, knobs, " ".join(x for x in (_value(t), failure.strip()) if x)]


def _table(title: str, headers: tuple[str, ...], rows: list, whole: tuple[int, ...] = ()) -> Table:
    """Cells wrap at spaces and fold a word longer than their column, never end in an ellipsis. The
    `whole` columns (knob names, values) are as wide as their longest word: rich narrows the others."""
    table = Table(title=title)
    for i, header in enumerate(headers):
        words = [len(word) for cell in (header, *(row[i] for row in rows)) for word in str(cell).split()]
        table.add_column(header, overflow="fold", width=max(words, default=1) if i in whole else None)
    for row in rows:
        table.add_row(*row)
    return table


def _print_front(s: Summary, model: str, objective, console: Console) -> None:
    console.print(f"[bold]Pareto front[/] ({' / '.join(objective.metric.split(','))}): {len(s.front)} trial(s), "
                  "none beats another on both")
    for t in sorted(s.front, key=lambda t: -t.values[0]):
        console.print(f"  trial {t.number}: {_value(t)} -> {serve_command(model, of_trial.vllm_args(t))}")
    console.print(f"written to {s.yaml_path}; pick the point whose latency you can live with" if s.yaml_path
                  else "[red]pareto_front.yaml not written[/]: the artifacts disk refused it")


def _print_best(s: Summary, objective, console: Console) -> None:
    rec = s.recommendation
    runs = f"mean of {len(rec.values)} runs" if len(rec.values) > 1 else "one run"
    origin = f"trial {s.best.number}" + (" with the knobs that had no effect put back" if rec.changed_from_trial else "")
    console.print(f"[bold]Recommended ({rec.source}): {origin}[/], {objective.metric} = {rec.value:.2f} "
                  f"{objective.unit} ({runs})" + (f"; SLOs {describe_slos(objective.slos)} hold" if objective.slos else ""))
    ci = s.confirmation.interval(s.best.number)
    if ci and ci.get("low") is not None:
        console.print(f"  trial {s.best.number} re-measured: {ci['mean']:.2f} {objective.unit} over {ci['n']} "
                      f"run(s), {range_text(ci)}; {verdict_phrase(s.confirmation)}")
    if rec.rows:
        rows = attribution(rec)
        console.print(_table("What mattered (each knob put back to the baseline's value, alone)",
                             ("knob", "baseline", "winner", "put back: x the winner, 95% CI", "verdict"),
                             [list(row[:5]) for row in rows], whole=(0, 1, 2, 4)))
        for row in rows:  # below the table: run names are long, and a sixth column folds them at 80 columns
            if row[5]:
                console.print(f"  {row[0]} rests on: {row[5]}")


def _print_gain(s: Summary, objective, console: Console) -> None:
    if s.baseline is None or s.baseline.state != COMPLETE:
        if s.baseline is not None and s.baseline.state == optuna.trial.TrialState.PRUNED:
            console.print(f"Baseline could not be measured ({of_trial.failure_kind(s.baseline)}): "
                          "no gain to report. That is itself a finding: your current configuration "
                          f"fails here. Remedy: {of_trial.remedy(s.baseline)}")
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
        value = (g or {}).get("baseline", s.baseline.value)  # the geometric mean of its runs
        console.print(f"Gain over baseline (trial {s.baseline.number}, {value:.2f} {objective.unit} over "
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
