"""The written report's pictures (report/written.py places them), each drawn twice from one study:

    tradeoff    output throughput vs p95 TTFT of every completed trial: the non-dominated ones
                labelled, the baseline a star, the best ringed, a trial that missed its SLOs crossed
    importance  how much each knob decides the objective (optuna PED-ANOVA); left out, with the
                reason, below MIN_FOR_IMPORTANCE completed trials or when optuna finds nothing
    ttft        per-request TTFT of the baseline and the recommendation as ECDFs, p50 and p95
                marked, read from their requests.jsonl; a log axis when they span more than 20x
    startup     each booted trial's start-up as a stacked bar of its steps (report/startup.py sums them)

Each drawing returns a static matplotlib figure (Agg backend: files only, no display), saved as
PNG, and a plotly figure, saved as HTML in plotly's "directory" mode (the page loads
plotly.min.js from beside it), or only a note saying why there is no picture.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import optuna

from optimizer.measure.metrics import percentile
from optimizer.record import of_trial
from optimizer.report import startup
from optimizer.report import summary as rep
from optimizer.text.knobs import fmt_params

COMPLETE = rep.COMPLETE
# A fitted importance from a handful of trials ranks noise (measured: fitted on 4 trials it put the memory
# fraction first while the trials showed max-num-seqs moving p95 TTFT 8x); "What mattered" measures instead.
MIN_FOR_IMPORTANCE = 12
TOO_FEW = "too few completed trials for parameter importance"
LOG_SPREAD = 20  # a TTFT axis spanning more than this ratio is drawn on a log scale


def save(drawn: dict, png: Path, page: Path) -> None:
    """Write one drawing: its matplotlib figure as `png`, its plotly figure as the page `page`."""
    drawn["png"].savefig(png, dpi=110, bbox_inches="tight")
    _pyplot().close(drawn["png"])
    drawn["plotly"].write_html(str(page), include_plotlyjs="directory", full_html=True)


def read_ttft_ms(path: Path) -> list[float] | None:
    """Per-request TTFT (ms) of the successful requests in a requests.jsonl (replay.RequestRecord
    lines); None when the file is missing or unreadable. A damaged line is skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("ok") and finite(r.get("first_chunk_s")) and finite(r.get("sent_s")):
            out.append((r["first_chunk_s"] - r["sent_s"]) * 1000)
    return out


def non_dominated(points: list[tuple[float, float]]) -> set[int]:
    """Indices of the (latency, throughput) points no other point beats: lower latency, higher throughput."""
    def beats(a, b):
        return a[0] <= b[0] and a[1] >= b[1] and a != b
    return {i for i, p in enumerate(points) if not any(beats(q, p) for q in points)}


def param_importances(study: optuna.Study) -> tuple[dict[str, float] | None, str]:
    """PED-ANOVA importances (fANOVA would need scikit-learn), and Optuna's warnings as one line;
    None with the reason when there are too few completed trials for them to mean anything."""
    n = len(study.get_trials(deepcopy=False, states=(COMPLETE,)))
    if n < MIN_FOR_IMPORTANCE:
        return None, f"{TOO_FEW} ({n} completed, {MIN_FOR_IMPORTANCE} needed)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            imp = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        except Exception as exc:  # an optional picture: whatever optuna refuses is reported, not raised
            return None, f"{TOO_FEW} ({type(exc).__name__}: {exc})"
    said = list(dict.fromkeys(str(w.message) for w in caught
                              if not issubclass(w.category, optuna.exceptions.ExperimentalWarning)))
    # "too small" / "will be equal": optuna says the numbers are meaningless. Other warnings (a knob
    # some trial lacks, e.g. the baseline) only drop those trials from that knob: kept as a caveat.
    meaningless = any("too small" in m or "will be equal" in m for m in said)
    if meaningless or not any(finite(v) and v > 0 for v in imp.values()):
        return None, f"{TOO_FEW} ({' '.join(said) or 'no parameter stands out'})"
    return imp, " ".join(said)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    return plt


