"""What optuna-dashboard shows on a trial's page: the trial's files in Optuna's artifact store,
and a short Markdown note (configuration, headline metrics, failure kind and remedy, diagnosis).

The artifact store is `optuna.artifacts.FileSystemArtifactStore` rooted at `artifacts_dir`
(next to `trials.db` by default), so `optuna-dashboard sqlite:///trials.db --artifact-dir
artifacts` (`make dashboard`) serves the files. Optuna keeps each upload under its own id in
that directory; the readable copies stay in `artifacts/<study>/trial-<n>/` (driver/store/trial_files.py).

An upload sets a trial system attribute, which Optuna refuses once the trial is finished,
so the driver uploads before it tells Optuna. A note lives in the study's system attributes
(optuna-dashboard's own format), so it is written after the tell, when the state is known.
Neither may stop a study: a refused write is returned as a one-line reason.
"""

from __future__ import annotations

import shlex

from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna_dashboard import save_note

from optimizer.errors import first_line
from optimizer.record import of_trial
from optimizer.report import speculation
from optimizer.text.verdicts import attribution, gain_text
from optimizer.verdict.trials import knobs_of

TRIAL_FILES = ("result.json", "requests.jsonl", "server.log")
HEADLINE = (  # (metric key, label, unit) shown in a note
    ("ttft_ms_p95", "p95 TTFT", "ms"), ("tpot_ms_p95", "p95 TPOT", "ms"), ("e2el_ms_p95", "p95 end-to-end", "ms"),
    ("output_throughput", "output", "tok/s"), ("total_token_throughput", "total", "tok/s"),
    ("goodput_rps", "goodput", "req/s"), ("completed", "requests completed", ""), ("error_rate", "error rate", ""),
)


def artifact_store(artifacts_dir: str | Path) -> FileSystemArtifactStore:
    root = Path(artifacts_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(root))


def upload_trial_files(trial: optuna.Trial, trial_dir: Path, artifacts_dir: str | Path) -> str | None:
    """Attach the trial's stored files to it (before it is told); None, or why some were not."""
    try:
        store = artifact_store(artifacts_dir)
        for name in TRIAL_FILES:
            path = trial_dir / name
            if path.is_file():
                upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial,
                                mimetype="text/plain" if name.endswith((".log", ".jsonl")) else None)
    except Exception as exc:  # noqa: BLE001 - a full disk, a locked database: never the study's end
        why = getattr(exc, "strerror", None) or first_line(exc)
        return f"artifacts for optuna-dashboard not stored ({why}); the files stay in {trial_dir}"
    return None


def note_text(t: optuna.trial.FrozenTrial, metric: str, unit: str, diagnosis=None) -> str:
    """The trial's note in Markdown: what ran, what it measured, why it failed and what to do."""
    role = " (baseline)" if of_trial.is_baseline(t) else ""
    kind = of_trial.failure_kind(t)
    head = f"## Trial {t.number}{role}: {t.state.name}" + (f", `{kind}`" if kind else "")
    args = of_trial.vllm_args(t)
    knobs = knobs_of(t)
    lines = [head, "", "**Configuration**: " + (" ".join(f"`{k}={v}`" for k, v in knobs.items()) or "vLLM defaults")]
    if t.values is not None:
        feasible = of_trial.marked_feasible(t)
        value = " / ".join(f"{v:.4g}" for v in t.values)
        lines.append(f"**{metric}**: {value} {unit}" + ("" if feasible is not False else " (SLOs missed)"))
    metrics = of_trial.metrics(t)
    rows = [f"| {label} | {metrics[key]:.4g} {u} |" for key, label, u in HEADLINE
            if isinstance(metrics.get(key), (int, float))]
    if rows:
        lines += ["", "| metric | value |", "|---|---|", *rows]
    spec = speculation.note_line(of_trial.server(t))
    if spec:
        lines += ["", f"**Speculation**: {spec}"]
    if kind:
        lines += ["", f"**Failure**: `{kind}`: {_quote(of_trial.evidence(t))}", f"**Remedy**: {of_trial.remedy(t)}"]
    if diagnosis is not None:
        lines += ["", f"**Diagnosis** ({diagnosis.kind}): {diagnosis.cause}", f"**Do**: {diagnosis.remedy}"]
    if of_trial.regression(t):
        lines += ["", f"**Outputs vs baseline**: {of_trial.regression(t).get('summary', '')}"]
    lines += ["", "Files: " + ", ".join(TRIAL_FILES) + " (artifacts below; also in "
              f"`artifacts/<study>/trial-{t.number}/`)", "", "`vllm serve MODEL " + shlex.join(args) + "`"]
    return "\n".join(lines) + "\n"


