"""The written report of a study, for people who were not watching the console:

    out_dir/report.md, report.html   1. headline: the recommendation (verdict/recommendation.py) vs the
                                        baseline and the gain, with a 95% interval when both were
                                        re-measured (driver/confirm.py); what mattered (driver/minimal.py)
                                     2. deploy: the `vllm serve` command and `--config best.yaml`
                                        (a multi-objective study: its Pareto front, pareto_front.yaml)
                                     3. the top configurations, speculation, outputs checked,
                                        the fleet   4. pictures
                                     5. failures, cause and remedy (report/diagnosis.py)   6. savings
    out_dir/best.yaml                report.serve_yaml of the recommendation's flags
    out_dir/<picture>.png, .html     each picture static (matplotlib) and interactive (plotly):
                                     `tradeoff`, `importance`, `ttft`, `startup` (drawn by report/pictures.py)
    out_dir/plotly.min.js            the plotting library, referenced by the interactive pictures

Offline on purpose: the interactive pictures use plotly's "directory" mode, one copy of the
library (~4.6 MB) beside them instead of a CDN (users may be offline) or a copy inside each
file (three copies). The folder is the unit: report.html links its pictures by name.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from optimizer.atomic_file import write_atomic
from optimizer.config.flags import from_cli_args
from optimizer.fleet import topologies
from optimizer.measure.slo import describe as describe_slos
from optimizer.record import of_trial, remeasured
from optimizer.report import outputs_checked, speculation
from optimizer.report import summary as rep
from optimizer.report.pictures import DRAWINGS, finite, save
from optimizer.report.production import CAVEAT, production_table
from optimizer.text.verdicts import attribution, gain_text, noise_text, range_text, verdict_phrase
from optimizer.text.knobs import fmt_params

COMPLETE = rep.COMPLETE
TOP = 5
EVIDENCE_CHARS = 160
KEY_METRICS = ("ttft_ms_p95", "tpot_ms_p95", "output_throughput")


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    best_yaml: Path | None  # None: no single best (multi-objective, or nothing feasible completed)
    pictures: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # name -> (png, interactive html)
    front_yaml: Path | None = None  # multi-objective studies
    summary: rep.Summary | None = None  # what the report rests on (report.summarize_study)


def write_report(study: optuna.Study, model: str, artifacts: Path, objective, out_dir: Path,
                 extra=()) -> ReportFiles:
    """Write report.md, report.html, best.yaml (or pareto_front.yaml) and the pictures into `out_dir`;
    `artifacts` holds trial-<n>/requests.jsonl; `extra` sections (title, paragraphs, headers, rows) go
    last. Raises OSError when `out_dir` cannot be written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = rep.summarize_study(study, model, out_dir)  # writes best.yaml / pareto_front.yaml there
    doc = _Doc()
    doc.heading(f"vLLM tuning report: study {study.study_name}", 1)
    _headline(doc, study, s, model, objective)
    _mattered(doc, s)
    _production(doc, study)
    _deploy(doc, s, model)
    _top(doc, study, s, objective)
    trials = study.get_trials(deepcopy=False)
    speculation.section(doc, study, objective)
    outputs_checked.section(doc, trials)
    topologies.section(doc, trials, objective)
    pictures = _pictures(doc, study, s, Path(artifacts), out_dir)
    _failures(doc, study)
    _savings(doc, study, s)
    for sec in extra:
        doc.heading(sec.title)
        for text in sec.paragraphs:
            doc.para(text)
        if sec.rows:
            doc.table(list(sec.headers), [list(r) for r in sec.rows])
    md, page = out_dir / "report.md", out_dir / "report.html"
    write_atomic(md, doc.markdown())
    write_atomic(page, doc.html(f"vLLM tuning report: {study.study_name}"))
    return ReportFiles(md, page, s.yaml_path if s.best else None, pictures, s.yaml_path if s.front else None, s)