def _tradeoff(study: optuna.Study, s: rep.Summary, artifacts: Path) -> dict:
    import plotly.graph_objects as go

    pts = []
    for t in study.get_trials(deepcopy=False, states=(COMPLETE,)):
        m = of_trial.metrics(t)
        x, y = m.get("ttft_ms_p95"), m.get("output_throughput")
        if finite(x) and finite(y):
            pts.append((t, float(x), float(y)))
    if not pts:
        return {"note": "Trade-off: no completed trial has both p95 TTFT and output throughput."}
    front = non_dominated([(x, y) for _, x, y in pts])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    fig_i = go.Figure()
    groups = (("other trials", [i for i in range(len(pts)) if i not in front], "o", "#9e9e9e"),
              ("non-dominated", sorted(front, key=lambda i: pts[i][1]), "o", "#d62728"))
    for label, idx, marker, color in groups:
        if not idx:
            continue
        xs, ys = [pts[i][1] for i in idx], [pts[i][2] for i in idx]
        ax.scatter(xs, ys, marker=marker, color=color, label=label, zorder=2)
        fig_i.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text" if label == "non-dominated" else "markers",
                                   name=label, marker={"color": color, "size": 10},
                                   text=[f"#{pts[i][0].number}" for i in idx], textposition="top center",
                                   hovertext=[_hover(pts[i][0]) for i in idx]))
    for i in front:
        ax.annotate(f"#{pts[i][0].number}", (pts[i][1], pts[i][2]), textcoords="offset points", xytext=(5, 5))
    base = [p for p in pts if of_trial.is_baseline(p[0])]
    if base:
        t, x, y = base[0]
        ax.scatter([x], [y], marker="*", s=220, color="black", label=f"baseline #{t.number}", zorder=3)
        fig_i.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=f"baseline #{t.number}",
                                   marker={"symbol": "star", "size": 16, "color": "black"}, hovertext=[_hover(t)]))
    _marks(ax, fig_i, pts, s)
    ax.set(xlabel="p95 TTFT (ms)", ylabel="output throughput (tok/s)", title="Trade-off: throughput vs p95 TTFT")
    ax.grid(alpha=0.3)
    ax.legend()
    fig_i.update_layout(title="Trade-off: throughput vs p95 TTFT (hover for parameters)",
                        xaxis_title="p95 TTFT (ms)", yaxis_title="output throughput (tok/s)")
    return {"png": fig, "plotly": fig_i, "title": "Trade-off: throughput vs p95 TTFT",
            "caption": "Output throughput vs p95 TTFT of every completed trial; the non-dominated ones (no other "
                       "trial is both faster and higher) are labelled, the star is the baseline, the ring the best, "
                       "a cross a trial that missed the SLOs."}


def _marks(ax, fig_i, pts: list, s: rep.Summary) -> None:
    """The best ringed, the trials that missed their SLOs crossed out."""
    import plotly.graph_objects as go

    marks = (("best", [p for p in pts if s.best is not None and p[0].number == s.best.number],
              {"marker": "o", "s": 260, "facecolors": "none", "edgecolors": "#d62728", "linewidths": 1.5},
              {"symbol": "circle-open", "size": 22, "color": "#d62728"}),
             ("SLOs missed", [p for p in pts if not rep.feasible(p[0])],
              {"marker": "x", "s": 90, "color": "black", "linewidths": 1.5}, {"symbol": "x-thin-open", "size": 14,
                                                                          "color": "black"}))
    for label, chosen, mpl, ply in marks:
        if chosen:
            ax.scatter([p[1] for p in chosen], [p[2] for p in chosen], label=label, zorder=4, **mpl)
            fig_i.add_trace(go.Scatter(x=[p[1] for p in chosen], y=[p[2] for p in chosen], mode="markers", name=label,
                                       marker=ply, hovertext=[_hover(p[0]) for p in chosen]))


def _importance(study: optuna.Study, s: rep.Summary, artifacts: Path) -> dict:
    import plotly.graph_objects as go

    imp, notes = param_importances(study)
    if imp is None:
        return {"note": f"Parameter importance: {notes}."}
    names = list(imp)[::-1]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    ax.barh(names, [imp[n] for n in names], color="#1f77b4")
    ax.set(xlabel="importance (PED-ANOVA, normalized)", title="Parameter importance")
    fig_i = go.Figure(go.Bar(x=[imp[n] for n in names], y=names, orientation="h"))
    fig_i.update_layout(title="Parameter importance (PED-ANOVA)", xaxis_title="importance (normalized)")
    what = "reaching the Pareto front" if len(study.directions) > 1 else "the objective's best values"
    n = len(study.get_trials(deepcopy=False, states=(COMPLETE,)))
    return {"png": fig, "plotly": fig_i, "note": f"Optuna noted: {notes}" if notes else "",
            "title": "Parameter importance",
            "caption": f"How much each knob decides {what}: optuna PED-ANOVA fitted on {n} completed trials, a "
                       "model's guess; \"What mattered\" above measures each changed knob instead."}


