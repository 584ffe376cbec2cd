"""Devices needed against the peak, per topology: what a fleet study found, the way an operator
reads it at a glance. One row per topology (tensor x pipeline x data parallel sizes) the study
measured, its best trial: a replica's devices and goodput under the SLOs, the p95 TTFT at that
rate, and the replicas and devices the peak needs (objectives/fleet.py); fewest devices first.
A topology pruned before its boot (more ranks than any node has) is listed with why.
"""

from __future__ import annotations

from optimizer.config import topology
from optimizer.config.flags import from_cli_args
from optimizer.record import of_trial

TITLE = "Devices for the fleet, per topology"
HEADERS = ("topology", "devices per replica", "goodput (req/s)", "p95 TTFT (ms)", "replicas", "devices for the peak",
           "trial")


def params_of(t) -> dict:
    """A trial's knobs: the flags it ran, its sampled parameters over them."""
    return {**from_cli_args([str(a) for a in of_trial.vllm_args(t)]), **t.params}


def rows(trials, objective) -> list[list[str]]:
    """The table's rows for a fleet study's trials (FrozenTrials); [] for any other objective."""
    if getattr(objective, "name", "") != "fleet":
        return []
    best: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    for t in trials:
        if of_trial.is_repeat(t):
            continue
        params = params_of(t)
        label = topology.label(params)
        m = of_trial.metrics(t)
        if t.state.name != "COMPLETE" or "goodput_rate" not in m:
            evidence = of_trial.evidence(t)
            if of_trial.too_big(t):  # its ranks fit no node: pruned before its boot
                skipped[label] = evidence.removeprefix("predicted, not booted: ")
            continue
        devices = objective.devices(m)
        key = (devices if devices is not None else float("inf"), -(m.get("goodput_rate") or 0.0))
        if label not in best or key < best[label][0]:
            best[label] = (key, t, params, m, devices)
    out = []
    for _, t, params, m, devices in sorted(best.values(), key=lambda row: row[0]):
        rate = m.get("goodput_rate") or 0.0
        replicas = objective.replicas(rate)
        out.append([topology.label(params), str(topology.ranks(params)), f"{rate:.2f}", _ms(m.get("ttft_ms_p95")),
                    "-" if replicas is None else str(replicas),
                    _devices(devices, objective), str(t.number)])
    for label, why in skipped.items():
        if label not in best:
            out.append([label, "", "", "", "", f"not run: {why}", ""])
    return out


def _devices(devices, objective) -> str:
    if objective.peak is None:
        return "-"
    if devices is None:
        return "none carries it (no rate held the SLOs)"
    over = objective.budget is not None and devices > objective.budget
    return f"{devices} (over the budget of {objective.budget})" if over else str(devices)


def _ms(value) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "-"


def section(doc, trials, objective) -> None:
    """The written report's section (`doc`: report/written.py's document), when it is a fleet study."""
    if found := rows(trials, objective):
        doc.heading(TITLE)
        doc.para(f"Each topology's best trial: one replica's goodput under the SLOs, and the replicas and devices "
                 f"a fleet of it needs{objective.terms}; fewest devices first (objectives/fleet.py).")
        doc.table(list(HEADERS), found)