def _quote(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return "`" + (text[:limit] + "..." if len(text) > limit else text).replace("`", "'") + "`" if text else ""


def save_trial_note(study: optuna.Study, number: int, metric: str, unit: str) -> str | None:
    """Write (or rewrite) trial `number`'s note; None, or why it was not written."""
    from optimizer.report import diagnosis  # noqa: PLC0415 - it reads the whole study; only needed here

    t = study.get_trials(deepcopy=False)[number]
    try:
        found = diagnosis.diagnose(t, diagnosis.context_of(study))
        save_note(_TrialRef(study, t), note_text(t, metric, unit, found))
    except Exception as exc:  # noqa: BLE001 - a note is a convenience: never the study's end
        return f"note of trial {number} not written ({type(exc).__name__}: {first_line(exc)})"
    return None


def save_study_note(study: optuna.Study, summary, report_html: Path | None) -> str | None:
    """The study page's note, recommendation first (and why the "Best Trial" badge may differ), its
    gain, the command to deploy, what mattered, and where the full written report is. None, or why it was not written."""
    lines = [f"## Study {study.study_name}"]
    rec = summary.recommendation
    if summary.best is not None and rec is not None:
        origin = f"trial {summary.best.number}" + (" with the knobs that had no effect put back"
                                                   if rec.changed_from_trial else "")
        lines.append(f"**Recommended** ({rec.source}): {origin}, value {rec.value:.4g} over {len(rec.values)} run(s)"
                     + (f", **{gain_text(rec.gain)}** the baseline (trial {summary.baseline.number})"
                        if rec.gain is not None else ""))
        badge = _badge_differs(study, summary)
        if badge:
            lines.append(badge)
        lines.append(f"**Deploy**: `{summary.command}`")
        if rec.rows:
            lines.append("**What mattered** (each knob put back alone: x the winner, 95% CI)\n\n"
                         "| knob | baseline | winner | put back | verdict | rests on |\n|---|---|---|---|---|---|\n"
                         + "\n".join("| " + " | ".join(row) + " |" for row in attribution(rec)))
    elif summary.front:
        lines.append(f"**Pareto front**: trials {', '.join(str(t.number) for t in summary.front)}")
    else:
        lines.append("No trial completed within the SLOs yet: see the trials' notes for why.")
    if report_html is not None:
        lines.append(f"Full report (pictures, failure table, diagnosis): `{report_html}`")
    try:
        save_note(study, "\n\n".join(lines) + "\n")
    except Exception as exc:  # noqa: BLE001 - as for a trial's note
        return f"study note not written ({type(exc).__name__}: {first_line(exc)})"
    return None


def _badge_differs(study: optuna.Study, summary) -> str:
    """Why the dashboard's "Best Trial" badge (Optuna's best single value) names another configuration."""
    single = study.best_trial
    if single.number == summary.best.number and not summary.recommendation.changed_from_trial:
        return ""
    return (f"The dashboard's \"Best Trial\" badge shows trial {single.number}: it follows the best single run. "
            "The recommendation above rests on repeated runs (the confirmation) and puts back what had no effect.")


class _TrialRef:
    """What `optuna_dashboard.save_note` reads of a trial (its storage, study and id): a finished
    trial is a FrozenTrial, which carries none of them."""

    def __init__(self, study: optuna.Study, t: optuna.trial.FrozenTrial):
        self.storage = study._storage
        self.study = study
        self._trial_id = t._trial_id