def _ttft(study: optuna.Study, s: rep.Summary, artifacts: Path) -> dict:
    import plotly.graph_objects as go

    if s.best is None:
        return {"note": "TTFT distribution: no single best trial to compare with the baseline."}
    runs, missing = [], []
    own = (s.recommendation.run_dir if s.recommendation is not None else None) or f"trial-{s.best.number}"
    for role, t, color, where in (("baseline", s.baseline, "#7f7f7f", None), ("recommended", s.best, "#d62728", own)):
        path = artifacts / (where or f"trial-{t.number}") / "requests.jsonl" if t is not None else None
        values = read_ttft_ms(path) if path is not None else None
        if values:
            runs.append((f"{role} #{t.number}", sorted(values), color))
        else:
            missing.append(f"{role} ({path if path else 'no baseline trial'}: "
                           f"{'no successful request' if values == [] else 'missing'})")
    note = f"TTFT distribution: request records not found for {'; '.join(missing)}." if missing else ""
    if not runs:
        return {"note": note}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    fig_i = go.Figure()
    for label, v, color in runs:
        p50, p95 = percentile(v, 50), percentile(v, 95)
        ys = [(i + 1) / len(v) for i in range(len(v))]
        name = f"{label}: p50 {p50:.0f} ms, p95 {p95:.0f} ms"
        ax.step(v, ys, where="post", color=color, label=name)
        fig_i.add_trace(go.Scatter(x=v, y=ys, mode="lines", line={"shape": "hv", "color": color}, name=name))
        for q, style in ((p50, ":"), (p95, "--")):
            ax.axvline(q, color=color, linestyle=style, linewidth=1)
            fig_i.add_vline(x=q, line={"color": color, "dash": "dot" if style == ":" else "dash", "width": 1})
    log = log_axis([x for _, v, _ in runs for x in v])
    ax.set(xlabel="TTFT (ms" + (", log scale)" if log else ")"), ylabel="share of requests",
           title="TTFT per request (ECDF)")
    if log:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig_i.update_layout(title="TTFT per request (ECDF)", xaxis_title="TTFT (ms)", yaxis_title="share of requests",
                        xaxis_type="log" if log else "linear")
    return {"png": fig, "plotly": fig_i, "note": note, "title": "TTFT per request, baseline vs recommended",
            "caption": "Share of requests whose time to first token is at most x; dotted lines p50, dashed p95"
                       + (" (log axis: the runs span more than 20x)." if log else ".")}


STEP_COLORS = {"import": "#c7c7c7", "config": "#9edae5", "engine_start": "#17becf", "weights": "#bcbd22",
               "compile": "#d62728", "kv_cache": "#1f77b4", "cuda_graphs": "#9467bd", "api_ready": "#7f7f7f"}


def _startup(study: optuna.Study, s: rep.Summary, artifacts: Path) -> dict:
    import plotly.graph_objects as go

    booted = startup.booted(study.get_trials(deepcopy=False))
    if not booted:
        return {"note": "Start-up: no trial's server log was read (none booted, or the logs predate the breakdown)."}
    labels = [f"#{t.number}" + {"hit": " (cache hit)", "reload_failed": " (cache reload failed)"}.get(
        of_trial.startup(t).get("compile_cache"), "") for t in booted]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(booted) + 1.5))
    fig_i = go.Figure()
    left = [0.0] * len(booted)
    for step, color in STEP_COLORS.items():
        widths = [of_trial.startup(t)["steps"].get(step, 0.0) for t in booted]
        if not any(widths):
            continue
        name = step.replace("_", " ")
        ax.barh(labels, widths, left=left, color=color, label=name)
        fig_i.add_trace(go.Bar(x=widths, y=labels, orientation="h", name=name, marker_color=color))
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set(xlabel="seconds", title="Start-up of each trial's server")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(booted) < 4 else -0.15), ncol=4,
              fontsize=8)  # below the bars, never over them
    fig_i.update_layout(barmode="stack", title="Start-up of each trial's server", xaxis_title="seconds",
                        yaxis={"autorange": "reversed"})
    return {"png": fig, "plotly": fig_i, "title": "Start-up of each trial's server",
            "caption": "Each booted trial's start-up in its steps, read from its server log (stamped to the "
                       "second); torch.compile's share is what a warm compile cache saves."}


def log_axis(values: list[float]) -> bool:
    """Whether the values spread over more than LOG_SPREAD times (then a linear axis hides the fast ones)."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPREAD


# name -> draw(study, summary, artifacts dir) -> {"png", "plotly", "title", "caption"} and/or {"note"}
DRAWINGS = (("tradeoff", _tradeoff), ("importance", _importance), ("ttft", _ttft), ("startup", _startup))


def _hover(t: optuna.trial.FrozenTrial) -> str:
    return f"trial {t.number}: " + fmt_params(rep.knobs_of(t))


def finite(v) -> bool:
    """A real, finite number (an int or float: not None, a string, inf or nan)."""
    return isinstance(v, (int, float)) and math.isfinite(v)
