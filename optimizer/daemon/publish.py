"""Publishing a generation's recommendation, only when it is worth deploying.

The gate (`decide`): the study's recommendation (verdict/recommendation.py) is published when
    - it was measured more than once against a re-measured baseline (the confirmation ran),
    - it changes something from the baseline (the current configuration),
    - its gain's 95% interval lies above 1 (beyond noise) and the gain is at least
      1 + `daemon.publish.min_gain`,
    - and, with `regression.enabled`, its outputs were compared with the baseline's and stayed
      within `regression.max_flip_rate`.
A recommendation that does not clear it is recorded on the study (`publish`) with the reason.

Published means: `daemon.publish.path` replaced atomically by a `vllm serve --config` YAML
(a temporary file in the same directory, flushed, then renamed over it), `GET /recommendation`
and the info metric on the status API, and a POST of the same JSON to `daemon.publish.webhook`
from a background thread (retried with doubling backoff, never blocking the loop; its outcome
in `/status` under `publish.webhook`).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from optimizer.config.schema import StudyConfig
from optimizer.verdict.confirmed import baseline_trial
from optimizer.verdict.recommendation import SINGLE, recommend
from optimizer.report.verdict_text import gain_text
from optimizer.report.summary import serve_command, serve_yaml

ATTR = "publish"
WEBHOOK_TIMEOUT_S = 10.0


def _regression_problem(rec, cfg: StudyConfig) -> str | None:
    if not cfg.regression.enabled:
        return None
    record = rec.trial.user_attrs.get("regression") or {}
    flip = record.get("flip_rate")
    if flip is None:
        return f"the output-regression gate did not compare its outputs ({record.get('summary', 'no record')})"
    limit = cfg.regression.max_flip_rate
    if limit is not None and flip > limit:
        return f"its outputs changed: top-1 flip rate {flip:.3f} above regression.max_flip_rate {limit}"
    return None


def decide(study, cfg: StudyConfig) -> tuple[bool, str]:
    """(publish?, why): the gate in the module docstring."""
    rec = recommend(study)
    if rec is None:
        return False, "no configuration completed within the SLOs"
    if rec.source == SINGLE:
        return False, "only single runs: the confirmation did not run (confirm.top 0), so the gain has no interval"
    base = baseline_trial(study)
    if base is not None and tuple(base.user_attrs.get("vllm_args") or ()) == rec.args:
        return False, "the recommendation is the current configuration (every change was put back)"
    g = rec.gain
    if not g or g.get("low") is None:
        return False, "no interval for the gain over the baseline (too few runs)"
    if g["low"] <= 1:
        return False, f"{gain_text(g)}: not beyond noise"
    if g["ratio"] < 1 + cfg.daemon.publish.min_gain:
        return False, f"gain {g['ratio']:.2f}x is below daemon.publish.min_gain ({cfg.daemon.publish.min_gain:.0%})"
    problem = _regression_problem(rec, cfg)
    if problem:
        return False, problem
    return True, f"{gain_text(g)} over the current configuration"


def payload(study, cfg: StudyConfig, model: str, generation: int) -> dict | None:
    """The JSON a deployment reads: flags, the `vllm serve --config` mapping, the command, the gain
    and its interval, the generation and the traffic it was measured on."""
    rec = recommend(study)
    if rec is None:
        return None
    attrs = study.user_attrs
    return {"study": study.study_name, "generation": generation, "trial": rec.trial.number, "source": rec.source,
            "flags": list(rec.args), "config": serve_yaml(list(rec.args)), "command": serve_command(model, list(rec.args)),
            "objective": cfg.objective.name, "value": rec.value, "runs": len(rec.values), "gain": rec.gain,
            "traffic": {"source": attrs.get("traffic_source"), "shape": attrs.get("traffic_shape"),
                        "production": attrs.get("production")}}


def write_config(path: str | Path, config: dict) -> Path:
    """Replace `path` by the YAML of `config` atomically (same directory, flushed, renamed over)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(yaml.safe_dump(config, sort_keys=False))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


class Webhook:
    """POSTs JSON to a URL from a background thread, `attempts` times at most (1 s, 2 s, 4 s ...
    apart). Each send reports copies of its own status through `report(status)`; a newer send
    supersedes an older one still retrying (the older stops, its body is stale)."""

    def __init__(self, url: str, attempts: int, report):
        self.url, self.attempts, self.report = url, attempts, report
        self._lock = threading.Lock()
        self._status: dict = {"url": url, "state": "idle", "attempts": 0, "last_error": None}
        self._current = 0
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> dict:
        with self._lock:
            return dict(self._status)

    def send(self, body: dict) -> None:
        with self._lock:
            self._current += 1
            me = self._current
            self._status = {"url": self.url, "state": "sending", "attempts": 0, "last_error": None,
                            "generation": body.get("generation")}
        self._report(me)
        self._thread = threading.Thread(target=self._run, args=(me, json.dumps(body, default=str).encode()),
                                        name="optimizer-webhook", daemon=True)
        self._thread.start()

    def _update(self, me: int, **fields) -> bool:
        with self._lock:
            if me != self._current:
                return False  # superseded
            self._status.update(fields)
            return True

    def _report(self, me: int) -> None:
        with self._lock:
            snapshot = dict(self._status) if me == self._current else None
        if snapshot is not None:
            self.report(snapshot)

    def _run(self, me: int, data: bytes) -> None:
        delay = 1.0
        for attempt in range(1, self.attempts + 1):
            if not self._update(me, attempts=attempt):
                return
            try:
                req = urllib.request.Request(self.url, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:
                    code = resp.status
                if self._update(me, state="sent", last_error=None, code=code, sent_at=time.time()):
                    self._report(me)
                return
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                why = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            self._update(me, last_error=f"{self.url} refused the recommendation ({why}); check the URL and "
                                        "that the receiver accepts a JSON POST")
            if attempt < self.attempts:
                self._report(me)
                time.sleep(delay)
                delay *= 2
        if self._update(me, state="failed"):
            self._report(me)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