def _headline(doc: _Doc, study: optuna.Study, s: rep.Summary, model: str, objective) -> None:
    states = [t.state for t in study.get_trials(deepcopy=False)]
    counts = ", ".join(f"{states.count(x)} {x.name.lower()}" for x in optuna.trial.TrialState if states.count(x))
    slos = f"; SLOs {describe_slos(objective.slos)}" if objective.slos else ""
    doc.para(f"Model {model}. Objective {objective.name}: {objective.metric} ({objective.unit}), "
             f"{'/'.join(objective.directions)}{slos}. Trials: {counts or 'none'}.")
    doc.heading("Result")
    if s.front:
        doc.para(f"Pareto front ({' / '.join(objective.metric.split(','))}): {len(s.front)} trial(s), none beats "
                 "another on both; pick the point whose latency you can live with (below).")
        if s.baseline is not None and s.baseline.values:
            doc.para(f"Baseline (trial {s.baseline.number}): {_values(s.baseline)} {objective.unit}.")
        return
    if s.best is None:
        doc.para(f"No trial met the SLOs ({describe_slos(objective.slos)}): relax them, or widen the space."
                 if s.infeasible_only else "No trial completed: read the failures below.")
        return
    rec = s.recommendation
    runs = f"mean of {len(rec.values)} runs" if len(rec.values) > 1 else "one run"
    origin = (f"trial {s.best.number} with the knobs that had no measurable effect put back"
              if rec.changed_from_trial else f"trial {s.best.number}")
    doc.para(f"Recommended ({rec.source}): {origin}, {objective.metric} = {rec.value:.2f} {objective.unit} "
             f"({runs})" + (f"; SLOs {describe_slos(objective.slos)} hold." if objective.slos else "."))
    best_ci = _interval(s.confirmation.interval(s.best.number))  # none when the confirmation is stale
    if best_ci:
        doc.para(f"Trial {s.best.number} re-measured: {best_ci['mean']:.2f} {objective.unit} over {best_ci['n']} "
                 f"run(s), {range_text(best_ci)}; {verdict_phrase(s.confirmation)} ({noise_text(s.confirmation)}).")
    badge = _badge(study, s)
    if badge:
        doc.para(badge)
    base = s.baseline
    if base is None or base.state != COMPLETE:
        doc.para(_unmeasured(base))
        return
    g = rec.gain or {}
    runs = (g.get("runs") or [0, 1])[1]
    doc.para(f"Baseline: trial {base.number}, {objective.metric} = {g.get('baseline', base.value):.2f} {objective.unit}"
             + (f" (geometric mean of {runs} runs)" if runs > 1 else "")
             + ("" if rep.feasible(base) else " (the baseline misses the SLOs)") + ".")
    if s.gain is None:
        doc.para("No gain to report: the baseline carried no load within the SLOs.")
        return
    if base.number == s.best.number and not rec.changed_from_trial:
        doc.para("The baseline is the best configuration found: no other beat it (gain 1.00x); keep it.")
        return
    g = rec.gain
    doc.para(f"Gain over the baseline: {gain_text(g)}, from {g['runs'][0]} run(s) of the recommendation and "
             f"{g['runs'][1]} of the baseline (geometric means; the interval pools the noise of every repeated run).")


def _badge(study: optuna.Study, s: rep.Summary) -> str:
    """Why optuna-dashboard's "Best Trial" badge may name another trial (it follows one run's value)."""
    try:
        single = study.best_trial
    except ValueError:
        return ""
    if single.number == s.best.number and not s.recommendation.changed_from_trial:
        return ""
    return (f"optuna-dashboard's \"Best Trial\" badge names trial {single.number}: its one run scored best. "
            "The recommendation rests on repeated measurements instead.")


def _unmeasured(base: optuna.trial.FrozenTrial | None) -> str:
    if base is not None and base.state == optuna.trial.TrialState.PRUNED:
        return (f"Baseline could not be measured ({of_trial.failure_kind(base)}): no gain to report. That is "
                f"itself a finding: your current configuration fails here. Remedy: {of_trial.remedy(base)}")
    return "Baseline not measured (it failed outside the configuration, or did not run): no gain to report."


def _mattered(doc: _Doc, s: rep.Summary) -> None:
    rec = s.recommendation
    if rec is None or not rec.rows:
        return
    doc.heading("What mattered")
    doc.para(f"Each knob trial {s.best.number} changed from the baseline, put back alone and measured: the effect is "
             "the reverted configuration's value over the winner's (95% CI). Reverted knobs stay at the baseline's "
             "value in the recommendation; kept ones carried the gain. Each verdict stops measuring once it is made, and a run "
             "the study already had with exactly those flags (a search trial, a re-measurement) counts without a boot.")
    doc.table(["knob", "baseline", "winner", "put back: x the winner (95% CI)", "verdict", "rests on (runs)"],
              [list(row) for row in attribution(rec)])


