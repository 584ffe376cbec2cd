"""Publishing a generation's recommendation, only when it is worth deploying.

The gate (`decide`): the study's recommendation (verdict/recommendation.py) is published when
    - it was measured on the model's real weights (never `--load-format dummy`),
    - it was measured more than once against a re-measured baseline (the confirmation ran),
    - it changes something from the baseline (the current configuration),
    - its gain's 95% interval lies above 1 (beyond noise) and the gain is at least
      1 + `daemon.publish.min_gain`,
    - and, with `regression.enabled`, its outputs were compared with the baseline's and stayed
      within `regression.max_flip_rate`.
Each decision has one code (`REASONS`) and one sentence; the console, `/status`, `/recommendation`
and the webhook all show that same pair. A recommendation that does not clear the gate is
recorded on the study (`publish`) with both.

Published means: `daemon.publish.path` replaced atomically by a `vllm serve --config` YAML
(a temporary file in the same directory, flushed, then renamed over it), `GET /recommendation`
and the info metric on the status API, and a POST of the same JSON to `daemon.publish.webhook`
from a background thread (retried with doubling backoff, never blocking the loop; its outcome
in `/status` under `publish.webhook`).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from pathlib import Path

import yaml

from optimizer.atomic_file import write_atomic
from optimizer.http_open import urlopen
from optimizer.config.flags import random_weights
from optimizer.config.schema import StudyConfig
from optimizer.record import of_generation, of_trial
from optimizer.verdict.confirmed import baseline_trial
from optimizer.verdict.recommendation import MINIMAL, SINGLE, recommend
from optimizer.text.verdicts import gain_text
from optimizer.deploy.serve import serve_command, serve_yaml

WEBHOOK_TIMEOUT_S = 10.0


def _regression_problem(rec, cfg: StudyConfig) -> str | None:
    if not cfg.regression.enabled:
        return None
    record = of_trial.regression(rec.trial)
    flip = record.get("flip_rate")
    if flip is None:
        return f"the output-regression gate did not compare its outputs ({record.get('summary', 'no record')})"
    limit = cfg.regression.max_flip_rate
    if limit is not None and flip > limit:
        return f"its outputs changed: top-1 flip rate {flip:.3f} above regression.max_flip_rate {limit}"
    return None


REASONS = {
    "published": "a gain beyond noise and above daemon.publish.min_gain",
    "no_feasible": "no configuration completed within the SLOs",
    "random_weights": "measured with random weights (--load-format dummy): never deployed",
    "single_runs": "the confirmation did not run, so the gain has no interval",
    "baseline_won": "the current configuration (the baseline) measured best",
    "all_put_back": "the minimal change put every change back: what remains is the current configuration",
    "no_interval": "too few runs for an interval on the gain",
    "within_noise": "the gain is not beyond noise",
    "below_min_gain": "the gain is below daemon.publish.min_gain",
    "outputs": "the output-regression gate did not pass it",
}


@dataclass(frozen=True)
class Decision:
    publish: bool
    code: str  # a key of REASONS
    reason: str  # one sentence, with the figures

    def as_dict(self) -> dict:
        return {"published": self.publish, "code": self.code, "reason": self.reason}


def _same_as_baseline(rec, base) -> Decision | None:
    """The recommendation deploys the baseline's own flags: the baseline won, or every change was put back."""
    if base is None or tuple(of_trial.vllm_args(base)) != rec.args:
        return None
    if rec.source == MINIMAL:
        kept = [r["knob"] for r in rec.rows if r.get("verdict") in ("kept", "undecided")]
        return Decision(False, "all_put_back", f"the recommendation is the current configuration: the minimal change "
                        f"put back all {len(rec.rows)} changed knob(s)" + (f" ({', '.join(kept)} kept)" if kept else ""))
    who = "the baseline itself" if rec.trial.number == base.number else f"trial {rec.trial.number}, with the baseline's flags,"
    return Decision(False, "baseline_won", f"the recommendation is the current configuration: {who} measured best")


def decide(study, cfg: StudyConfig) -> Decision:
    """The gate in the module docstring: publish or not, its code and its sentence."""
    rec = recommend(study)
    if rec is None:
        return Decision(False, "no_feasible", "no configuration completed within the SLOs")
    if random_weights(rec.args):
        return Decision(False, "random_weights", "measured with random weights (--load-format dummy): deployed, "
                        "its flags would serve noise; tune with the model's real weights (no load_format) to publish")
    if rec.source == SINGLE:
        return Decision(False, "single_runs", "only single runs: the confirmation did not run (confirm.top 0), "
                        "so the gain has no interval")
    same = _same_as_baseline(rec, baseline_trial(study))
    if same is not None:
        return same
    g = rec.gain
    if not g or g.get("low") is None:
        return Decision(False, "no_interval", "no interval for the gain over the baseline (too few runs)")
    if g["low"] <= 1:
        return Decision(False, "within_noise", f"{gain_text(g)}: not beyond noise")
    if g["ratio"] < 1 + cfg.daemon.publish.min_gain:
        return Decision(False, "below_min_gain", f"gain {g['ratio']:.2f}x is below daemon.publish.min_gain "
                        f"({cfg.daemon.publish.min_gain:.0%})")
    problem = _regression_problem(rec, cfg)
    if problem:
        return Decision(False, "outputs", problem)
    return Decision(True, "published", f"{gain_text(g)} over the current configuration")


