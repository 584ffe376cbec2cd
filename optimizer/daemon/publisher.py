"""The daemon's publisher: after each generation, the gate's decision (daemon/publish.py), and
when it clears: the `vllm serve --config` file, `/recommendation` and its metric, the webhook.
Each decision is recorded on the generation's study (`publish`); a restarted daemon serves the
latest published one again.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from optimizer.config.daemon_spec import PublishSpec
from optimizer.config.schema import StudyConfig
from optimizer.daemon import publish
from optimizer.record import of_generation
from optimizer.errors import ConfigError
from optimizer.verdict.trials import finished_count


class Publisher:
    def __init__(self, spec: PublishSpec, state, console, outbox: Path | None = None):
        self.spec, self.state, self.console = spec, state, console
        self.webhook = (publish.Webhook(spec.webhook, spec.webhook_attempts, self._webhook_status, _secret(spec),
                                        outbox) if spec.webhook else None)
        self._shown: dict = {}
        self._lock = threading.Lock()  # the webhook's thread reports into `_shown` too

    def restore(self, studies: list[tuple[str, dict]], base: str) -> None:
        """`studies`: (name, user attributes) of the storage; the latest published generation of `base`."""
        ours = re.compile(rf"^{re.escape(base)}(-g\d+)?$")
        decisions = [(name, of_generation.publish_decision(a)) for name, a in studies]
        found = [d for name, d in decisions if isinstance(d, dict) and d.get("published") and ours.match(name)]
        if found:
            latest = max(found, key=lambda r: r.get("generation") or 0)
            self._show({"decision": _decision(latest)})
            self.state.set(recommendation=latest.get("recommendation"))

    def resend(self) -> int:
        """Deliver what a previous run of the daemon left undelivered (a stop in flight, attempts
        spent), with the same idempotency key; how many."""
        pending = self.webhook.pending() if self.webhook is not None else []
        for body in pending:
            self.console.print(f"webhook: sending again the {body.get('event', 'published')} event of generation "
                               f"{body.get('generation')} a previous run did not see delivered")
            self.webhook.send(body)
        return len(pending)

    def _show(self, shown: dict) -> None:
        with self._lock:
            self._shown = shown
            self.state.set(publish=shown)

    def _webhook_status(self, status: dict) -> None:
        with self._lock:
            self._shown = {**self._shown, "webhook": status}
            self.state.set(publish=self._shown)

    def publish(self, study, cfg: StudyConfig, model: str, generation: int) -> dict:
        """Decide, publish when the gate says so, record; returns the record. A generation already
        decided (a restarted daemon resuming a finished study) is not published again: a webhook
        may restart a fleet. One that measured more trials since (its n_trials was raised) is
        decided again."""
        done, trials = of_generation.publish_decision(study), finished_count(study)
        if isinstance(done, dict) and done.get("generation") == generation and done.get("trials", trials) >= trials:
            self._show({"decision": _decision(done)})
            return done
        decision = publish.decide(study, cfg)
        record = {**decision.as_dict(), "decided_at": time.time(), "generation": generation,
                  "study": study.study_name, "trials": trials}
        body = publish.payload(study, cfg, model, generation) if decision.publish else None
        if body is not None:
            body.update(event="published", decision=decision.as_dict(), published_at=record["decided_at"])
            self._write(body, record)
            record["recommendation"] = body
            self.state.set(recommendation=body)
            self.console.print(f"[green]published[/] generation {generation}'s recommendation ({decision.reason}): "
                               f"{' '.join(body['flags'])}" + (f"; written to {record['path']}" if record.get("path") else ""))
        else:
            self.console.print(f"[yellow]not published[/] ({decision.code}): generation {generation}'s "
                               f"recommendation: {decision.reason}")
            body = {"event": "not_published", "study": study.study_name, "generation": generation,
                    "decision": decision.as_dict(), "decided_at": record["decided_at"]}
        if self.webhook is not None:
            self.webhook.send(body)
        of_generation.write_publish_decision(study, record)
        with self._lock:
            hook = dict(self.webhook.status) if self.webhook is not None else None
        self._show({"decision": _decision(record), **({"webhook": hook} if hook else {})})
        return record

    def event(self, body: dict) -> None:
        """Any other event for the webhook (e.g. `saturated`), when one is configured."""
        if self.webhook is not None:
            self.webhook.send(body)

    def _write(self, body: dict, record: dict) -> None:
        if not self.spec.path:
            return
        try:
            record["path"] = str(publish.write_config(self.spec.path, body["config"]))
        except OSError as exc:
            record["path_error"] = f"{self.spec.path}: {exc.strerror or exc}; check the directory and free space"
            self.console.print(f"[red]recommendation file not written[/]: {record['path_error']}")


def _decision(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "recommendation"}


def _secret(spec: PublishSpec) -> bytes | None:
    """The webhook's signing secret, read once at start (ConfigError, exit 2, when it cannot be)."""
    if spec.webhook_secret_file is None:
        return None
    path = Path(spec.webhook_secret_file).expanduser()
    try:
        secret = path.read_bytes()[:4096].strip()
    except OSError as exc:
        raise ConfigError(f"daemon.publish.webhook_secret_file: {path} cannot be read ({exc.strerror or exc}); "
                          "write a secret there, e.g. openssl rand -hex 32 > FILE; chmod 600 FILE") from exc
    if not secret:
        raise ConfigError(f"daemon.publish.webhook_secret_file: {path} is empty; write a secret there, "
                          "e.g. openssl rand -hex 32 > FILE; chmod 600 FILE")
    return secret