def _production(doc: _Doc, study: optuna.Study) -> None:
    found = production_table(study)
    if found is None:
        return
    title, rows, flags = found
    doc.heading("Production beside the baseline")
    doc.para(f"{title}. {CAVEAT}" + (f" {flags}" if flags else ""))
    doc.table(["", "production", "baseline trial"], rows)


def _deploy(doc: _Doc, s: rep.Summary, model: str) -> None:
    doc.heading("Deploy")
    if s.front:
        for t in sorted(s.front, key=lambda t: -t.values[0]):
            doc.para(f"Trial {t.number} ({_values(t)}):")
            doc.code(rep.serve_command(model, of_trial.vllm_args(t)))
        doc.para("The front's configurations are in pareto_front.yaml beside this report." if s.yaml_path
                 else "pareto_front.yaml could not be written (the disk refused it).")
        return
    if s.best is None:
        doc.para("Nothing to deploy.")
        return
    doc.code(s.command)
    if "--load-format" in s.command and "dummy" in s.command:
        doc.para("Tuned with random weights: drop --load-format dummy to serve the real ones.")
    if s.yaml_path:
        doc.para(f"Or with the config file beside this report ({s.yaml_path}):")
        doc.code(f"vllm serve {model} --config best.yaml")
    else:
        doc.para("best.yaml could not be written (the disk refused it).")


def _top(doc: _Doc, study: optuna.Study, s: rep.Summary, objective) -> None:
    doc.heading("Top configurations")
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    done = [t for t in study.get_trials(deepcopy=False, states=(COMPLETE,))
            if rep.feasible(t) and not of_trial.is_repeat(t)]  # each configuration once
    done.sort(key=lambda t: -t.values[0] if maximize else t.values[0])
    if s.best is not None:
        done.sort(key=lambda t: t.number != s.best.number)  # the recommendation's trial first, the rest as ranked
    if not done:
        doc.para("No feasible trial completed.")
        return
    front, keys = {t.number for t in s.front}, _beside(objective)
    rows, rec = [], s.recommendation
    if rec is not None and rec.changed_from_trial:  # the minimal change is not a trial: its own row, first
        m = rec.metrics or {}
        rows.append(["-", f"recommended (trial {s.best.number}, knobs put back)", fmt_params(from_cli_args(list(rec.args))),
                     _num(rec.value), *(_num(m.get(k)) for k in keys)])
    for t in done[:TOP]:
        mine = s.best is not None and t.number == s.best.number
        role = ("winner" if rec is not None and rec.changed_from_trial else "recommended") if mine else \
            "front" if t.number in front else ""
        role = ", ".join(r for r in ("baseline" if of_trial.is_baseline(t) else "", role) if r)
        m = of_trial.metrics(t)
        params = fmt_params(rep.knobs_of(t))
        rows.append([str(t.number), role, params, _values(t), *(_num(m.get(k)) for k in keys)])
    doc.table(["#", "role", "parameters", f"{objective.metric} ({objective.unit})", *keys], rows)


def _failures(doc: _Doc, study: optuna.Study) -> None:
    from optimizer.report.diagnosis import (
        diagnose_study,  # written beside this module; cause and remedy per trial
    )

    doc.heading("Failures and weak trials")
    found = {}
    for d in diagnose_study(study):
        found.setdefault(d.trial, []).append(d)
    rows = []
    for t in study.get_trials(deepcopy=False):
        missed = t.state == COMPLETE and not rep.feasible(t)
        if t.state in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL) or missed or t.number in found:
            rows += [_failure_row(t, d, missed) for d in found.get(t.number) or [None]]
    if rows:
        doc.table(["#", "state", "kind", "evidence", "cause", "remedy"], rows)
    else:
        doc.para("No trial failed, and none was weak.")


def _failure_row(t: optuna.trial.FrozenTrial, d, missed: bool) -> list[str]:
    """The diagnosis's words where it has them, the trial's own record where it does not."""
    kind = of_trial.failure_kind(t) or ("slo_missed" if missed else "")
    evidence = of_trial.evidence(t) or _missed(of_trial.slo_excess(t) or t.constraints)
    if d is None:
        return [str(t.number), t.state.name, kind, _cut(evidence), "", of_trial.remedy(t)]
    return [str(t.number), t.state.name, d.kind or kind, _cut(d.evidence or evidence), d.cause,
            d.remedy or of_trial.remedy(t)]