def payload(study, cfg: StudyConfig, model: str, generation: int) -> dict | None:
    """The JSON a deployment reads: flags, the `vllm serve --config` mapping, the command, the gain
    and its interval, the generation and the traffic it was measured on."""
    rec = recommend(study)
    if rec is None:
        return None
    return {"study": study.study_name, "generation": generation, "trial": rec.trial.number, "source": rec.source,
            "flags": list(rec.args), "config": serve_yaml(list(rec.args)), "command": serve_command(model, list(rec.args)),
            "objective": cfg.objective.name, "value": rec.value, "runs": len(rec.values), "gain": rec.gain,
            "traffic": {"source": of_generation.traffic_source(study), "shape": of_generation.traffic_shape(study),
                        "production": of_generation.production(study)}}


def write_config(path: str | Path, config: dict) -> Path:
    """Replace `path` by the YAML of `config` atomically (atomic_file.py)."""
    return write_atomic(path, yaml.safe_dump(config, sort_keys=False))


def redacted(url: str) -> str:
    """`url` as shown in /status and logs: a password and every query value masked."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = urlencode([(k, "***") for k, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def signature(secret: bytes, body: bytes) -> str:
    """The `X-Optimizer-Signature-256` header's value for `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class Webhook:
    """POSTs JSON to a URL from a background thread, `attempts` times at most (1 s, 2 s, 4 s ...
    apart). Each body names its `event` (published, not_published, saturated). A newer send of
    the same event supersedes an older one still retrying (the older stops, its body is stale);
    another event never cancels a recommendation's delivery. `status` and `report(status)` follow
    the newest send."""

    def __init__(self, url: str, attempts: int, report, secret: bytes | None = None, outbox: Path | None = None):
        self.url, self.attempts, self.report, self.secret = url, attempts, report, secret
        self.outbox = outbox  # each event's newest body until it is delivered: sent again after a restart
        self.shown = redacted(url)
        self._lock = threading.Lock()
        self._status: dict = {"url": self.shown, "state": "idle", "attempts": 0, "last_error": None}
        self._sends = 0
        self._newest: dict[str, int] = {}  # event -> its newest send
        self._latest = 0  # the newest send of any event: the one `status` shows
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> dict:
        with self._lock:
            return dict(self._status)

    def send(self, body: dict) -> None:
        event = str(body.get("event", "published"))
        with self._lock:
            self._sends += 1
            me = self._sends
            self._newest[event] = self._latest = me
            self._status = {"url": self.shown, "state": "sending", "attempts": 0, "last_error": None,
                            "generation": body.get("generation"), "event": event}
        self._report(me)
        data = json.dumps(body, default=str).encode()
        headers = {"Content-Type": "application/json", "X-Optimizer-Event": event,
                   "Idempotency-Key": f"{body.get('study', '')}:g{body.get('generation', '')}:{event}"}
        if self.secret is not None:
            headers["X-Optimizer-Signature-256"] = signature(self.secret, data)
        self._keep(event, body)
        self._thread = threading.Thread(target=self._run, args=((event, me), data, headers),
                                        name="optimizer-webhook", daemon=True)
        self._thread.start()

    def _update(self, me: tuple[str, int], **fields) -> bool:
        """Record a send's progress; False once a newer send of its event superseded it."""
        event, n = me
        with self._lock:
            if self._newest.get(event) != n:
                return False
            if n == self._latest:
                self._status.update(fields)
            return True

    def _report(self, me) -> None:
        n = me[1] if isinstance(me, tuple) else me
        with self._lock:
            snapshot = dict(self._status) if n == self._latest else None
        if snapshot is not None:
            self.report(snapshot)

    def _run(self, me: tuple[str, int], data: bytes, headers: dict) -> None:
        delay = 1.0
        for attempt in range(1, self.attempts + 1):
            if not self._update(me, attempts=attempt):
                return
            try:
                req = urllib.request.Request(self.url, data=data, method="POST", headers=headers)
                with urlopen(req, WEBHOOK_TIMEOUT_S, redirects=False) as resp:
                    code = resp.status
                if self._update(me, state="sent", last_error=None, code=code, sent_at=time.time()):
                    self._delivered(me[0])
                    self._report(me)
                return
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}" + (", a redirect: not followed; give the final URL" if 300 <= exc.code < 400 else "")
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                why = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
            what = "the recommendation" if me[0] == "published" else f"the {me[0]} event"
            self._update(me, last_error=f"{self.shown} refused {what} ({why}); check the URL and "
                                        "that the receiver accepts a JSON POST")
            if attempt < self.attempts:
                self._report(me)
                time.sleep(delay)
                delay *= 2
        if self._update(me, state="failed"):
            self._report(me)

    def _keep(self, event: str, body: dict) -> None:
        """The event's body in the outbox (replacing an older one of the same event) until delivered."""
        if self.outbox is not None:
            try:
                write_atomic(self.outbox / f"{event}.json", json.dumps(body, default=str))
            except OSError:  # a full disk: delivered now or lost with this process, as before
                pass

    def _delivered(self, event: str) -> None:
        if self.outbox is not None:
            (self.outbox / f"{event}.json").unlink(missing_ok=True)

    def pending(self) -> list[dict]:
        """Bodies a previous run sent (or was sending) but never saw delivered, oldest first."""
        if self.outbox is None or not self.outbox.is_dir():
            return []
        out = []
        for path in sorted(self.outbox.glob("*.json"), key=lambda p: p.stat().st_mtime):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # half a body: nothing to deliver
        return out

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
