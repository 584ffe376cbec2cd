"""The status API's `/metrics` page, rendered by prometheus-client from a status snapshot, so
names, label escaping and types follow Prometheus' conventions.

Every metric is a gauge, except `vllm_optimizer_recommendation_info`, an info metric (value 1)
whose labels are the published recommendation: study, generation, trial, flags, gain. Metrics
whose source field is missing are left out, except up, uptime, heartbeat age and state.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

STATES = ("starting", "observing", "tuning", "confirming", "minimizing", "watching", "waiting_disk", "stopping")
TRIAL_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _gauge(name: str, help_text: str, samples: list[tuple[dict, object]]) -> GaugeMetricFamily | None:
    rows = [(labels, v) for labels, value in samples if (v := _number(value)) is not None]
    if not rows:
        return None
    names = sorted({k for labels, _ in rows for k in labels})
    family = GaugeMetricFamily(name, help_text, labels=names)
    for labels, v in rows:
        family.add_metric([str(labels.get(k, "")) for k in names], v)
    return family


def _recommendation(rec: dict) -> list:
    gain = rec.get("gain") or {}
    labels = {"study": str(rec.get("study") or ""), "generation": str(rec.get("generation") or ""),
              "trial": str(rec.get("trial") if rec.get("trial") is not None else ""),
              "flags": " ".join(rec.get("flags") or []), "source": str(rec.get("source") or "")}
    info = InfoMetricFamily("vllm_optimizer_recommendation", "The published recommendation (labels: its flags).")
    info.add_metric([], labels)
    out = [info]
    for key, help_text in (("ratio", "Gain of the published recommendation over the current configuration."),
                           ("low", "Lower end of the gain's 95% interval."),
                           ("high", "Upper end of the gain's 95% interval.")):
        g = _gauge(f"vllm_optimizer_recommendation_gain_{key}", help_text, [({}, gain.get(key))])
        if g is not None:
            out.append(g)
    g = _gauge("vllm_optimizer_recommendation_published_timestamp_seconds", "When it was published (Unix time).",
               [({}, rec.get("published_at"))])
    return out + ([g] if g is not None else [])


class _Snapshot(Collector):
    def __init__(self, snapshot: dict):
        self.snap = snapshot

    def collect(self):
        s = self.snap
        study = {"study": s.get("study") or ""}
        families = [
            _gauge("vllm_optimizer_up", "1 while the status server answers.", [({}, 1)]),
            _gauge("vllm_optimizer_uptime_seconds", "Seconds since the daemon started.",
                   [({}, s.get("uptime_s", math.nan))]),
            _gauge("vllm_optimizer_heartbeat_age_seconds", "Seconds since the driver loop last reported.",
                   [({}, s.get("heartbeat_age_s", math.nan))]),
            _gauge("vllm_optimizer_state", "1 for the daemon's current state, 0 for the others.",
                   [({"state": st}, int(s.get("state") == st)) for st in STATES]),
        ]
        if s.get("generation") is not None:
            families.append(_gauge("vllm_optimizer_generation", "Study generation (bumped when the workload changes).",
                                   [(study, s["generation"])]))
        trials = s.get("trials")
        if isinstance(trials, dict):
            families.append(_gauge("vllm_optimizer_trials", "Trials of the study by state.",
                                   [({**study, "state": st}, trials.get(st) or 0) for st in TRIAL_STATES]))
        if s.get("n_trials") is not None:
            families.append(_gauge("vllm_optimizer_trials_budget", "Trial budget of the study.",
                                   [(study, s["n_trials"])]))
        running = s.get("running")
        if isinstance(running, dict):
            families.append(_gauge("vllm_optimizer_running_trial", "Number of the trial running now, labelled by phase.",
                                   [({**study, "phase": running.get("phase") or ""}, running.get("number"))]))
        best = s.get("best")
        if isinstance(best, dict):
            labels = {**study, **{k: best.get(k) or "" for k in ("metric", "unit", "direction")}}
            families.append(_gauge("vllm_optimizer_best_value", "Objective value of the best trial so far.",
                                   [(labels, best.get("value"))]))
            families.append(_gauge("vllm_optimizer_best_trial", "Number of the best trial so far.",
                                   [(study, best.get("number"))]))
        window = (s.get("watch") or {}).get("window") if isinstance(s.get("watch"), dict) else None
        if isinstance(window, dict):
            families += [
                _gauge("vllm_optimizer_traffic_saturated", "1 when the watched servers were saturated over the last "
                       "window (the backlog grew, requests waited through most of it, or the median TTFT or "
                       "queue time passed the TTFT SLO).", [({}, int(bool(window.get("saturated"))))]),
                _gauge("vllm_optimizer_traffic_rejected_requests", "Inference requests the watched servers' API "
                       "answered 4xx or 5xx in the last window, by status class.",
                       [({"status": c}, window.get(f"rejected_{c}")) for c in ("4xx", "5xx")]),
                _gauge("vllm_optimizer_production_slo_attainment", "Share of the watched servers' requests that met "
                       "each of the study's SLOs over the last window (their own latency histograms).",
                       [({"slo": k}, v.get("share")) for k, v in (window.get("slos") or {}).items()]),
                _gauge("vllm_optimizer_traffic_arrival_rate", "Requests per second arriving at the watched servers "
                       "(finished plus the backlog's growth) over the last window.", [({}, window.get("rate"))]),
                _gauge("vllm_optimizer_traffic_finished_requests", "Requests the watched servers finished in the "
                       "last window.", [({}, window.get("requests"))])]
        if isinstance(s.get("recommendation"), dict):
            families += _recommendation(s["recommendation"])
        yield from (f for f in families if f is not None)


def prometheus_text(snapshot: dict) -> str:
    """The /metrics body for a status snapshot (Prometheus text format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(snapshot))
    return generate_latest(registry).decode()