def _savings(doc: _Doc, study: optuna.Study, s: rep.Summary) -> None:
    doc.heading("Savings")
    doc.para(rep.savings_text(s.savings) + ".")
    rows = remeasured.sensitivity(study)
    if not rows:
        return
    doc.heading("Sensitivity")
    doc.para(f"Trial {rows[0].get('trial')} re-measured with one knob moved at a time. ratio > 1: better than "
             "the best's mean; the band is the 95% interval of the best's own n measurements.")
    doc.table(["knob", "from", "to", "value", "ratio", "band", "n", "verdict"],
              [[str(r.get("knob")), str(r.get("from")), str(r.get("to")), _num(r.get("value")), _num(r.get("ratio")),
                f"{_num(r.get('band_low'))} to {_num(r.get('band_high'))}", str(r.get("n")), str(r.get("verdict", ""))]
               for r in rows])


def _pictures(doc: _Doc, study: optuna.Study, s: rep.Summary, artifacts: Path, out_dir: Path) -> dict:
    doc.heading("Pictures")
    out = {}
    for name, draw in DRAWINGS:
        drawn = draw(study, s, artifacts)
        note = drawn.pop("note", "")
        if drawn:
            png, page = out_dir / f"{name}.png", out_dir / f"{name}.html"
            save(drawn, png, page)
            doc.figure(png, page, drawn["title"], drawn["caption"])
            out[name] = (png, page)
        if note:
            doc.para(note)
    return out


class _Doc:
    """The document: one list of blocks, rendered as Markdown and as HTML."""
    def __init__(self):
        self.blocks: list[tuple] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", headers, rows))

    def figure(self, png: Path, page: Path, title: str, caption: str) -> None:
        self.blocks.append(("figure", png.name, page.name, title, caption))

    def markdown(self) -> str:
        out = []
        for kind, *b in self.blocks:
            if kind == "h":
                out.append("#" * b[0] + " " + b[1])
            elif kind == "p":
                out.append(b[0])
            elif kind == "code":
                out.append(f"```sh\n{b[0]}\n```")
            elif kind == "table":
                cell = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("\n".join(["| " + " | ".join(map(cell, b[0])) + " |", "|" + "---|" * len(b[0]),
                                      *("| " + " | ".join(map(cell, r)) + " |" for r in b[1])]))
            else:
                out.append(f"![{b[2]}]({b[0]})\n\n{b[3]} [Interactive version]({b[1]}).")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = []
        for kind, *b in self.blocks:
            if kind == "h":
                out.append(f"<h{b[0]}>{e(b[1])}</h{b[0]}>")
            elif kind == "p":
                out.append(f"<p>{e(b[0])}</p>")
            elif kind == "code":
                out.append(f"<pre><code>{e(b[0])}</code></pre>")
            elif kind == "table":
                head = "".join(f"<th>{e(str(c))}</th>" for c in b[0])
                body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b[1])
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            else:
                out.append(f'<figure><img src="{e(b[0])}" alt="{e(b[2])}"><figcaption>{e(b[3])} '
                           f'<a href="{e(b[1])}">Interactive version</a>.</figcaption></figure>')
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
                f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(out) + "\n</body></html>\n")


_CSS = ("body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;color:#222;"
        "line-height:1.45}pre{background:#f4f4f4;padding:.6rem;overflow-x:auto}table{border-collapse:collapse;"
        "margin:.5rem 0;font-size:.9rem}th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;"
        "vertical-align:top}th{background:#f0f0f0}img{max-width:100%}figure{margin:1rem 0}")


# -- formatting -------------------------------------------------------------------------------------

def _interval(ci) -> dict | None:
    return ci if ci and ci.get("low") is not None and ci.get("high") is not None else None


def _beside(objective) -> tuple[str, ...]:
    """KEY_METRICS less the objective's own, which has its column already (ttft_p95 is ttft_ms_p95)."""
    own = objective.metric.split(",")
    return tuple(k for k in KEY_METRICS if k not in own and k.replace("_ms_", "_") not in own)


def _num(v) -> str:
    if not finite(v):
        return "-" if v is None else str(v)
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _values(t: optuna.trial.FrozenTrial) -> str:
    text = " / ".join(f"{v:.2f}" for v in t.values or ())
    return text + ("" if rep.feasible(t) else " (SLOs missed)")


def _missed(excess: dict) -> str:
    """SLO excess ((observed - limit) / limit) in words: 'tpot_p95 40% over its limit'."""
    return ", ".join(f"{k} {v:.0%} over its limit" for k, v in (excess or {}).items() if finite(v) and v > 0)


def _cut(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS - 1] + "…"
